package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// leaseStore is a memory store on the test clock that counts its calls
// and can be made to fail, as a Redis shard that goes away: the memory
// store never fails on its own.
type leaseStore struct {
	*memstore.Store
	takes, leases atomic.Int64
	fail          atomic.Bool
	// budget, when set, is the engine's Budget: requestLeases counts the
	// lease calls made for a request (a cost or a want), and deadlines
	// keeps their Deadlines until the test reads them (requestDeadlines).
	budget        time.Duration
	requestLeases atomic.Int64
	deadlineMu    sync.Mutex
	deadlines     []time.Time
}

// requestDeadlines returns the Deadlines of the lease calls made for
// requests since the last call, and forgets them.
func (s *leaseStore) requestDeadlines() []time.Time {
	s.deadlineMu.Lock()
	defer s.deadlineMu.Unlock()
	d := s.deadlines
	s.deadlines = nil
	return d
}

func (s *leaseStore) Take(ctx context.Context, req limiter.Request) (limiter.Decision, string, error) {
	s.takes.Add(1)
	if s.fail.Load() {
		return limiter.Decision{}, "shard-a", fmt.Errorf("dial: %w", limiter.ErrUnavailable)
	}
	d, _, err := s.Store.Take(ctx, req)
	return d, "shard-a", err
}

func (s *leaseStore) Lease(ctx context.Context, req limiter.LeaseRequest) (limiter.Lease, string, error) {
	s.leases.Add(1)
	if s.budget > 0 && (req.Cost > 0 || req.Want > 0) {
		s.requestLeases.Add(1)
		s.deadlineMu.Lock()
		s.deadlines = append(s.deadlines, req.Deadline)
		s.deadlineMu.Unlock()
	}
	if s.fail.Load() {
		return limiter.Lease{}, "shard-a", fmt.Errorf("dial: %w", limiter.ErrUnavailable)
	}
	l, _, err := s.Store.Lease(ctx, req)
	return l, "shard-a", err
}

func (s *leaseStore) calls() int64 { return s.takes.Load() + s.leases.Load() }

// leaseFixture is an engine with leases on a shared store, on a clock the
// test moves.
type leaseFixture struct {
	clock *clock
	store *leaseStore
	m     *metrics.Metrics
	e     *Engine
}

