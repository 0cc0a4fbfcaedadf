package limiter

import (
	"errors"
	"fmt"
	"time"
)

// Errors for bad requests. They are returned wrapped with the offending value.
var (
	// ErrNegativeCost is returned for a cost below zero.
	ErrNegativeCost = errors.New("cost must not be negative")
	// ErrTimeRange is returned for an instant before the Unix epoch or at
	// or after 2^53 µs after it (year 2255), which the Lua scripts' doubles
	// cannot hold exactly.
	ErrTimeRange = errors.New("time out of range")
)

// CheckInput reports a cost or an instant (µs since the epoch) that no
// algorithm accepts, wrapping ErrNegativeCost or ErrTimeRange. The Redis
// store calls it before running a script, so that bad input gets the same
// error from every store.
func CheckInput(nowUs, cost int64) error {
	return checkTake(nowUs, cost)
}

// checkTake validates the per-call inputs shared by every algorithm.
func checkTake(nowUs, n int64) error {
	if n < 0 {
		return fmt.Errorf("cost %d: %w", n, ErrNegativeCost)
	}
	if nowUs < 0 || nowUs >= maxNowMicros {
		return fmt.Errorf("now %v: %w", time.UnixMicro(nowUs).UTC(), ErrTimeRange)
	}
	return nil
}

// Micros converts t to the integer microseconds since the Unix epoch that
// every algorithm takes, rounding down.
func Micros(t time.Time) int64 {
	return t.UnixMicro()
}

// Take decides a request of cost n at nowUs (µs since the epoch) against
// the fixed-size state s of p's algorithm, following ALGORITHMS.md. The
// state was written under the Params sp; sp may be nil when s is absent or
// when it was written under p. A cost of 0 is a peek: it is decided as a
// cost of 1 would be (allowed exactly when at least one unit is left, and
// a deny reports the wait a cost of 1 would get), and it spends nothing.
// Take updates s and reports write = true only when the request is
// admitted with a non-zero cost; a deny or a peek leaves s untouched,
// except on a shared limit's new key, whose first sight is written (it
// starts empty; see Share). For SlidingLog use TakeLog; a shared limit of
// any algorithm uses Take.
//
// Take does no I/O and does not retain s or sp. Callers serialise access to
// one State.
func (p *Params) Take(s *State, sp *Params, nowUs, n int64) (d Decision, write bool, err error) {
	if err := checkTake(nowUs, n); err != nil {
		return Decision{}, false, err
	}
	st := *s
	if p.Limit.Shared() {
		return p.TakeShare(s, sp, p.Limit.Share, nowUs, n)
	}
	if st.Set && sp != nil && (sp.Limit.Algorithm != p.Limit.Algorithm || sp.Limit.Shared()) {
		// State of another algorithm means nothing here: start afresh.
		st = State{}
	}
	switch p.Limit.Algorithm {
	case TokenBucket:
		d, write = p.tokenBucket(&st, sp, nowUs, n)
	case GCRA:
		d, write = p.gcra(&st, sp, nowUs, n)
	case FixedWindow:
		d, write = p.fixedWindow(&st, nowUs, n)
	case SlidingWindow:
		d, write = p.slidingWindow(&st, nowUs, n)
	default:
		return Decision{}, false, fmt.Errorf("take with %v: the algorithm has no fixed-size state, use TakeLog", p.Limit.Algorithm)
	}
	if write {
		st.Set = true
		*s = st
	}
	return d, write, nil
}

// EmptyFor returns how long the key that d, an allowed decision under p,
// left with nothing remaining cannot admit even a request of cost 1: the
// wait until it next admits anything, from the instant of d. It returns 0
// when d left room, was a deny, or cannot tell: the window algorithms
// other than FixedWindow keep state that d does not describe.
//
// The wait is never short, so a caller that holds the key locally for it
// never asks too early. For FixedWindow it is exact: the end of the
// window. For TokenBucket and GCRA it is late by at most one tick
// (TickMicros): ResetAfter is when the bucket is full again; less the
// ticks that refill all but one token, rounded up, it is at most one tick
// before the first token, and one tick more puts it at or just after that
// instant (ResetAfter as ALGORITHMS.md computes it).
func (p *Params) EmptyFor(d Decision) time.Duration {
	if !d.Allowed || d.Remaining > 0 || d.ResetAfter <= 0 {
		return 0
	}
	switch p.Limit.Algorithm {
	case TokenBucket, GCRA:
		// Whole ticks that refill CapacityUnits less one token, less
		// the one tick added back.
		slackTicks := ceilDiv(p.CapacityUnits-p.TokenUnits, p.TickUnits) - 1
		return max(0, d.ResetAfter-micros(slackTicks*p.TickMicros))
	case FixedWindow:
		return d.ResetAfter
	}
	return 0
}

