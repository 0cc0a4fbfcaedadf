package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// A lease is a batch of tokens that a sidecar takes from a key's shared
// counter in one store call and then spends locally, without a store call
// per request. Every token a sidecar admits against is taken from the
// shared counter first, so the fleet never admits more than the limit over
// the life of a key; what a lease can cost is under-admission, while tokens
// sit unused in one sidecar's lease. The sidecar gives back what it has not
// used when its lease expires, when the policy changes and when it shuts
// down (ALGORITHMS.md section 9).

// ErrNotLeasable is returned for a lease on an algorithm that cannot lease
// (SlidingLog; see Algorithm.Leasable).
var ErrNotLeasable = errors.New("the algorithm cannot lease")

// Leasable reports whether the algorithm can hand out leases.
//
// TokenBucket, GCRA, FixedWindow and SlidingWindow can: their state is a
// count (a level, a debt, a window's count), and a batch taken at one
// instant and spent later is a count taken early. A batch spent before its
// window ends is counted in the window it is spent in, so FixedWindow and
// SlidingWindow leases end with their window (Lease.ValidFor).
//
// SlidingLog cannot. Its state is the instant of every admitted unit, and
// each unit frees exactly one Period after its own instant. A batch taken
// at t0 and spent at t1 > t0 is logged at t0 and frees at t0 + Period,
// before t1 + Period: in between the key would admit more than its limit
// in a window. Logging the batch at its expiry instead frees it late, and
// puts entries in the future, where the log takes its newest entry as the
// clock. Only rewriting the log with every unit's real instant, one entry
// per unit at the end of each lease, keeps it exact, and that is the
// per-request store work a lease is meant to save.
func (a Algorithm) Leasable() bool {
	switch a {
	case TokenBucket, GCRA, FixedWindow, SlidingWindow:
		return true
	}
	return false
}

// LeaseArgs are what a lease call asks of one key, in whole tokens (units
// of cost).
type LeaseArgs struct {
	// Cost is what the request that asks spends; 0 when no request asks
	// (a return, or a lease taken ahead of need) or when it is a peek.
	// Allowed means Cost was taken; with Cost 0 it is decided as a cost
	// of 1, as Take decides a peek: at least one unit was left.
	Cost int64
	// Want is the most to take, Cost included. A Want below Cost counts as
	// Cost, and one above the capacity as the capacity.
	Want int64
	// Return is what an earlier lease on the key did not use, given back
	// before the take. Only tokens the caller took and did not spend may
	// be returned. More than the capacity counts as the capacity.
	Return int64
	// Window is, for FixedWindow and SlidingWindow, the Lease.Window of the
	// lease that Return comes from: tokens go back only to the window that
	// counted them (the current one, or for SlidingWindow the previous
	// one too). Other algorithms ignore it.
	Window int64
}

// LeaseRequest is one lease call on a store.
type LeaseRequest struct {
	// Key is the counter, as in Request.
	Key string
	// Limit is the limit in force, as in Request.
	Limit Limit
	LeaseArgs
	// Deadline, when set, is when the caller stops waiting, as in
	// Request: a lease taken for a request shares the request's one
	// budget from its arrival.
	Deadline time.Time
}

// Lease is the answer to a lease call.
type Lease struct {
	// Decision is the decision for LeaseArgs.Cost, reported as Take
	// reports it, with Remaining what the key has left after the grant.
	Decision
	// Granted is what was taken, Cost included: 0 on a deny, between Cost
	// and Want when allowed (less than Want when the key had less left).
	Granted int64
	// Window is, for FixedWindow and SlidingWindow, the start of the window
	// (µs since the epoch on the store's clock) the grant counts in; a
	// later return of unused tokens names it. 0 for the other algorithms.
	Window int64
	// ValidFor is, for FixedWindow and SlidingWindow, how long from the
	// store's instant until that window ends: tokens of the grant must be
	// spent before then. 0 (no bound from the algorithm) for the others.
	ValidFor time.Duration
}

// String formats l compactly, for logs and test failures.
func (l Lease) String() string {
	return fmt.Sprintf("{%v granted=%d window=%d validFor=%v}", l.Decision, l.Granted, l.Window, l.ValidFor)
}