func newLeaseFixture(t *testing.T, store *leaseStore, clk *clock) *leaseFixture {
	t.Helper()
	f := &leaseFixture{clock: clk, store: store, m: metrics.NewMetrics(prometheus.NewPedanticRegistry())}
	fb, err := memstore.New(memstore.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	f.e, err = New(Options{Store: store, StoreName: "test", Fallback: fb, Metrics: f.m, Now: clk.Now,
		Leases: &LeaseOptions{SweepInterval: -1}, Budget: store.budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.e.Close(context.Background()) })
	return f
}

func newSharedStore(t *testing.T, clk *clock) *leaseStore {
	t.Helper()
	ms, err := memstore.New(memstore.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	return &leaseStore{Store: ms}
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (f *leaseFixture) rule(t *testing.T, name string, lim limiter.Limit, lease bool, split int, failClosed bool) *Rule {
	t.Helper()
	r, err := NewRule("pol", name, lim, 1, failClosed, false, f.m)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Spread(lease, split, f.m); err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *leaseFixture) decide(hits ...Hit) Verdict {
	var v Verdict
	f.e.Decide(context.Background(), hits, &v)
	return v
}

// remaining peeks at the shared count of key under l.
func (f *leaseFixture) remaining(t *testing.T, key string, l limiter.Limit) int64 {
	t.Helper()
	d, _, err := f.store.Store.Take(context.Background(), limiter.Request{Key: key, Limit: l})
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// hourWindow is a FixedWindow limit whose window the tests never leave:
// the shared count is exactly what was taken.
func hourWindow(n int64) limiter.Limit {
	return limiter.Limit{Algorithm: limiter.FixedWindow, Requests: n, Period: time.Hour}
}

// TestHotKeyIsDecidedOnItsLease: a key at 5000/s takes leases, most
// decisions make no store call, every admitted request was taken from the
// shared count first, and the unused tokens go back at shutdown.
func TestHotKeyIsDecidedOnItsLease(t *testing.T) {
	t.Parallel()
	clk := newClock()
	f := newLeaseFixture(t, newSharedStore(t, clk), clk)
	lim := hourWindow(100000)
	r := f.rule(t, "hot", lim, true, 1, false)
	admitted, fromLease := 0, 0
	for range 5000 {
		clk.Add(200 * time.Microsecond)
		v := f.decide(Hit{Rule: r, Key: "k", Cost: 1})
		if v.Outcome != Allow {
			t.Fatalf("a key far below its limit was denied: %+v", v.Results[0])
		}
		admitted++
		if v.Results[0].Source == FromLease {
			fromLease++
		}
	}
	if calls := f.store.calls(); calls > 100 {
		t.Errorf("%d store calls for %d decisions, want at most 100 (2%%)", calls, admitted)
	}
	if got := value(f.m.Lease.HitsTotal.WithLabelValues("pol", "hot")); got != float64(fromLease) || fromLease < 4900 {
		t.Errorf("lease hits metric %v, results from the lease %d, want the same and at least 4900", got, fromLease)
	}
	// The shared count holds what was admitted and what the lease holds.
	taken := 100000 - f.remaining(t, "k", lim)
	if taken < int64(admitted) {
		t.Fatalf("the store counted %d, fewer than the %d admitted", taken, admitted)
	}
	if err := f.e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := 100000 - f.remaining(t, "k", lim); got != int64(admitted) {
		t.Errorf("after shutdown the store counts %d, want exactly the %d admitted", got, admitted)
	}
	if got, want := value(f.m.Lease.ReturnedTokensTotal.WithLabelValues("pol", "hot", metrics.ReturnShutdown)), float64(taken-int64(admitted)); got != want {
		t.Errorf("tokens returned at shutdown = %v, want %v", got, want)
	}
}

// TestColdAndStrictKeysAreNotLeased: a key below the hot rate, and a rule
// with leases off, make one store call per decision.
func TestColdAndStrictKeysAreNotLeased(t *testing.T) {
	t.Parallel()
	clk := newClock()
	f := newLeaseFixture(t, newSharedStore(t, clk), clk)
	cold := f.rule(t, "cold", hourWindow(100000), true, 1, false)
	strict := f.rule(t, "strict", hourWindow(100000), false, 1, false)
	log := f.rule(t, "log", limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 100000, Period: time.Hour}, true, 1, false)
	for range 200 {
		clk.Add(50 * time.Millisecond) // 20/s
		f.decide(Hit{Rule: cold, Key: "c", Cost: 1})
	}
	if got := f.store.leases.Load(); got != 0 {
		t.Errorf("a key at 20/s took %d leases", got)
	}
	for _, r := range []*Rule{strict, log} {
		before := f.store.takes.Load()
		for range 2000 {
			clk.Add(100 * time.Microsecond) // 10000/s
			if v := f.decide(Hit{Rule: r, Key: "s", Cost: 1}); v.Results[0].Source != FromStore {
				t.Fatalf("%s: a decision from %v, want the store", r.Name, v.Results[0].Source)
			}
		}
		if got := f.store.takes.Load() - before; got != 2000 {
			t.Errorf("%s: %d store calls for 2000 decisions, want 2000", r.Name, got)
		}
	}
	if got := f.store.leases.Load(); got != 0 {
		t.Errorf("strict and SlidingLog rules took %d leases", got)
	}
}

// TestLeaseReturnedOnExpiryAndPolicyChange: unused tokens go back when the
// lease expires (the sweep) and when the policy changes.
func TestLeaseReturnedOnExpiryAndPolicyChange(t *testing.T) {
	t.Parallel()
	clk := newClock()
	f := newLeaseFixture(t, newSharedStore(t, clk), clk)
	lim := hourWindow(100000)
	r := f.rule(t, "r", lim, true, 1, false)
	hot := func(n int) {
		for range n {
			clk.Add(200 * time.Microsecond)
			if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome != Allow {
				t.Fatal("denied")
			}
		}
	}
	hot(1000)
	if 100000-f.remaining(t, "k", lim) <= 1000 {
		t.Fatal("no lease is outstanding: the case is not exercised")
	}
	clk.Add(DefaultLeaseTTL)
	f.e.SweepLeases(context.Background())
	if got := 100000 - f.remaining(t, "k", lim); got != 1000 {
		t.Errorf("after the lease expired the store counts %d, want the 1000 admitted", got)
	}
	if value(f.m.Lease.ReturnedTokensTotal.WithLabelValues("pol", "r", metrics.ReturnExpiry)) == 0 {
		t.Error("no tokens returned on expiry")
	}

	hot(1000)
	f.e.ForgetLocalState()
	deadline := time.Now().Add(5 * time.Second)
	for 100000-f.remaining(t, "k", lim) != 2000 {
		if time.Now().After(deadline) {
			t.Fatalf("after a policy change the store counts %d, want the 2000 admitted", 100000-f.remaining(t, "k", lim))
		}
		time.Sleep(time.Millisecond)
	}
	if value(f.m.Lease.ReturnedTokensTotal.WithLabelValues("pol", "r", metrics.ReturnPolicyChange)) == 0 {
		t.Error("no tokens returned on the policy change")
	}
}

// TestLeaseOutlivesTheStore: while the store is away, a sidecar still
// admits against the tokens it holds (they were taken from the shared
// count), then each rule follows its failure mode; the tokens left when
// the lease expires cannot go back and are counted lost.
func TestLeaseOutlivesTheStore(t *testing.T) {
	t.Parallel()
	for _, failClosed := range []bool{false, true} {
		t.Run(fmt.Sprintf("failClosed=%v", failClosed), func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			f := newLeaseFixture(t, newSharedStore(t, clk), clk)
			r := f.rule(t, "r", hourWindow(100000), true, 1, failClosed)
			for range 1000 {
				clk.Add(200 * time.Microsecond)
				f.decide(Hit{Rule: r, Key: "k", Cost: 1})
			}
			f.store.fail.Store(true)
			var fromLease, after int
			var last Source
			for range 500 {
				clk.Add(200 * time.Microsecond)
				v := f.decide(Hit{Rule: r, Key: "k", Cost: 1})
				switch src := v.Results[0].Source; src {
				case FromLease:
					if after > 0 {
						t.Fatalf("a lease hit after the lease ran out")
					}
					fromLease++
				default:
					after++
					last = src
					want := map[bool]Outcome{false: Allow, true: Unavailable}[failClosed]
					if v.Outcome != want {
						t.Fatalf("after the lease: outcome %v from %v, want %v", v.Outcome, src, want)
					}
				}
			}
			if fromLease == 0 || after == 0 {
				t.Fatalf("%d decisions on the lease, %d after it: the case is not exercised", fromLease, after)
			}
			if want := map[bool]Source{false: FromFallback, true: FromNowhere}[failClosed]; last != want {
				t.Errorf("after the lease: decided from %v, want %v", last, want)
			}
			if !f.e.FallbackActive() {
				t.Error("fallback not active while the store is away")
			}
		})
	}
}

// TestLeaseHitsSpendNothingOnADeniedRequest: a request that another rule
// denies spends nothing from a lease, as a denied request spends nothing
// from the store.
func TestLeaseHitsSpendNothingOnADeniedRequest(t *testing.T) {
	t.Parallel()
	clk := newClock()
	f := newLeaseFixture(t, newSharedStore(t, clk), clk)
	lim := hourWindow(100000)
	global := f.rule(t, "global", lim, true, 1, false)
	user := f.rule(t, "user", hourWindow(1), false, 1, false)
	admitted := 0
	for i := range 3000 {
		clk.Add(200 * time.Microsecond)
		// A thousand users make one request each; then one user floods.
		key := fmt.Sprint("u", min(i, 1000))
		v := f.decide(Hit{Rule: global, Key: "all", Cost: 1}, Hit{Rule: user, Key: key, Cost: 1})
		if v.Outcome == Allow {
			admitted++
		}
	}
	if admitted != 1001 {
		t.Fatalf("admitted %d, want 1001 (one per user)", admitted)
	}
	if err := f.e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := 100000 - f.remaining(t, "all", lim); got != int64(admitted) {
		t.Errorf("the global rule counts %d after shutdown, want the %d admitted", got, admitted)
	}
}

// TestLeasesKeepTheTotalExact: four sidecars share one key of 1000/s,
// offered three times that with a 70/10/10/10 split for 30 s: the fleet
// admits at most L*T + burst and at least 98% of L*T, and the store sees
// far fewer calls than decisions.
func TestLeasesKeepTheTotalExact(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := newSharedStore(t, clk)
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1000, Period: time.Second}
	shares := []int{70, 10, 10, 10}
	var fx []*leaseFixture
	var rules []*Rule
	for range shares {
		f := newLeaseFixture(t, store, clk)
		fx = append(fx, f)
		rules = append(rules, f.rule(t, "r", lim, true, 1, false))
	}
	const (
		offered = 3000
		seconds = 30
	)
	admitted := 0
	step := time.Second / offered
	for i := range offered * seconds {
		clk.Add(step)
		s := i % 100
		w := 0
		for acc := shares[0]; s >= acc; acc += shares[w] {
			w++
		}
		if v := fx[w].decide(Hit{Rule: rules[w], Key: "k", Cost: 1}); v.Outcome == Allow {
			admitted++
		}
		if i%(offered/10) == 0 {
			for _, f := range fx {
				f.e.SweepLeases(context.Background())
			}
		}
	}
	lt := int64(1000 * seconds)
	if int64(admitted) > lt+lim.Capacity() || float64(admitted) < 0.98*float64(lt) {
		t.Errorf("admitted %d in %ds at 1000/s (burst 1000): want between %d and %d", admitted, seconds, int64(0.98*float64(lt)), lt+lim.Capacity())
	}
	t.Logf("admitted %d of L*T %d (%.4f), %d store calls for %d decisions", admitted, lt, float64(admitted)/float64(lt), store.calls(), offered*seconds)
}

// TestSplitBorrowsAndStaysExact: a split key admits exactly its limit,
// spread over its sub-counters, borrowing from the others when one is
// spent; without leases every sub-counter gets its share of the calls.
func TestSplitBorrowsAndStaysExact(t *testing.T) {
	t.Parallel()
	for _, lease := range []bool{false, true} {
		t.Run(fmt.Sprintf("lease=%v", lease), func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			f := newLeaseFixture(t, newSharedStore(t, clk), clk)
			lim := hourWindow(3000)
			r := f.rule(t, "r", lim, lease, 3, false)
			admitted := 0
			for range 4000 {
				clk.Add(200 * time.Microsecond)
				v := f.decide(Hit{Rule: r, Key: "k", Cost: 1})
				if v.Outcome == Allow {
					admitted++
					if v.Results[0].Limit != 3000 {
						t.Fatalf("a split rule reports a limit of %d, want the whole 3000", v.Results[0].Limit)
					}
				}
			}
			if admitted != 3000 {
				t.Errorf("admitted %d, want exactly the limit 3000", admitted)
			}
			var calls []float64
			for i := range 3 {
				calls = append(calls, value(f.m.Lease.SplitCallsTotal.WithLabelValues("pol", "r", fmt.Sprint(i))))
				if got := 1000 - f.remaining(t, "k~"+fmt.Sprint(i), limiter.SplitLimit(lim, i, 3)); got != 1000 {
					t.Errorf("sub-counter %d counts %d, want 1000", i, got)
				}
			}
			if !lease {
				for i, c := range calls {
					if c < 1000 || c > 2000 {
						t.Errorf("sub-counter %d got %v calls of %v, want a third or so", i, c, calls)
					}
				}
			}
			if value(f.m.Lease.SplitBorrowsTotal.WithLabelValues("pol", "r")) == 0 {
				t.Error("no borrows once sub-counters ran out")
			}
		})
	}
}

