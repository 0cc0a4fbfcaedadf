package client

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Pacer spaces one caller's requests so that all the callers sharing a
// limit together spend it at about its rate, without any of them knowing
// how many the others are. It learns from the rate-limit fields of every
// answer (see Fields):
//
//   - Between two answers that say how much of the limit remains, it
//     measures what everybody spent: what remained before, plus what the
//     limit refilled at Quota/Window over the interval (capped at the
//     capacity), minus what remains now. That total rate, set against the
//     limit's rate, scales the caller's own rate: a caller whose share of
//     the spending is too large slows down in proportion, whatever the
//     number of callers, and all of them together converge on the limit.
//   - The target is not the rate itself but the rate scaled by how full
//     the limit is: half the rate when nothing remains, the rate at half
//     full, more when it is fuller. The callers so keep the limit about
//     half full, and a burst of one of them finds room instead of a 429.
//   - A 429 holds every request of the caller until its Retry-After, and at
//     least doubles the spacing.
//
// The estimate assumes a limit that refills continuously (TokenBucket and
// GCRA, floodgate's default, and the sliding windows approximately); a
// fixed window is paced correctly on average but may still see denials
// at its boundaries.
//
// A Pacer is safe for concurrent use. Its methods take the time as a
// parameter; the Transport passes time.Now.
type Pacer struct {
	// MaxJitter caps the random extra a hold adds to a Retry-After, which
	// is otherwise up to twice the Retry-After; 0 means
	// DefaultMaxJitter. Set it before first use.
	MaxJitter time.Duration
	// Rand returns a uniform random number in [0, 1); nil uses
	// math/rand/v2. Set it before first use.
	Rand func() float64

	mu       sync.Mutex
	name     string
	rate     float64       // units per second; 0 while unknown
	capacity int64         // the most the limit holds
	interval time.Duration // the caller's spacing; 0: unpaced
	next     time.Time     // earliest next send
	slot     time.Time     // the last slot given
	hold     time.Time     // no send before this, after a deny
	// The last observation: when, what remained, and how many of the
	// caller's own requests were admitted since.
	lastAt time.Time
	lastR  int64
	own    int64
}

// Pacer tuning.
const (
	// emptyTarget is the share of the limit's rate the callers aim at
	// when the limit is empty; the aim grows with the fill, reaching the
	// rate at half full.
	emptyTarget = 0.5
	// maxTarget caps the aim, when the limit is full.
	maxTarget = 1.5
	// holdSpacing scales a hold into the spacing that follows it: the
	// callers one wave of denials sent away come back spread over a hold
	// and a half, not all within one.
	holdSpacing = 1.5
	// paceGain is the exponent applied to a correction that speeds up:
	// below 1, so that callers who measure at about the same time do not
	// all overshoot together.
	paceGain = 0.7

	// minObservationRefill is the least refill, in units, that an
	// observation window spans before it is used: shorter windows are
	// dominated by rounding.
	minObservationRefill = 4
	// maxInterval bounds the spacing.
	maxInterval = 24 * time.Hour
)

// Reserve claims the caller's next send slot at or after now and returns
// how long to wait for it (0: send now).
func (p *Pacer) Reserve(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	slot := p.earliest(now)
	// Each spacing is drawn within a quarter of the interval, so that
	// callers whose slots a wave of denials lined up drift apart instead
	// of staying in step.
	p.next = slot.Add(time.Duration((0.75 + 0.5*p.random()) * float64(p.interval)))
	p.slot = slot
	return slot.Sub(now)
}

// Wait returns how long a request would wait for a slot if it asked at now,
// without claiming one.
func (p *Pacer) Wait(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.earliest(now).Sub(now)
}

// earliest is the first instant at or after now that is neither held nor
// before the next slot. p.mu is held.
func (p *Pacer) earliest(now time.Time) time.Time {
	slot := now
	if slot.Before(p.hold) {
		slot = p.hold
	}
	if slot.Before(p.next) {
		slot = p.next
	}
	return slot
}

// Interval returns the spacing the pacer currently keeps between the
// caller's requests.
func (p *Pacer) Interval() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.interval
}