// Leaser is a Store that can hand out leases. Implementations are safe for
// concurrent use.
type Leaser interface {
	// Lease applies req to its key atomically, following ALGORITHMS.md
	// section 8: the return first, then a take of between Cost and Want
	// tokens, or a deny that takes nothing. It reports the shard as Take
	// does. An error wrapping ErrUnavailable means the state could not be
	// reached; the call may then have run.
	Lease(ctx context.Context, req LeaseRequest) (l Lease, shard string, err error)
}

// CheckLease reports lease arguments that no algorithm accepts, as
// CheckInput does for a Take, and ErrNotLeasable for an algorithm that
// cannot lease.
func CheckLease(alg Algorithm, nowUs int64, a LeaseArgs) error {
	if err := checkTake(nowUs, a.Cost); err != nil {
		return err
	}
	if a.Want < 0 {
		return fmt.Errorf("want %d: %w", a.Want, ErrNegativeCost)
	}
	if a.Return < 0 {
		return fmt.Errorf("return %d: %w", a.Return, ErrNegativeCost)
	}
	if !alg.Leasable() {
		return fmt.Errorf("lease with %v: %w", alg, ErrNotLeasable)
	}
	return nil
}

// LeaseArgsFor returns a's Want and Return bounded as the stores apply
// them: Want between Cost and the capacity, Return at most the capacity
// (when Cost is above the capacity, Want is left at Cost: the request is
// denied and nothing is taken). The Redis store passes these to its
// scripts.
func (p *Params) LeaseArgsFor(a LeaseArgs) LeaseArgs {
	a.Want = max(a.Want, a.Cost)
	if a.Cost <= p.Capacity {
		a.Want = min(a.Want, p.Capacity)
	}
	a.Return = min(a.Return, p.Capacity)
	return a
}

// Lease applies a lease call at nowUs (µs since the epoch) to the
// fixed-size state s, written under sp, following ALGORITHMS.md section 9:
// the return goes back first, then between Cost and Want tokens are taken
// when at least Cost (and at least one) are left, or the request is denied
// and nothing is taken. Lease with Want = Cost and no Return decides
// exactly as Take, a peek included.
//
// It updates s and reports write = true when the state changed: tokens
// were granted or returned. Lease does no I/O and does not retain s or sp.
// Callers serialise access to one State.
func (p *Params) Lease(s *State, sp *Params, nowUs int64, a LeaseArgs) (l Lease, write bool, err error) {
	if err := CheckLease(p.Limit.Algorithm, nowUs, a); err != nil {
		return Lease{}, false, err
	}
	a = p.LeaseArgsFor(a)
	st := *s
	if st.Set && sp != nil && sp.Limit.Algorithm != p.Limit.Algorithm {
		st = State{}
	}
	switch p.Limit.Algorithm {
	case TokenBucket:
		l, write = p.leaseTokenBucket(&st, sp, nowUs, a)
	case GCRA:
		l, write = p.leaseGCRA(&st, sp, nowUs, a)
	case FixedWindow:
		l, write = p.leaseFixedWindow(&st, nowUs, a)
	case SlidingWindow:
		l, write = p.leaseSlidingWindow(&st, nowUs, a)
	}
	if write {
		st.Set = true
		*s = st
	}
	return l, write, nil
}

// grant decides how much of want to take when avail whole tokens are
// left: allowed, with granted tokens (0 for a Cost and Want of 0), or
// denied. A Cost of 0 is decided as a cost of 1, as Take decides a peek.
func grant(a LeaseArgs, c, avail int64) (allowed bool, granted int64) {
	switch {
	case a.Cost > c:
		return false, 0
	case avail >= max(a.Cost, 1):
		return true, min(a.Want, avail)
	}
	return false, 0
}

