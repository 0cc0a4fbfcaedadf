package limitertest

import (
	"fmt"
	"math/big"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// Model is a brute-force reference implementation of one key under one
// limit. It shares no arithmetic with package limiter: it keeps exact
// rationals (token buckets, leaky bucket) or the full list of admitted
// requests (windows, log), evaluates the algorithm's definition directly,
// and finds RetryAfter and ResetAfter by searching for the first
// microsecond at which the request would be admitted or the key would be
// full. It uses only the limit's clock resolution (Params.TickMicros and
// WindowTicks) from package limiter, since that is part of the algorithms'
// definition.
//
// GCRA is modelled as a leaky bucket used as a meter (each request pours
// its cost into a bucket of Capacity that leaks at the rate; overflow is
// refused), which is what makes the two the same algorithm.
//
// The model's clock never goes back: an instant older than the newest one
// seen is read as the newest one. It is not safe for concurrent use.
type Model struct {
	p      *limiter.Params
	sim    sim
	newest int64
	seen   bool
}

// sim is one algorithm's definition, evaluated at an instant at or after
// every instant passed to add.
type sim interface {
	admits(t, n int64) bool
	remaining(t int64) int64
	full(t int64) bool
	add(t, n int64)
}

// NewModel returns the reference model for a key under l, initially full.
func NewModel(l limiter.Limit) (*Model, error) {
	p, err := limiter.NewParams(l)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	m := &Model{p: p}
	switch l.Algorithm {
	case limiter.TokenBucket:
		m.sim = &tokenSim{p: p, tokens: big.NewRat(p.Capacity, 1)}
	case limiter.GCRA:
		m.sim = &leakySim{p: p, water: new(big.Rat)}
	case limiter.FixedWindow:
		m.sim = &fixedSim{p: p}
	case limiter.SlidingWindow:
		m.sim = &slidingSim{p: p}
	case limiter.SlidingLog:
		m.sim = &logSim{p: p}
	}
	return m, nil
}

// AllowN decides a request of cost n (n >= 0) at now, in µs since the
// epoch. A cost of 0 is a peek: it is decided as a cost of 1, by the same
// definition, and adds nothing.
func (m *Model) AllowN(now, n int64) limiter.Decision {
	t := now
	if m.seen && m.newest > t {
		t = m.newest
	}
	m.seen, m.newest = true, t
	d := limiter.Decision{Limit: m.p.Capacity}
	n1 := max(n, 1)
	md := m.p.MaxDelayMicros
	switch {
	case md == 0 && n > m.p.Capacity, md > 0 && n > m.p.MaxReserve:
		d.RetryAfter = time.Duration(m.p.PeriodMicros) * time.Microsecond
	case md > 0 && !m.sim.admits(t, n1):
		// A delaying GCRA: the request pours its cost in now and goes
		// when the water has drained to the capacity, if that is within
		// MaxDelay (section 10 of ALGORITHMS.md).
		ls := m.sim.(*leakySim)
		at := m.search(t, func(x int64) bool { return ls.drained(t, n1, x) })
		if wait := at - now; wait <= md {
			d.Allowed = true
			if n > 0 {
				m.sim.add(t, n)
				d.Wait = time.Duration(wait) * time.Microsecond
			}
		} else {
			d.RetryAfter = time.Duration(wait-md) * time.Microsecond
		}
	case m.sim.admits(t, n1):
		if n > 0 {
			m.sim.add(t, n)
		}
		d.Allowed = true
	default:
		at := m.search(t, func(x int64) bool { return m.sim.admits(x, n1) })
		d.RetryAfter = time.Duration(at-now) * time.Microsecond
	}
	d.Remaining = m.sim.remaining(t)
	if !m.sim.full(t) {
		at := m.search(t, m.sim.full)
		d.ResetAfter = time.Duration(at-now) * time.Microsecond
	}
	return d
}

// search returns the first instant after t at which ok holds. ok must be
// monotone (once true, true at every later instant) and hold by t+horizon.
func (m *Model) search(t int64, ok func(int64) bool) int64 {
	lo, hi := t, t+m.horizon() // !ok(lo), ok(hi)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// horizon bounds how long any key takes to be full again and any request
// of at most the capacity to be admitted: the fill time plus two periods
// plus a tick.
func (m *Model) horizon() int64 {
	p := m.p
	fill := new(big.Int).Mul(big.NewInt(p.Capacity), big.NewInt(p.PeriodMicros))
	fill.Quo(fill, big.NewInt(p.Limit.Requests))
	h := fill.Int64() + 2*p.PeriodMicros + p.TickMicros + 1
	if p.MaxDelayMicros > 0 {
		// The water of a delaying key goes up to MaxReserve over the
		// capacity.
		more := new(big.Int).Mul(big.NewInt(p.MaxReserve), big.NewInt(p.PeriodMicros))
		more.Quo(more, big.NewInt(p.Limit.Requests))
		h += p.MaxDelayMicros + more.Int64() + p.PeriodMicros
	}
	return h
}

// ratePerTick returns the tokens refilled in elapsed ticks: elapsed*q*R/P.
func ratePerTick(p *limiter.Params, elapsedTicks int64) *big.Rat {
	num := new(big.Int).Mul(big.NewInt(elapsedTicks), big.NewInt(p.TickMicros))
	num.Mul(num, big.NewInt(p.Limit.Requests))
	return new(big.Rat).SetFrac(num, big.NewInt(p.PeriodMicros))
}

func floorRat(r *big.Rat) int64 {
	return new(big.Int).Quo(r.Num(), r.Denom()).Int64() // r >= 0
}

type tokenSim struct {
	p      *limiter.Params
	tokens *big.Rat
	tick   int64
	used   bool
}

func (s *tokenSim) at(t int64) *big.Rat {
	if !s.used {
		return big.NewRat(s.p.Capacity, 1)
	}
	v := new(big.Rat).Add(s.tokens, ratePerTick(s.p, t/s.p.TickMicros-s.tick))
	if c := big.NewRat(s.p.Capacity, 1); v.Cmp(c) > 0 {
		v = c
	}
	return v
}

func (s *tokenSim) admits(t, n int64) bool  { return s.at(t).Cmp(big.NewRat(n, 1)) >= 0 }
func (s *tokenSim) remaining(t int64) int64 { return floorRat(s.at(t)) }
func (s *tokenSim) full(t int64) bool       { return s.at(t).Cmp(big.NewRat(s.p.Capacity, 1)) == 0 }
func (s *tokenSim) add(t, n int64) {
	s.tokens = new(big.Rat).Sub(s.at(t), big.NewRat(n, 1))
	s.tick, s.used = t/s.p.TickMicros, true
}

type leakySim struct {
	p     *limiter.Params
	water *big.Rat
	tick  int64
}

func (s *leakySim) at(t int64) *big.Rat {
	v := new(big.Rat).Sub(s.water, ratePerTick(s.p, t/s.p.TickMicros-s.tick))
	if v.Sign() < 0 {
		v.SetInt64(0)
	}
	return v
}

func (s *leakySim) admits(t, n int64) bool {
	v := new(big.Rat).Add(s.at(t), big.NewRat(n, 1))
	return v.Cmp(big.NewRat(s.p.Capacity, 1)) <= 0
}

func (s *leakySim) remaining(t int64) int64 {
	v := new(big.Rat).Sub(big.NewRat(s.p.Capacity, 1), s.at(t))
	if v.Sign() < 0 {
		return 0 // a delaying key holds reservations over the capacity
	}
	return floorRat(v)
}

// drained reports whether, with n poured in at t, the water has drained
// to the capacity by x: when a delayed request's reserved slot comes.
func (s *leakySim) drained(t, n, x int64) bool {
	v := new(big.Rat).Add(s.at(t), big.NewRat(n, 1))
	v.Sub(v, ratePerTick(s.p, x/s.p.TickMicros-t/s.p.TickMicros))
	return v.Cmp(big.NewRat(s.p.Capacity, 1)) <= 0
}

func (s *leakySim) full(t int64) bool { return s.at(t).Sign() == 0 }
func (s *leakySim) add(t, n int64) {
	s.water = new(big.Rat).Add(s.at(t), big.NewRat(n, 1))
	s.tick = t / s.p.TickMicros
}

// event is one admitted request.
type event struct{ ts, n int64 }

type events []event

// sum adds the costs of the events with from <= ts < to.
func (es events) sum(from, to int64) int64 {
	var total int64
	for _, e := range es {
		if e.ts >= from && e.ts < to {
			total += e.n
		}
	}
	return total
}

// drop forgets events older than before.
func (es *events) drop(before int64) {
	i := 0
	for i < len(*es) && (*es)[i].ts < before {
		i++
	}
	*es = (*es)[i:]
}

const forever = 1 << 62

type fixedSim struct {
	p  *limiter.Params
	es events
}

func (s *fixedSim) count(t int64) int64 {
	start := t - t%s.p.PeriodMicros
	return s.es.sum(start, start+s.p.PeriodMicros)
}

func (s *fixedSim) admits(t, n int64) bool  { return s.count(t)+n <= s.p.Capacity }
func (s *fixedSim) remaining(t int64) int64 { return max(0, s.p.Capacity-s.count(t)) }
func (s *fixedSim) full(t int64) bool       { return s.count(t) == 0 }
func (s *fixedSim) add(t, n int64) {
	s.es.drop(t - 2*s.p.PeriodMicros)
	s.es = append(s.es, event{t, n})
}

type slidingSim struct {
	p  *limiter.Params
	es events
}

// estimate is prev * (remaining overlap of the previous window) + cur,
// with the elapsed part of the current window measured in whole ticks.
func (s *slidingSim) estimate(t int64) *big.Rat {
	per := s.p.PeriodMicros
	start := t - t%per
	cur := s.es.sum(start, forever)
	prev := s.es.sum(start-per, start)
	elapsed := (t - start) / s.p.TickMicros
	est := big.NewRat(prev*(s.p.WindowTicks-elapsed), s.p.WindowTicks)
	return est.Add(est, big.NewRat(cur, 1))
}

func (s *slidingSim) admits(t, n int64) bool {
	v := new(big.Rat).Add(s.estimate(t), big.NewRat(n, 1))
	return v.Cmp(big.NewRat(s.p.Capacity, 1)) <= 0
}

func (s *slidingSim) remaining(t int64) int64 {
	v := new(big.Rat).Sub(big.NewRat(s.p.Capacity, 1), s.estimate(t))
	if v.Sign() < 0 {
		return 0
	}
	return floorRat(v)
}

func (s *slidingSim) full(t int64) bool { return s.estimate(t).Sign() == 0 }
func (s *slidingSim) add(t, n int64) {
	s.es.drop(t - 3*s.p.PeriodMicros)
	s.es = append(s.es, event{t, n})
}

type logSim struct {
	p  *limiter.Params
	es events
}

func (s *logSim) count(t int64) int64 { return s.es.sum(t-s.p.PeriodMicros+1, forever) }

func (s *logSim) admits(t, n int64) bool  { return s.count(t)+n <= s.p.Capacity }
func (s *logSim) remaining(t int64) int64 { return max(0, s.p.Capacity-s.count(t)) }
func (s *logSim) full(t int64) bool       { return s.count(t) == 0 }
func (s *logSim) add(t, n int64) {
	s.es.drop(t - 2*s.p.PeriodMicros)
	s.es = append(s.es, event{t, n})
}
