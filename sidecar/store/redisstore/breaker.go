package redisstore

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is the state of a shard's circuit breaker.
type BreakerState int32

// Breaker states.
const (
	// BreakerClosed passes every call.
	BreakerClosed BreakerState = iota
	// BreakerOpen fails every call at once, until the cooldown ends.
	BreakerOpen
	// BreakerHalfOpen has let one probe through and fails the other calls
	// until the probe's outcome is known.
	BreakerHalfOpen
)

// String returns the state's name.
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "unknown"
}

// breaker is a per-shard circuit breaker: threshold consecutive failed
// calls open it; while open it fails fast; after a cooldown one probe goes
// through (half-open), and the probe's success closes it while its failure
// opens it again for another cooldown.
//
// A call that got no answer by its deadline (a timeout) is different: one
// is enough. A node that let one call wait out its deadline (stopped,
// stalled, swapping) makes the calls sent after it wait theirs too, each a
// whole call budget, so the breaker opens at once with no cooldown: the
// next call is the probe, and every other call fails fast until the
// probe's outcome is known. The probe answered closes it again (a single
// slow answer costs the shard's keys one round trip of fail-fast); the
// probe timed out too opens it for a cooldown. So a stalled shard costs
// each caller at most one call budget, and the fleet one call per sidecar
// per cooldown, instead of threshold budgets in a row.
//
// Each cooldown is jittered: it lasts a uniformly random time between half
// and one and a half times the configured one (the mean). The breakers of
// a fleet of sidecars open together when a shard goes down; with a fixed
// cooldown they would probe it together, every cooldown, and when it comes
// back every sidecar would reconnect, reload its slot map and resume in
// the same millisecond. Jittered, their probes spread over a cooldown.
//
// The closed, healthy path is one atomic load per call and one per
// outcome; the mutex is taken only while failures are being counted or the
// breaker is not closed.
type breaker struct {
	threshold int
	cooldown  time.Duration
	now       func() time.Time
	onChange  func(BreakerState)
	// jitter returns the length of one cooldown.
	jitter func(time.Duration) time.Duration

	state    atomic.Int32 // BreakerState
	failing  atomic.Bool  // failures > 0
	mu       sync.Mutex
	failures int
	probeAt  time.Time // while open: when the next probe may go
}

func newBreaker(threshold int, cooldown time.Duration, now func() time.Time, onChange func(BreakerState)) *breaker {
	return &breaker{threshold: threshold, cooldown: cooldown, now: now, onChange: onChange, jitter: jitterCooldown}
}

// jitterCooldown returns a uniformly random duration in [d/2, 3d/2).
func jitterCooldown(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d)
}

// State returns the breaker's current state.
func (b *breaker) State() BreakerState { return BreakerState(b.state.Load()) }

// allow reports whether a call may go out, and whether it is the half-open
// probe. A probe's caller must report its outcome with success, failure or
// release.
func (b *breaker) allow() (ok, probe bool) {
	if BreakerState(b.state.Load()) == BreakerClosed {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch BreakerState(b.state.Load()) {
	case BreakerClosed:
		return true, false
	case BreakerOpen:
		if b.now().Before(b.probeAt) {
			return false, false
		}
		b.setLocked(BreakerHalfOpen)
		return true, true
	default: // half-open: the probe is out
		return false, false
	}
}

// success records a call that reached the shard and got an answer.
func (b *breaker) success(probe bool) {
	if !probe && !b.failing.Load() && BreakerState(b.state.Load()) == BreakerClosed {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch st := BreakerState(b.state.Load()); {
	case st == BreakerClosed:
		b.failures = 0
		b.failing.Store(false)
	case probe && st == BreakerHalfOpen:
		b.failures = 0
		b.failing.Store(false)
		b.setLocked(BreakerClosed)
	}
	// A late success of a call sent before the breaker opened does not
	// close it: only the probe does.
}

// failure records n calls that could not get an answer from the shard.
func (b *breaker) failure(probe bool, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch st := BreakerState(b.state.Load()); {
	case st == BreakerClosed:
		b.failures += n
		b.failing.Store(true)
		if b.failures >= b.threshold {
			b.openLocked()
		}
	case probe && st == BreakerHalfOpen:
		b.openLocked()
	}
}

// timedOut records a call that got no answer by its deadline. Closed, the
// breaker opens with the next call as the probe (no cooldown); the probe
// timed out opens it for a cooldown. A timeout of a call sent before the
// breaker opened changes nothing once it is open.
func (b *breaker) timedOut(probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch st := BreakerState(b.state.Load()); {
	case st == BreakerClosed:
		b.failures = 0
		b.failing.Store(false)
		b.probeAt = b.now()
		b.setLocked(BreakerOpen)
	case probe && st == BreakerHalfOpen:
		b.openLocked()
	}
}

// release gives back a probe that never reached the shard (its caller gave
// up first): the breaker is open again, and the next call may probe at once.
func (b *breaker) release(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if BreakerState(b.state.Load()) == BreakerHalfOpen {
		b.probeAt = b.now()
		b.setLocked(BreakerOpen)
	}
}

// openLocked opens the breaker for one jittered cooldown; b.mu is held.
func (b *breaker) openLocked() {
	b.probeAt = b.now().Add(b.jitter(b.cooldown))
	b.setLocked(BreakerOpen)
}

func (b *breaker) setLocked(s BreakerState) {
	if BreakerState(b.state.Swap(int32(s))) != s && b.onChange != nil {
		b.onChange(s)
	}
}