// Observe feeds the pacer one answer, received at now, with its status code
// and rate-limit fields.
func (p *Pacer) Observe(now time.Time, status int, f Fields) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f.Name != p.name && (f.Known() || f.Name != "") {
		// Another limit binds now: what was learnt is about a different
		// counter.
		p.name, p.lastAt, p.own = f.Name, time.Time{}, 0
	}
	if f.Quota > 0 && f.Window > 0 {
		p.rate = float64(f.Quota) / f.Window.Seconds()
	}
	if c := max(f.Capacity, f.Quota); c > 0 {
		p.capacity = c
	}
	switch {
	case status == statusTooManyRequests:
		p.denied(now, f)
		return
	case status == statusServiceUnavailable && f.HasRetryAfter:
		// The service asks for a pause that says nothing of the limit.
		if h := now.Add(f.RetryAfter + p.jitter(f.RetryAfter)); h.After(p.hold) {
			p.hold = h
		}
		return
	}
	if !f.Known() || p.rate <= 0 || p.capacity <= 0 {
		return
	}
	p.own++
	if p.lastAt.IsZero() {
		p.lastAt, p.lastR, p.own = now, f.Remaining, 0
		return
	}
	dt := now.Sub(p.lastAt).Seconds()
	if dt <= 0 || (dt*p.rate < minObservationRefill && f.Remaining > 0) {
		// Too short to measure; the window grows until the next answer.
		// An answer that finds the limit empty is always used.
		return
	}
	expected := float64(p.lastR) + p.rate*dt
	if f.Remaining >= p.capacity-1 {
		// Full now: what overflowed is unknown, so count none of it.
		expected = math.Min(expected, float64(p.capacity))
	}
	spent := math.Max(expected-float64(f.Remaining), float64(p.own))
	total := spent / dt
	ownRate := float64(p.own) / dt
	fill := float64(f.Remaining) / float64(p.capacity)
	target := p.rate * math.Min(math.Max(emptyTarget+fill, emptyTarget), maxTarget)
	// Slowing down takes the whole correction at once: callers that spend
	// too much all cut to their share of the target. Speeding up takes
	// part of it, so that callers measuring at about the same time do not
	// overshoot together.
	next := ownRate * target / total
	if target > total {
		next = ownRate * math.Pow(target/total, paceGain)
	}
	p.interval = clampInterval(next)
	// The next slot follows the last one at the new spacing: sooner when
	// faster, later when slower.
	p.next = p.slot.Add(p.interval)
	p.lastAt, p.lastR, p.own = now, f.Remaining, 0
}

// denied handles a 429: hold every request until the Retry-After plus a
// random extra of up to twice as much (capped at MaxJitter), or without
// one until the limit has refilled one unit, and space the caller's
// requests by at least that hold from now on. The limit is known to be
// empty now, and the estimate starts afresh once requests flow again.
func (p *Pacer) denied(now time.Time, f Fields) {
	unit := time.Duration(0)
	if p.rate > 0 {
		unit = time.Duration(float64(time.Second) / p.rate)
	}
	hold := unit
	if f.HasRetryAfter {
		hold = f.RetryAfter + p.jitter(f.RetryAfter)
	} else if hold == 0 {
		hold = time.Second
	}
	if h := now.Add(hold); h.After(p.hold) {
		p.hold = h
	}
	// The caller's own rate is now at most one request per hold: spacing
	// its requests by less would send it straight into the next denial,
	// together with every other caller the same wave sent away.
	p.interval = min(max(2*p.interval, unit, time.Duration(holdSpacing*float64(hold))), maxInterval)
	p.lastAt, p.own = time.Time{}, 0
}

// jitter returns the random extra added to a wait of d: uniform in
// [0, min(2d, p.MaxJitter)).
func (p *Pacer) jitter(d time.Duration) time.Duration {
	maxJitter := p.MaxJitter
	if maxJitter <= 0 {
		maxJitter = DefaultMaxJitter
	}
	return time.Duration(p.random() * float64(min(2*d, maxJitter)))
}

func (p *Pacer) random() float64 {
	if p.Rand == nil {
		return rand.Float64()
	}
	return p.Rand()
}

// clampInterval turns a rate into a spacing within bounds.
func clampInterval(rate float64) time.Duration {
	if rate <= 0 || math.IsNaN(rate) {
		return maxInterval
	}
	d := float64(time.Second) / rate
	if math.IsInf(d, 0) || d > float64(maxInterval) {
		return maxInterval
	}
	return time.Duration(d)
}

const (
	statusTooManyRequests    = 429
	statusServiceUnavailable = 503
)
