package limiter

import (
	"fmt"
	"math/bits"
	"time"
)

// Exactness bounds of the integer arithmetic (ALGORITHMS.md, section 7).
const (
	// maxCapacityUnits bounds CapacityUnits so that sums of levels, debts
	// and refills stay below 2^52.
	maxCapacityUnits = 1 << 50
	// maxWindowTicks bounds WindowTicks so that SlidingWindow products of a
	// count (< 2^30) and ticks stay below 2^51.
	maxWindowTicks = 1 << 21
	// maxTickMicros is the coarsest clock resolution a Limit may get.
	maxTickMicros = 1_000_000_000
	// maxNowMicros is the first instant, in µs since the epoch, that a Lua
	// double can no longer hold exactly together with the sums above it.
	maxNowMicros = 1 << 53
)

// Params are a validated Limit's integer constants, as ALGORITHMS.md
// defines them. The Redis store passes them to the Lua scripts as ARGV, so
// the scripts never derive them. Params are immutable once built and safe
// for concurrent use.
type Params struct {
	// Limit is the limit the parameters were derived from.
	Limit Limit
	// Capacity (C) is the most cost one key can spend at once, reported as
	// Decision.Limit: Limit.Capacity() for TokenBucket and GCRA, Requests
	// for the window algorithms.
	Capacity int64
	// PeriodMicros (P) is Limit.Period in microseconds.
	PeriodMicros int64
	// TickMicros (q) is the clock resolution in microseconds, a power of
	// ten. TokenBucket, GCRA and SlidingWindow measure time in ticks of
	// floor(now/q).
	TickMicros int64
	// TickUnits (U) is how many units a TokenBucket or GCRA bucket refills
	// per tick.
	TickUnits int64
	// TokenUnits (K) is how many units one token (one unit of cost) is.
	TokenUnits int64
	// CapacityUnits (CU) is a full bucket in units: Capacity * TokenUnits.
	CapacityUnits int64
	// FullTicks (FT) is how many ticks an empty bucket takes to refill:
	// ceil(CapacityUnits / TickUnits).
	FullTicks int64
	// WindowTicks (PW) is the SlidingWindow window in ticks:
	// ceil(PeriodMicros / TickMicros).
	WindowTicks int64
	// MaxDelayMicros (MD) is Limit.MaxDelay in microseconds.
	MaxDelayMicros int64
	// MaxReserve (MR), under a MaxDelay, bounds the cost that can ever be
	// admitted: C + floor(ceil((MD + q) / q) * U / K) + 1. A larger cost is
	// denied as one above the capacity is without MaxDelay.
	MaxReserve int64
}

// Params validates l and returns its integer constants.
func (l Limit) Params() (*Params, error) {
	return NewParams(l)
}

// NewParams validates l and returns its integer constants.
func NewParams(l Limit) (*Params, error) {
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("invalid limit %v: %w", l, err)
	}
	p := &Params{Limit: l, PeriodMicros: l.Period.Microseconds()}
	switch l.Algorithm {
	case TokenBucket, GCRA:
		p.Capacity = l.Capacity()
		s, _ := bucketScale(l.Requests, p.PeriodMicros, p.Capacity)
		p.TickMicros, p.TickUnits, p.TokenUnits = s.q, s.u, s.k
		p.CapacityUnits = p.Capacity * p.TokenUnits
		p.FullTicks = ceilDiv(p.CapacityUnits, p.TickUnits)
		if l.MaxDelay > 0 {
			p.MaxDelayMicros = l.MaxDelay.Microseconds()
			p.MaxReserve = p.Capacity + ceilDiv(p.MaxDelayMicros+p.TickMicros, p.TickMicros)*p.TickUnits/p.TokenUnits + 1
		}
	case SlidingWindow:
		p.Capacity = l.Requests
		p.TickMicros, p.WindowTicks = windowScale(p.PeriodMicros)
	default:
		p.Capacity = l.Requests
	}
	return p, nil
}

