package limitertest

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// LeaseStore is a store that also hands out leases.
type LeaseStore interface {
	limiter.Store
	limiter.Leaser
}

// LeaseStep is one lease call of a LeaseTable: at Base+At, Args must get
// Want.
type LeaseStep struct {
	At   time.Duration
	Args limiter.LeaseArgs
	Want limiter.Lease
}

// LeaseTable is a sequence of lease calls against one fresh key.
type LeaseTable struct {
	Name  string
	Limit limiter.Limit
	Base  time.Time
	Steps []LeaseStep
}

// LeaseFunc makes a lease call on one key at t under l.
type LeaseFunc func(t time.Time, a limiter.LeaseArgs, l limiter.Limit) (limiter.Lease, error)

// RunLeaseTable applies tb's steps in order through lease and reports every
// answer that differs from the table.
func RunLeaseTable(t *testing.T, tb LeaseTable, lease LeaseFunc) {
	t.Helper()
	for i, s := range tb.Steps {
		at := tb.Base.Add(s.At)
		got, err := lease(at, s.Args, tb.Limit)
		if err != nil {
			t.Fatalf("step %d: Lease(%v, %+v): %v", i, at.UTC().Format(time.RFC3339Nano), s.Args, err)
		}
		if got != s.Want {
			t.Errorf("step %d: Lease(%v, %+v) = %v, want %v", i, at.UTC().Format(time.RFC3339Nano), s.Args, got, s.Want)
		}
	}
}

func la(cost, want int64) limiter.LeaseArgs { return limiter.LeaseArgs{Cost: cost, Want: want} }

// ret is a lease call that returns back tokens to the window starting at
// window (the zero time for the buckets, which have none).
func ret(cost, want, back int64, window time.Time) limiter.LeaseArgs {
	var w int64
	if !window.IsZero() {
		w = window.UnixMicro()
	}
	return limiter.LeaseArgs{Cost: cost, Want: want, Return: back, Window: w}
}

func granted(d limiter.Decision, g int64) limiter.Lease {
	return limiter.Lease{Decision: d, Granted: g}
}

func windowed(l limiter.Lease, window time.Time, validFor time.Duration) limiter.Lease {
	l.Window, l.ValidFor = window.UnixMicro(), validFor
	return l
}

// bucketLeaseSteps hold for TokenBucket and GCRA alike (10 per 1s).
func bucketLeaseSteps() []LeaseStep {
	return []LeaseStep{
		{0, la(1, 4), granted(allow(6, 400*ms), 4)},
		// Want is capped at the capacity, the grant at what is left.
		{0, la(1, 20), granted(allow(0, sec), 6)},
		{0, la(1, 5), granted(deny(0, sec, 100*ms), 0)},
		// A return alone: 3 tokens back, nothing taken.
		{0, ret(0, 0, 3, time.Time{}), granted(allow(3, 700*ms), 0)},
		// 50ms refill half a token: 3.5, less 2.
		{50 * ms, la(2, 2), granted(allow(1, 850*ms), 2)},
		// A return beyond the capacity fills the bucket and no more.
		{50 * ms, ret(1, 3, 50, time.Time{}), granted(allow(7, 300*ms), 3)},
		{50 * ms, la(11, 11), granted(deny(7, 300*ms, sec), 0)},
		// A denied request still gives back what it returns.
		{50 * ms, ret(11, 0, 2, time.Time{}), granted(deny(9, 100*ms, sec), 0)},
		// Cost 0 with a Want takes ahead of need; none left takes
		// nothing, and is denied as a peek is: as a cost of 1.
		{50 * ms, la(0, 9), granted(allow(0, sec), 9)},
		{50 * ms, la(0, 9), granted(deny(0, sec, 100*ms), 0)},
	}
}