func (p *Params) leaseTokenBucket(s *State, sp *Params, now int64, a LeaseArgs) (Lease, bool) {
	q, u, k, c, cu := p.TickMicros, p.TickUnits, p.TokenUnits, p.Capacity, p.CapacityUnits
	l, last := p.tokenBucketLevel(s, sp, now)
	returned := false
	if a.Return > 0 {
		if l2 := min(cu, l+a.Return*k); l2 != l {
			l, returned = l2, true
		}
	}
	allowed, g := grant(a, c, l/k)
	l -= g * k
	var retry int64
	switch {
	case a.Cost > c:
		retry = p.PeriodMicros
	case !allowed:
		retry = (last+ceilDivBy(max(a.Cost, 1)*k-l, u))*q - now
	}
	s.setTokenBucket(l, last)
	d := p.decision(allowed, l/k, p.tokenBucketReset(l, last, now), retry)
	return Lease{Decision: d, Granted: g}, g > 0 || returned
}

func (p *Params) leaseGCRA(s *State, sp *Params, now int64, a LeaseArgs) (Lease, bool) {
	q, u, k, c, cu := p.TickMicros, p.TickUnits, p.TokenUnits, p.Capacity, p.CapacityUnits
	ta, f, b, debt := p.gcraDebt(s, sp, now)
	returned := false
	if a.Return > 0 {
		if d2 := max(0, debt-a.Return*k); d2 != debt {
			debt, returned = d2, true
		}
	}
	allowed, g := grant(a, c, max(0, cu-debt)/k)
	debt += g * k
	if g > 0 || returned {
		ta, f = b+div(debt, u), mod(debt, u)
	}
	var retry int64
	switch {
	case a.Cost > c:
		retry = p.PeriodMicros
	case !allowed:
		retry = (b+ceilDivBy(debt+max(a.Cost, 1)*k-cu, u))*q - now
	}
	s.setGCRA(ta, f)
	d := p.decision(allowed, max(0, cu-debt)/k, p.gcraReset(b, debt, now), retry)
	return Lease{Decision: d, Granted: g}, g > 0 || returned
}

func (p *Params) leaseFixedWindow(s *State, now int64, a LeaseArgs) (Lease, bool) {
	per, c := p.PeriodMicros, p.Capacity
	w, cnt := p.fixedWindowCount(s, now)
	returned := false
	if a.Return > 0 && w == a.Window {
		if n2 := max(0, cnt-a.Return); n2 != cnt {
			cnt, returned = n2, true
		}
	}
	allowed, g := grant(a, c, max(0, c-cnt))
	cnt += g
	var retry int64
	switch {
	case a.Cost > c:
		retry = per
	case !allowed:
		retry = w + per - now
	}
	var reset int64
	if cnt != 0 {
		reset = w + per - now
	}
	s.setWindow(w, cnt, 0)
	d := p.decision(allowed, max(0, c-cnt), reset, retry)
	return Lease{Decision: d, Granted: g, Window: w, ValidFor: micros(w + per - now)}, g > 0 || returned
}

func (p *Params) leaseSlidingWindow(s *State, now int64, a LeaseArgs) (Lease, bool) {
	per, c, q, pw := p.PeriodMicros, p.Capacity, p.TickMicros, p.WindowTicks
	w, cur, prev := p.slidingWindowCounts(s, now)
	returned := false
	if a.Return > 0 {
		switch a.Window {
		case w:
			if n2 := max(0, cur-a.Return); n2 != cur {
				cur, returned = n2, true
			}
		case w - per:
			if n2 := max(0, prev-a.Return); n2 != prev {
				prev, returned = n2, true
			}
		}
	}
	var e int64
	if now > w {
		e = div(now-w, q)
	}
	x := prev*(pw-e) + cur*pw
	allowed, g := grant(a, c, max(0, c*pw-x)/pw)
	cur += g
	x += g * pw
	var retry int64
	switch {
	case a.Cost > c:
		retry = per
	case !allowed:
		retry = p.slidingWindowRetry(w, cur, prev, now, max(a.Cost, 1))
	}
	s.setWindow(w, cur, prev)
	d := p.decision(allowed, max(0, c*pw-x)/pw, slidingWindowReset(w, cur, prev, per, now), retry)
	return Lease{Decision: d, Granted: g, Window: w, ValidFor: micros(w + per - now)}, g > 0 || returned
}