// String formats the limit as a policy would write it.
func (l Limit) String() string {
	s := fmt.Sprintf("%v %d per %v", l.Algorithm, l.Requests, l.Period)
	if l.Burst > 0 {
		s += fmt.Sprintf(" burst %d", l.Burst)
	}
	if l.Shared() {
		s += fmt.Sprintf(" share %d of %d", l.Share.Index, l.Share.Of)
	}
	if l.MaxDelay > 0 {
		s += fmt.Sprintf(" delay up to %v", l.MaxDelay)
	}
	return s
}

type scale struct{ q, u, k int64 }

// bucketScale picks the finest tick q (a power of ten dividing the period)
// at which r tokens per p µs with capacity c are exact integers within
// maxCapacityUnits.
func bucketScale(r, pUs, c int64) (scale, bool) {
	for q := int64(1); q <= maxTickMicros; q *= 10 {
		if pUs%q != 0 {
			break
		}
		pq := pUs / q
		g := gcd(r, pq)
		k := pq / g
		if hi, lo := bits.Mul64(uint64(c), uint64(k)); hi == 0 && lo <= maxCapacityUnits {
			return scale{q: q, u: r / g, k: k}, true
		}
	}
	return scale{}, false
}

// windowScale picks the finest tick, a power of ten, that splits a window
// of p µs into at most maxWindowTicks ticks.
func windowScale(pUs int64) (q, pw int64) {
	for q = 1; ; q *= 10 {
		if pw = ceilDiv(pUs, q); pw <= maxWindowTicks || q >= maxTickMicros {
			return q, pw
		}
	}
}

// checkScale reports a TokenBucket or GCRA limit whose rate cannot be held
// exactly, or that takes longer than MaxFillTime to refill. l's fields are
// within their bounds.
func (l Limit) checkScale() error {
	if l.Algorithm != TokenBucket && l.Algorithm != GCRA {
		return nil
	}
	pUs, c := l.Period.Microseconds(), l.Capacity()
	// Fill time c*pUs/r > MaxFillTime  <=>  c*pUs > MaxFillTime*r.
	fillHi, fillLo := bits.Mul64(uint64(c), uint64(pUs))
	maxHi, maxLo := bits.Mul64(uint64(MaxFillTime.Microseconds()), uint64(l.Requests))
	if fillHi > maxHi || (fillHi == maxHi && fillLo > maxLo) {
		return fmt.Errorf("burst: a capacity of %d at %d per %v takes longer than %v to refill", c, l.Requests, l.Period, MaxFillTime)
	}
	s, ok := bucketScale(l.Requests, pUs, c)
	if !ok {
		return fmt.Errorf("burst: a capacity of %d at %d per %v cannot be computed exactly; use a period of whole seconds or a rounder number of requests", c, l.Requests, l.Period)
	}
	if l.MaxDelay > 0 {
		// The debt of a key with every slot up to MaxDelay reserved, and
		// the largest cost the bound MaxReserve lets through, in units,
		// stay exact doubles.
		ticks := ceilDiv(l.MaxDelay.Microseconds()+s.q, s.q) + 2
		if hi, lo := bits.Mul64(uint64(ticks), uint64(s.u)); hi != 0 || lo > maxCapacityUnits {
			return fmt.Errorf("maxDelay: %v at %d per %v cannot be computed exactly; use a shorter delay", l.MaxDelay, l.Requests, l.Period)
		}
	}
	return nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// ceilDiv returns ceil(a/b) for a >= 0, b > 0.
func ceilDiv(a, b int64) int64 {
	return (a + b - 1) / b
}

// micros converts a whole number of microseconds to a Duration.
func micros(us int64) time.Duration {
	return time.Duration(us) * time.Microsecond
}

// StateTTL is the expiry a store sets on a key's state after a write whose
// decision had the given ResetAfter: the time until the state is back to
// full (and so equivalent to no state at all), rounded up to whole
// milliseconds, plus TTLMargin.
func StateTTL(resetAfter time.Duration) time.Duration {
	if resetAfter < 0 {
		resetAfter = 0
	}
	ms := (resetAfter + time.Millisecond - 1) / time.Millisecond
	return ms*time.Millisecond + TTLMargin
}

// TTLMargin is added to every state TTL to absorb clock differences between
// the instant a decision was computed for and the store's expiry clock.
const TTLMargin = time.Second