// LeaseTables returns the lease step tables every leasing store must
// pass, with answers computed by hand from ALGORITHMS.md section 9. Each
// call returns fresh slices.
func LeaseTables() []LeaseTable {
	w0 := minuteAligned
	w1 := minuteAligned.Add(sec)
	tables := []LeaseTable{
		{
			Name:  "TokenBucket/10 per 1s",
			Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: sec},
			Base:  offBase,
			Steps: bucketLeaseSteps(),
		},
		{
			Name:  "GCRA/10 per 1s",
			Limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 10, Period: sec},
			Base:  offBase,
			Steps: bucketLeaseSteps(),
		},
		{
			Name:  "FixedWindow/10 per 1s",
			Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Period: sec},
			Base:  minuteAligned.Add(250 * ms),
			Steps: []LeaseStep{
				{0, la(1, 4), windowed(granted(allow(6, 750*ms), 4), w0, 750*ms)},
				{100 * ms, ret(0, 0, 2, w0), windowed(granted(allow(8, 650*ms), 0), w0, 650*ms)},
				{100 * ms, la(1, 20), windowed(granted(allow(0, 650*ms), 8), w0, 650*ms)},
				{200 * ms, la(1, 1), windowed(granted(deny(0, 550*ms, 550*ms), 0), w0, 550*ms)},
				// The next window: a return to the old one changes nothing.
				{750 * ms, ret(1, 3, 5, w0), windowed(granted(allow(7, sec), 3), w1, sec)},
				{750 * ms, ret(0, 0, 5, w1), windowed(granted(allow(10, 0), 0), w1, sec)},
			},
		},
		{
			Name:  "SlidingWindow/10 per 1s",
			Limit: limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 10, Period: sec},
			Base:  minuteAligned.Add(250 * ms),
			Steps: []LeaseStep{
				{0, la(1, 4), windowed(granted(allow(6, 1750*ms), 4), w0, 750*ms)},
				// A quarter into the next window: the return goes to prev
				// (4 -> 3), which weighs three quarters.
				{sec, ret(0, 0, 1, w0), windowed(granted(allow(7, 750*ms), 0), w1, 750*ms)},
				{sec, la(1, 10), windowed(granted(allow(0, 1750*ms), 7), w1, 750*ms)},
				// prev 3 and cur 7 leave room for 1 when 3*(1-e) <= 2.
				{sec, la(1, 1), windowed(granted(deny(0, 1750*ms, 83334*us), 0), w1, 750*ms)},
				{sec, ret(0, 0, 7, w1), windowed(granted(allow(7, 750*ms), 0), w1, 750*ms)},
			},
		},
	}
	for i := range tables {
		c := tables[i].Limit.Capacity()
		for j := range tables[i].Steps {
			tables[i].Steps[j].Want.Limit = c
		}
	}
	return tables
}

// giver is a model algorithm that can take a lease's unused tokens back.
type giver interface {
	// giveBack returns up to n tokens at t to the window starting at
	// window (ignored by the buckets).
	giveBack(t, n, window int64)
}

func (s *tokenSim) giveBack(t, n, _ int64) {
	c := big.NewRat(s.p.Capacity, 1)
	v := new(big.Rat).Add(s.at(t), big.NewRat(n, 1))
	if v.Cmp(c) > 0 {
		v = c
	}
	s.tokens, s.tick, s.used = v, t/s.p.TickMicros, true
}

func (s *leakySim) giveBack(t, n, _ int64) {
	v := new(big.Rat).Sub(s.at(t), big.NewRat(n, 1))
	if v.Sign() < 0 {
		v.SetInt64(0)
	}
	s.water, s.tick = v, t/s.p.TickMicros
}

func (s *fixedSim) giveBack(t, n, window int64) {
	if start := t - t%s.p.PeriodMicros; start == window {
		if back := min(n, s.count(t)); back > 0 {
			s.es = append(s.es, event{t, -back})
		}
	}
}

func (s *slidingSim) giveBack(t, n, window int64) {
	per := s.p.PeriodMicros
	start := t - t%per
	var from, to int64
	switch window {
	case start:
		from, to = start, forever
	case start - per:
		from, to = start-per, start
	default:
		return
	}
	if back := min(n, s.es.sum(from, to)); back > 0 {
		// An event at the window's start counts in that window.
		s.es = append(s.es, event{from, -back})
	}
}