// sameScale reports whether a state written under sp reads the same under p.
func (p *Params) sameScale(sp *Params) bool {
	return sp == nil || sp == p ||
		(sp.TickMicros == p.TickMicros && sp.TickUnits == p.TickUnits &&
			sp.TokenUnits == p.TokenUnits && sp.Capacity == p.Capacity)
}

func (p *Params) decision(allowed bool, remaining, resetUs, retryUs int64) Decision {
	return Decision{
		Allowed:    allowed,
		Limit:      p.Capacity,
		Remaining:  remaining,
		ResetAfter: micros(resetUs),
		RetryAfter: micros(retryUs),
	}
}

func (p *Params) tokenBucket(s *State, sp *Params, now, n int64) (Decision, bool) {
	q, u, k, c := p.TickMicros, p.TickUnits, p.TokenUnits, p.Capacity
	l, last := p.tokenBucketLevel(s, sp, now)
	n1 := max(n, 1) // a peek decides as a cost of 1
	var allowed, write bool
	var retry int64
	switch {
	case n > c:
		retry = p.PeriodMicros
	case n1*k <= l:
		allowed = true
		if n > 0 {
			l -= n * k
			write = true
		}
	default:
		w := ceilDivBy(n1*k-l, u)
		retry = (last+w)*q - now
	}
	s.setTokenBucket(l, last)
	return p.decision(allowed, l/k, p.tokenBucketReset(l, last, now), retry), write
}

// tokenBucketLevel returns a TokenBucket's level and last tick at now:
// absent is full, a state written under another scale is converted
// (ALGORITHMS.md section 3.1), and the refill up to now is added.
func (p *Params) tokenBucketLevel(s *State, sp *Params, now int64) (l, last int64) {
	q, u, k, c, cu := p.TickMicros, p.TickUnits, p.TokenUnits, p.Capacity, p.CapacityUnits
	t := div(now, q)
	l, last = s.Level(), s.LastTick()
	switch {
	case !s.Set:
		l, last = cu, t
	case !p.sameScale(sp):
		spent := min(sp.Capacity-l/sp.TokenUnits, c)
		l = cu - spent*k
		last = ceilDiv(last*sp.TickMicros, q)
	}
	if t > last {
		e := min(t-last, p.FullTicks)
		l = min(l+e*u, cu)
		last = t
	}
	return l, last
}

// tokenBucketReset is how long a bucket at level l, last refilled at tick
// last, takes from now to be full.
func (p *Params) tokenBucketReset(l, last, now int64) int64 {
	if l == p.CapacityUnits {
		return 0
	}
	return (last+ceilDivBy(p.CapacityUnits-l, p.TickUnits))*p.TickMicros - now
}

func (p *Params) gcra(s *State, sp *Params, now, n int64) (Decision, bool) {
	q, u, k, c, cu := p.TickMicros, p.TickUnits, p.TokenUnits, p.Capacity, p.CapacityUnits
	a, f, b, debt := p.gcraDebt(s, sp, now)
	n1 := max(n, 1) // a peek decides as a cost of 1
	md := p.MaxDelayMicros
	var allowed, write bool
	var retry, wait int64
	switch {
	case md == 0 && n > c, md > 0 && n > p.MaxReserve:
		retry = p.PeriodMicros
	case debt+n1*k <= cu:
		allowed = true
		if n > 0 {
			debt += n * k
			a, f = b+div(debt, u), mod(debt, u)
			write = true
		}
	default:
		w := ceilDivBy(debt+n1*k-cu, u)
		retry = (b+w)*q - now
		if md > 0 && retry <= md {
			// Its slot comes within MaxDelay: reserved now, the request
			// waits for it. A peek reserves nothing and does not wait.
			allowed = true
			if n > 0 {
				wait = retry
				debt += n * k
				a, f = b+div(debt, u), mod(debt, u)
				write = true
			}
			retry = 0
		} else if md > 0 {
			// Admitted, with a wait within MaxDelay, from then on.
			retry -= md
		}
	}
	s.setGCRA(a, f)
	d := p.decision(allowed, max(0, cu-debt)/k, p.gcraReset(b, debt, now), retry)
	d.Wait = micros(wait)
	return d, write
}

// gcraDebt returns a GCRA key's theoretical arrival time (a whole ticks
// and f units) and its debt in units measured from tick b: absent is no
// debt, a state written under another scale is converted (ALGORITHMS.md
// section 4), and b is clamped so that the debt is at most a full bucket
// plus a tick.
func (p *Params) gcraDebt(s *State, sp *Params, now int64) (a, f, b, debt int64) {
	q, u, k, c := p.TickMicros, p.TickUnits, p.TokenUnits, p.Capacity
	t := div(now, q)
	a, f = s.TAT(), s.TATFraction()
	switch {
	case !s.Set:
		a, f = t, 0
	case !p.sameScale(sp):
		to := now / sp.TickMicros
		bo := max(to, a-ceilDiv(sp.TokenUnits*sp.Capacity, sp.TickUnits))
		var do int64
		if a >= bo {
			do = (a-bo)*sp.TickUnits + f
		}
		spent := min(ceilDiv(do, sp.TokenUnits), c)
		d := spent * k
		bn := ceilDiv(bo*sp.TickMicros, q)
		a, f = bn+d/u, d%u
	}
	b = max(t, a-p.FullTicks)
	if a >= b {
		debt = (a-b)*u + f
	}
	return a, f, b, debt
}