// TestLeaseEndsWithItsWindow: a FixedWindow lease is not spent after its
// window ends, so no window admits more than the limit: light windows end
// with tokens left in the lease, and the heavy windows after them admit
// only their own limit.
func TestLeaseEndsWithItsWindow(t *testing.T) {
	t.Parallel()
	clk := newClock()
	f := newLeaseFixture(t, newSharedStore(t, clk), clk)
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 500, Period: time.Second}
	r := f.rule(t, "r", lim, true, 1, false)
	perWindow := map[int64]int{}
	for w := range 8 {
		step := 5 * time.Millisecond // 200/s: leases of about 10
		if w%2 == 1 {
			step = 250 * time.Microsecond // 4000/s, beyond the limit
		}
		for end := clk.Now().Add(time.Second); clk.Now().Before(end); clk.Add(step) {
			if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome == Allow {
				perWindow[clk.Now().Unix()]++
			}
		}
	}
	for w, n := range perWindow {
		if n > 500 {
			t.Errorf("window %d admitted %d, more than the limit 500", w, n)
		}
	}
	if got := value(f.m.Lease.LostTokensTotal.WithLabelValues("pol", "r")); got == 0 {
		t.Error("no lease tokens lapsed with their window: the case is not exercised")
	}
}

// TestConcurrentLeasesNeverOverAdmit: goroutines deciding one hot key at
// once, on several engines, admit exactly the limit.
func TestConcurrentLeasesNeverOverAdmit(t *testing.T) {
	t.Parallel()
	clk := newClock()
	store := newSharedStore(t, clk)
	lim := hourWindow(5000)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		f := newLeaseFixture(t, store, clk)
		r := f.rule(t, "r", lim, true, 1, false)
		for range 8 {
			wg.Go(func() {
				for range 1000 {
					if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome == Allow {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	if got := admitted.Load(); got != 5000 {
		t.Errorf("admitted %d of 24000, want exactly the limit 5000", got)
	}
}

// slowStore is a memory store that answers every call after delay, as a
// Redis shard on a busy machine does, and counts them. In a synctest
// bubble the delay is on the bubble's clock: exactly delay, however busy
// the machine.
type slowStore struct {
	*memstore.Store
	delay         time.Duration
	takes, leases atomic.Int64
	// leased is set once a lease has been granted; takesLeased counts the
	// takes after that: requests that found no tokens on a hot key.
	leased      atomic.Bool
	takesLeased atomic.Int64
	// settled, when set (before the first call), is when the warm-up is
	// over; takesSettled counts the takes from then on.
	settled      time.Time
	takesSettled atomic.Int64
}

func (s *slowStore) Take(ctx context.Context, req limiter.Request) (limiter.Decision, string, error) {
	s.takes.Add(1)
	if s.leased.Load() {
		s.takesLeased.Add(1)
	}
	if !s.settled.IsZero() && !time.Now().Before(s.settled) {
		s.takesSettled.Add(1)
	}
	time.Sleep(s.delay)
	return s.Store.Take(ctx, req)
}

func (s *slowStore) Lease(ctx context.Context, req limiter.LeaseRequest) (limiter.Lease, string, error) {
	s.leases.Add(1)
	time.Sleep(s.delay)
	l, shard, err := s.Store.Lease(ctx, req)
	if err == nil && l.Granted > 0 {
		s.leased.Store(true)
	}
	return l, shard, err
}

// TestLeaseCoversTheRoundTrip: when the store takes longer to answer than
// a quarter of a lease lasts, the lease is refreshed earlier and made
// larger, so that the requests arriving while the refresh is out still
// find tokens rather than each making a store call of their own.
//
// The run is in a synctest bubble: the store's 25ms, the callers' pauses
// and the engine's clock are the bubble's, so the round trip the engine
// measures and the rate it sees are the ones the test sets, not what a
// busy machine makes of them.
func TestLeaseCoversTheRoundTrip(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ms, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		store := &slowStore{Store: ms, delay: 25 * time.Millisecond}
		fb, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		m := metrics.NewMetrics(prometheus.NewPedanticRegistry())
		e, err := New(Options{Store: store, StoreName: "slow", Fallback: fb, Metrics: m, Parallel: true, Leases: &LeaseOptions{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		r, err := NewRule("pol", "r", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1_000_000_000, Period: time.Hour}, 1, false, false, m)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Spread(true, 1, m); err != nil {
			t.Fatal(err)
		}
		var decisions atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(2 * time.Second)
		// The lease grows to the key's rate over the first few refreshes
		// (a few hundred milliseconds here); by the second half of the
		// run it covers every round trip.
		store.settled = time.Now().Add(time.Second)
		for range 16 {
			wg.Go(func() {
				var v Verdict
				for time.Now().Before(deadline) {
					e.Decide(context.Background(), []Hit{{Rule: r, Key: "k", Cost: 1}}, &v)
					if v.Outcome != Allow {
						t.Errorf("denied: %+v", v.Results[0])
						return
					}
					decisions.Add(1)
					time.Sleep(time.Millisecond)
				}
			})
		}
		wg.Wait()
		// Before the key is found hot, every request takes (the warm-up);
		// once it is leased, the calls are the refreshes, and a request
		// that makes its own call is one the lease did not cover.
		n, calls := decisions.Load(), store.takesLeased.Load()+store.leases.Load()
		if float64(calls) > 0.02*float64(n) {
			t.Errorf("%d store calls once leased (%d takes, %d leases) for %d decisions, want at most 2%%", calls, store.takesLeased.Load(), store.leases.Load(), n)
		}
		if got := store.takesSettled.Load(); got != 0 {
			t.Errorf("%d requests made store calls of their own in the second half of the run, want none: the refresh must land before the lease runs out", got)
		}
		t.Logf("%d store calls once leased (%d takes, %d leases; %d takes in all, %d in the second half) for %d decisions",
			calls, store.takesLeased.Load(), store.leases.Load(), store.takes.Load(), store.takesSettled.Load(), n)
	})
}

// TestLeaseCallsShareTheRequestsBudget: a lease call made for a request,
// plain or on a split sub-counter, carries the request's deadline, as its
// Take would, so a stalled shard costs it one budget from its arrival.
//
// The engine's clock here is the test's, so the deadline is the budget
// from the request's arrival on the wall clock (time.Now in Decide). The
// test reads that clock just before and just after each decision: the
// arrival lies between the two, and so the deadline lies between them plus
// the budget, however late the machine runs the decision. A call that
// carries none, another request's or one set anew at the call is outside.
func TestLeaseCallsShareTheRequestsBudget(t *testing.T) {
	t.Parallel()
	const budget = 50 * time.Millisecond
	for _, split := range []int{1, 3} {
		t.Run(fmt.Sprintf("split=%d", split), func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			store := newSharedStore(t, clk)
			store.budget = budget
			f := newLeaseFixture(t, store, clk)
			r := f.rule(t, "hot", hourWindow(100000), true, split, false)
			outOfBudget := 0
			for i := range 2000 {
				clk.Add(200 * time.Microsecond)
				before := time.Now()
				f.decide(Hit{Rule: r, Key: "k", Cost: 1})
				after := time.Now()
				for _, dl := range store.requestDeadlines() {
					if dl.IsZero() || dl.Before(before.Add(budget)) || dl.After(after.Add(budget)) {
						if outOfBudget == 0 {
							t.Errorf("decision %d: a lease call made for it carries the deadline %v, want the budget from its arrival, in [%v, %v]",
								i, dl, before.Add(budget), after.Add(budget))
						}
						outOfBudget++
					}
				}
			}
			if n := store.requestLeases.Load(); n == 0 {
				t.Fatal("no lease call was made for a request")
			}
			if outOfBudget != 0 {
				t.Errorf("%d of %d lease calls made for requests lack the request's deadline", outOfBudget, store.requestLeases.Load())
			}
		})
	}
}