// Lease makes a lease call at now (µs since the epoch), as ALGORITHMS.md
// section 8 defines it on the model's state: the return first, then a
// take of as much of Want as is left, at least Cost, or a deny. It panics
// on SlidingLog, which cannot lease.
func (m *Model) Lease(now int64, a limiter.LeaseArgs) limiter.Lease {
	t := now
	if m.seen && m.newest > t {
		t = m.newest
	}
	m.seen, m.newest = true, t
	a = m.p.LeaseArgsFor(a)
	g, ok := m.sim.(giver)
	if !ok {
		panic(fmt.Sprintf("model: %v cannot lease", m.p.Limit.Algorithm))
	}
	if a.Return > 0 {
		g.giveBack(t, a.Return, a.Window)
	}
	l := limiter.Lease{Decision: limiter.Decision{Limit: m.p.Capacity}}
	n1 := max(a.Cost, 1) // a Cost of 0 is decided as a peek: as a cost of 1
	switch left := m.sim.remaining(t); {
	case a.Cost > m.p.Capacity:
		l.RetryAfter = time.Duration(m.p.PeriodMicros) * time.Microsecond
	case left >= n1:
		l.Allowed, l.Granted = true, min(a.Want, left)
		if l.Granted > 0 {
			m.sim.add(t, l.Granted)
		}
	default:
		at := m.search(t, func(x int64) bool { return m.sim.admits(x, n1) })
		l.RetryAfter = time.Duration(at-now) * time.Microsecond
	}
	l.Remaining = m.sim.remaining(t)
	if !m.sim.full(t) {
		at := m.search(t, m.sim.full)
		l.ResetAfter = time.Duration(at-now) * time.Microsecond
	}
	switch m.p.Limit.Algorithm {
	case limiter.FixedWindow, limiter.SlidingWindow:
		start := t - t%m.p.PeriodMicros
		l.Window, l.ValidFor = start, time.Duration(start+m.p.PeriodMicros-now)*time.Microsecond
	}
	return l
}

// CompareLeaseTrace drives a fresh key under l through steps random lease
// calls (plain takes, leases of a few tokens, takes ahead of need, returns
// of what earlier grants left, returns to windows that have passed), with
// the clock moving as in CompareTrace, and fails on the first answer that
// differs from Model's.
func CompareLeaseTrace(t testing.TB, l limiter.Limit, rng *rand.Rand, steps int, lease func(now int64, a limiter.LeaseArgs) (limiter.Lease, error)) {
	t.Helper()
	m, err := NewModel(l)
	if err != nil {
		t.Fatal(err)
	}
	per := l.Period.Microseconds()
	interval := max(1, per/l.Requests)
	now := 1_700_000_000_000_000 + rng.Int64N(per)
	// held is what earlier grants left unspent, in the window heldWindow.
	var held, heldWindow int64
	for i := range steps {
		now = advance(rng, now, per, interval)
		c := l.Capacity()
		var a limiter.LeaseArgs
		switch rng.IntN(5) {
		case 0: // a plain take
			a.Cost = rng.Int64N(c + 2)
			a.Want = a.Cost
		case 1: // a lease for a request
			a.Cost = 1 + rng.Int64N(2)
			a.Want = a.Cost + rng.Int64N(c+1)
		case 2: // ahead of need
			a.Want = rng.Int64N(c + 1)
		case 3: // a return, alone or with a request
			a.Return = rng.Int64N(held + 1)
			a.Window = heldWindow
			if rng.IntN(2) == 0 {
				a.Cost = 1
				a.Want = 1 + rng.Int64N(c)
			}
			held -= a.Return
		default: // a return to a window long gone, or of more than held
			a.Return = 1 + rng.Int64N(c+2)
			a.Window = heldWindow - per*(1+rng.Int64N(2))
		}
		got, err := lease(now, a)
		if err != nil {
			t.Fatalf("%v step %d: Lease(%d, %+v): %v", l, i, now, a, err)
		}
		want := m.Lease(now, a)
		if got != want {
			t.Fatalf("%v step %d: Lease(%d, %+v) = %v, want %v (model)", l, i, now, a, got, want)
		}
		if !got.Allowed && got.RetryAfter <= 0 {
			t.Fatalf("%v step %d: deny with RetryAfter %v", l, i, got.RetryAfter)
		}
		if got.Allowed && (got.Granted < min(a.Cost, a.Want) || got.Granted > max(a.Cost, min(a.Want, c))) {
			t.Fatalf("%v step %d: Lease(%d, %+v) granted %d", l, i, now, a, got.Granted)
		}
		if got.Granted > 0 {
			if got.Window != heldWindow {
				held = 0
			}
			held, heldWindow = held+got.Granted-min(a.Cost, got.Granted), got.Window
		}
	}
}