// gcraReset is how long a debt measured from tick b takes from now to be
// paid off.
func (p *Params) gcraReset(b, debt, now int64) int64 {
	if debt == 0 {
		return 0
	}
	return (b+ceilDivBy(debt, p.TickUnits))*p.TickMicros - now
}

func (p *Params) fixedWindow(s *State, now, n int64) (Decision, bool) {
	per, c := p.PeriodMicros, p.Capacity
	w, cnt := p.fixedWindowCount(s, now)
	n1 := max(n, 1) // a peek decides as a cost of 1
	var allowed, write bool
	var retry int64
	switch {
	case n > c:
		retry = per
	case cnt+n1 <= c:
		allowed = true
		if n > 0 {
			cnt += n
			write = true
		}
	default:
		retry = w + per - now
	}
	var reset int64
	if cnt != 0 {
		reset = w + per - now
	}
	s.setWindow(w, cnt, 0)
	return p.decision(allowed, max(0, c-cnt), reset, retry), write
}

// fixedWindowCount returns a FixedWindow key's window start and count at
// now: a new window starts at zero, and a clock that went back keeps the
// stored window.
func (p *Params) fixedWindowCount(s *State, now int64) (w, cnt int64) {
	ws := now - now%p.PeriodMicros
	w, cnt = s.WindowStart(), s.Count()
	if !s.Set || ws > w {
		w, cnt = ws, 0
	}
	return w, cnt
}

func (p *Params) slidingWindow(s *State, now, n int64) (Decision, bool) {
	per, c, q, pw := p.PeriodMicros, p.Capacity, p.TickMicros, p.WindowTicks
	w, cur, prev := p.slidingWindowCounts(s, now)
	var e int64
	if now > w {
		e = div(now-w, q)
	}
	x := prev*(pw-e) + cur*pw
	n1 := max(n, 1) // a peek decides as a cost of 1
	var allowed, write bool
	var retry int64
	switch {
	case n > c:
		retry = per
	case x+n1*pw <= c*pw:
		allowed = true
		if n > 0 {
			cur += n
			x += n * pw
			write = true
		}
	default:
		retry = p.slidingWindowRetry(w, cur, prev, now, n1)
	}
	s.setWindow(w, cur, prev)
	return p.decision(allowed, max(0, c*pw-x)/pw, slidingWindowReset(w, cur, prev, per, now), retry), write
}

// slidingWindowCounts returns a SlidingWindow key's window start and its
// current and previous counts at now, rolled forward to now's window.
func (p *Params) slidingWindowCounts(s *State, now int64) (w, cur, prev int64) {
	per := p.PeriodMicros
	ws := now - now%per
	w, cur, prev = s.WindowStart(), s.Count(), s.PrevCount()
	if !s.Set {
		w, cur, prev = ws, 0, 0
	} else if d := ws - w; d >= 2*per {
		w, cur, prev = ws, 0, 0
	} else if d > 0 {
		w, cur, prev = ws, 0, cur
	}
	return w, cur, prev
}

// slidingWindowRetry is how long until a request of cost n, which the
// counts deny at now, would be admitted.
func (p *Params) slidingWindowRetry(w, cur, prev, now, n int64) int64 {
	per, c, q, pw := p.PeriodMicros, p.Capacity, p.TickMicros, p.WindowTicks
	e2 := pw
	if a := c - cur - n; a >= 0 {
		e2 = pw - a*pw/prev
	}
	if e2 <= pw-1 {
		return w + e2*q - now
	} else if b := c - n; cur <= b {
		return w + per - now
	} else if e3 := pw - b*pw/cur; e3 <= pw-1 {
		return w + per + e3*q - now
	}
	return w + 2*per - now
}

// slidingWindowReset is how long until the counts weigh nothing.
func slidingWindowReset(w, cur, prev, per, now int64) int64 {
	switch {
	case cur > 0:
		return w + 2*per - now
	case prev > 0:
		return w + per - now
	}
	return 0
}

// div, mod and ceilDivBy skip the hardware division for the common divisor
// 1 (a clock tick of 1µs, a rate of one unit per tick), which keeps a
// decision cheap. a >= 0, b > 0.
func div(a, b int64) int64 {
	if b == 1 {
		return a
	}
	return a / b
}

func mod(a, b int64) int64 {
	if b == 1 {
		return 0
	}
	return a % b
}

func ceilDivBy(a, b int64) int64 {
	if b == 1 {
		return a
	}
	return (a + b - 1) / b
}