// LeaseSizing is what a sidecar knows when it sizes a lease on one key.
type LeaseSizing struct {
	// Cost is what the request that asks spends.
	Cost int64
	// Rate is the key's arrival rate at this sidecar, in units of cost per
	// second.
	Rate float64
	// Horizon is how long a lease should last at Rate.
	Horizon time.Duration
	// Until, when positive, is the longest the lease can be used (for
	// FixedWindow and SlidingWindow, until the window ends).
	Until time.Duration
	// MaxFraction is the largest share of the capacity one lease may hold,
	// in (0, 1].
	MaxFraction float64
	// Available is what the key had left at its last store answer, or
	// negative when that is not known.
	Available int64
}

// LeaseSize returns how many tokens a sidecar should ask for (LeaseArgs.Want)
// on a key of this limit: what it expects to spend in z.Horizon at z.Rate
// (or until z.Until), but at most z.MaxFraction of the capacity, and at
// most its share of what the key has left, its share being its rate over
// the limit's rate (all of it at or above that rate). A sidecar that sees a
// tenth of a key's traffic thus leases a tenth of what one that sees all of
// it would, and a key that is nearly spent is leased in small batches. The
// result is at least z.Cost and at most the capacity; a result equal to
// z.Cost means a lease would hold nothing beyond the request.
func (p *Params) LeaseSize(z LeaseSizing) int64 {
	span := z.Horizon
	if z.Until > 0 && z.Until < span {
		span = z.Until
	}
	want := math.Ceil(z.Rate * span.Seconds())
	if frac := z.MaxFraction; frac > 0 && frac <= 1 {
		want = math.Min(want, math.Max(1, math.Floor(float64(p.Capacity)*frac)))
	}
	if z.Available >= 0 {
		limitRate := float64(p.Limit.Requests) / p.Limit.Period.Seconds()
		share := math.Min(1, z.Rate/limitRate)
		want = math.Min(want, math.Ceil(float64(z.Available)*share))
	}
	if !(want >= 0) { // NaN from a bad rate: ask for the request alone
		want = 0
	}
	n := int64(math.Min(want, float64(p.Capacity)))
	return max(n, z.Cost)
}

// Splitter is a Store that places the sub-counters of a split key itself
// (the Redis store puts them on different slots, and so on different
// masters). Stores without it get key~i.
type Splitter interface {
	// SplitKey returns the Request.Key of sub-counter i (0 <= i < k) of
	// key. It depends on its arguments alone.
	SplitKey(key string, i, k int) string
}

// MaxSplit bounds how many sub-counters one key may be split into.
const MaxSplit = 16

// ValidateSplit reports why l cannot be split into k sub-counters: k out
// of [1, MaxSplit], fewer requests (or, for TokenBucket and GCRA, a smaller
// capacity) than k, or a sub-limit that is not valid on its own.
func (l Limit) ValidateSplit(k int) error {
	if k < 1 || k > MaxSplit {
		return fmt.Errorf("split: must be between 1 and %d, got %d", MaxSplit, k)
	}
	if k == 1 {
		return nil
	}
	if l.Requests < int64(k) {
		return fmt.Errorf("split: %d sub-counters need at least %d requests per period, got %d", k, k, l.Requests)
	}
	if l.Capacity() < int64(k) {
		return fmt.Errorf("split: %d sub-counters need a capacity (burst) of at least %d, got %d", k, k, l.Capacity())
	}
	for i := range k {
		if err := SplitLimit(l, i, k).Validate(); err != nil {
			return fmt.Errorf("split: sub-counter %d of %d: %w", i, k, err)
		}
	}
	return nil
}

// SplitLimit returns the limit of sub-counter i (0 <= i < k) when l is
// spread over k sub-counters: Requests and Burst divided by k, the
// remainders going one each to the first sub-counters, so that the k
// sub-limits add up to l exactly.
func SplitLimit(l Limit, i, k int) Limit {
	if k <= 1 {
		return l
	}
	part := func(v int64) int64 {
		q, r := v/int64(k), v%int64(k)
		if int64(i) < r {
			q++
		}
		return q
	}
	out := l
	out.Requests = part(l.Requests)
	if l.Burst > 0 {
		out.Burst = part(l.Burst)
	}
	return out
}