// leasable are the algorithms that can lease.
var leasable = []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow}

// RunLease runs the lease conformance suite against the stores newStore
// returns, as Run does for Take: the lease tables, random traces against
// the model, a race of concurrent leases, and the errors.
func RunLease(t *testing.T, newStore func(t *testing.T, now func() time.Time) LeaseStore) {
	base := time.Unix(1_700_000_000, 0)
	t.Run("Tables", func(t *testing.T) {
		t.Parallel()
		for _, tb := range LeaseTables() {
			t.Run(tb.Name, func(t *testing.T) {
				t.Parallel()
				clk := NewClock(tb.Base)
				s, key := newStore(t, clk.Now), keyPrefix(t)+"k"
				RunLeaseTable(t, tb, func(at time.Time, a limiter.LeaseArgs, l limiter.Limit) (limiter.Lease, error) {
					clk.Set(at)
					got, _, err := s.Lease(t.Context(), limiter.LeaseRequest{Key: key, Limit: l, LeaseArgs: a})
					return got, err
				})
			})
		}
	})
	t.Run("Model", func(t *testing.T) {
		t.Parallel()
		for _, alg := range leasable {
			t.Run(alg.String(), func(t *testing.T) {
				t.Parallel()
				clk := NewClock(base)
				s, prefix := newStore(t, clk.Now), keyPrefix(t)
				rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(alg)))
				for i := range 4 {
					l := RandomLimit(rng, alg)
					key := fmt.Sprintf("%s%d", prefix, i)
					CompareLeaseTrace(t, l, rng, 600, func(now int64, a limiter.LeaseArgs) (limiter.Lease, error) {
						clk.Set(time.UnixMicro(now))
						got, _, err := s.Lease(t.Context(), limiter.LeaseRequest{Key: key, Limit: l, LeaseArgs: a})
						return got, err
					})
				}
			})
		}
	})
	t.Run("TakeSharesState", func(t *testing.T) {
		t.Parallel()
		// Take and Lease count on the same state: 3 leased, 7 taken, none
		// left; 2 returned, 2 taken.
		s, key := newStore(t, NewClock(base).Now), keyPrefix(t)+"k"
		for _, alg := range leasable {
			l := limiter.Limit{Algorithm: alg, Requests: 10, Period: time.Hour}
			k := key + alg.String()
			got, _, err := s.Lease(t.Context(), limiter.LeaseRequest{Key: k, Limit: l, LeaseArgs: limiter.LeaseArgs{Cost: 1, Want: 3}})
			if err != nil || got.Granted != 3 {
				t.Fatalf("%v: lease 3: %v, %v", alg, got, err)
			}
			for j := range 8 {
				d, err := take(t.Context(), s, limiter.Request{Key: k, Limit: l, Cost: 1})
				if err != nil {
					t.Fatal(err)
				}
				if got, want := d.Allowed, j < 7; got != want {
					t.Fatalf("%v: take %d after a lease of 3: Allowed = %v, want %v", alg, j, got, want)
				}
			}
			back, _, err := s.Lease(t.Context(), limiter.LeaseRequest{Key: k, Limit: l, LeaseArgs: limiter.LeaseArgs{Return: 2, Window: got.Window}})
			if err != nil || back.Remaining != 2 {
				t.Fatalf("%v: return 2: %v, %v; want 2 remaining", alg, back, err)
			}
		}
	})
	t.Run("Race", func(t *testing.T) {
		t.Parallel()
		for _, alg := range leasable {
			t.Run(alg.String(), func(t *testing.T) {
				t.Parallel()
				testLeaseRace(t, newStore(t, NewClock(base.Add(123*time.Microsecond)).Now), keyPrefix(t)+"k", alg)
			})
		}
	})
	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		clk := NewClock(base)
		s, key := newStore(t, clk.Now), keyPrefix(t)+"k"
		good := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 2, Period: time.Minute}
		bad := []struct {
			req  limiter.LeaseRequest
			want error
		}{
			{limiter.LeaseRequest{Key: key, Limit: good, LeaseArgs: limiter.LeaseArgs{Cost: -1}}, limiter.ErrNegativeCost},
			{limiter.LeaseRequest{Key: key, Limit: good, LeaseArgs: limiter.LeaseArgs{Cost: 1, Want: -1}}, limiter.ErrNegativeCost},
			{limiter.LeaseRequest{Key: key, Limit: good, LeaseArgs: limiter.LeaseArgs{Return: -1}}, limiter.ErrNegativeCost},
			{limiter.LeaseRequest{Key: key, Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 2, Period: time.Minute}, LeaseArgs: limiter.LeaseArgs{Cost: 1, Want: 2}}, limiter.ErrNotLeasable},
			{limiter.LeaseRequest{Key: key, Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Period: time.Minute}, LeaseArgs: limiter.LeaseArgs{Cost: 1, Want: 2}}, nil},
		}
		for i, b := range bad {
			_, _, err := s.Lease(t.Context(), b.req)
			if err == nil || errors.Is(err, limiter.ErrUnavailable) || (b.want != nil && !errors.Is(err, b.want)) {
				t.Errorf("request %d (%+v): err = %v, want a validation error (%v)", i, b.req, err, b.want)
			}
		}
		// None of them spent anything.
		d, err := take(t.Context(), s, limiter.Request{Key: key, Limit: good})
		if err != nil || d.Remaining != 2 {
			t.Fatalf("after bad input: %v, %v; want 2 remaining", d, err)
		}
	})
}

// testLeaseRace has 200 goroutines each lease up to 3 tokens and return
// one at the same instant on a key of capacity 100: what they keep and
// what the key has left add up to exactly the capacity.
func testLeaseRace(t *testing.T, s LeaseStore, key string, alg limiter.Algorithm) {
	l := limiter.Limit{Algorithm: alg, Requests: 100, Period: time.Hour}
	var kept, errs atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 200 {
		wg.Go(func() {
			<-start
			got, _, err := s.Lease(context.Background(), limiter.LeaseRequest{Key: key, Limit: l, LeaseArgs: limiter.LeaseArgs{Cost: 1, Want: 3}})
			if err != nil {
				errs.Add(1)
				return
			}
			if got.Granted > 1 {
				if _, _, err := s.Lease(context.Background(), limiter.LeaseRequest{Key: key, Limit: l, LeaseArgs: limiter.LeaseArgs{Return: 1, Window: got.Window}}); err != nil {
					errs.Add(1)
					return
				}
				got.Granted--
			}
			kept.Add(got.Granted)
		})
	}
	close(start)
	wg.Wait()
	if n := errs.Load(); n != 0 {
		t.Fatalf("%d lease calls failed", n)
	}
	d, err := take(context.Background(), s, limiter.Request{Key: key, Limit: l})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := kept.Load()+d.Remaining, int64(100); got != want {
		t.Fatalf("tokens kept %d + remaining %d = %d, want %d", kept.Load(), d.Remaining, got, want)
	}
}
