package engine

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// keyedStore applies the limiter's own math per key at the test clock's
// time: the same arithmetic the stores implement. calls counts Takes.
type keyedStore struct {
	clock *clock
	mu    sync.Mutex
	m     map[string]*limiter.Limiter
	calls atomic.Int64
	// fail, when set, makes every Take fail with ErrUnavailable.
	fail atomic.Bool
	// failPrefix, when set, makes the Takes of keys with this prefix fail
	// with ErrUnavailable: one shard down among several.
	failPrefix atomic.Pointer[string]
	// gate, when non-nil, is waited on by every Take.
	gate chan struct{}
	// deadline is the Deadline of the last Take (Unix ns; 0 for none).
	deadline atomic.Int64
	// shardOf, when set, names the shard Take reports for a key, with
	// its answers and its errors alike.
	shardOf func(key string) string
}

func newKeyedStore(c *clock) *keyedStore {
	return &keyedStore{clock: c, m: map[string]*limiter.Limiter{}}
}

func (s *keyedStore) Take(_ context.Context, req limiter.Request) (limiter.Decision, string, error) {
	shard := ""
	if s.shardOf != nil {
		shard = s.shardOf(req.Key)
	}
	d, err := s.take(req)
	return d, shard, err
}

func (s *keyedStore) take(req limiter.Request) (limiter.Decision, error) {
	if req.Deadline.IsZero() {
		s.deadline.Store(0)
	} else {
		s.deadline.Store(req.Deadline.UnixNano())
	}
	s.calls.Add(1)
	if s.gate != nil {
		<-s.gate
	}
	if p := s.failPrefix.Load(); s.fail.Load() || p != nil && strings.HasPrefix(req.Key, *p) {
		return limiter.Decision{}, fmt.Errorf("dial 127.0.0.1:1: %w", limiter.ErrUnavailable)
	}
	s.mu.Lock()
	l := s.m[req.Key]
	if l == nil {
		var err error
		if l, err = limiter.New(req.Limit); err != nil {
			s.mu.Unlock()
			return limiter.Decision{}, err
		}
		s.m[req.Key] = l
	} else if l.Limit() != req.Limit {
		if err := l.SetLimit(req.Limit); err != nil {
			s.mu.Unlock()
			return limiter.Decision{}, err
		}
	}
	s.mu.Unlock()
	now := time.Now()
	if s.clock != nil {
		now = s.clock.Now()
	}
	return l.AllowN(now, req.Cost)
}

type fixture struct {
	clock    *clock
	store    *keyedStore
	fallback *keyedStore
	m        *metrics.Metrics
	e        *Engine
}

func newFixture(t *testing.T, parallel bool) *fixture {
	t.Helper()
	f := &fixture{clock: &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}}
	f.store, f.fallback = newKeyedStore(f.clock), newKeyedStore(f.clock)
	f.m = metrics.NewMetrics(prometheus.NewPedanticRegistry())
	var err error
	f.e, err = New(Options{Store: f.store, StoreName: "test", Fallback: f.fallback, Metrics: f.m, Parallel: parallel, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) rule(t *testing.T, name string, lim limiter.Limit, replicas int32, failClosed, shadow bool) *Rule {
	t.Helper()
	r, err := NewRule("pol", name, lim, replicas, failClosed, shadow, f.m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *fixture) decide(hits ...Hit) Verdict {
	var v Verdict
	f.e.Decide(context.Background(), hits, &v)
	return v
}

func perMinute(alg limiter.Algorithm, n int64) limiter.Limit {
	return limiter.Limit{Algorithm: alg, Requests: n, Period: time.Minute}
}

func TestExactCountsAndLocalDenials(t *testing.T) {
	t.Parallel()
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.SlidingWindow, limiter.FixedWindow, limiter.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, false)
			r := f.rule(t, "r", perMinute(alg, 5), 1, false, false)
			allowed := 0
			for i := range 50 {
				v := f.decide(Hit{Rule: r, Key: "k", Cost: 1})
				if v.Outcome == Allow {
					allowed++
				} else if v.RetryAfter <= 0 {
					t.Fatalf("request %d: denied with RetryAfter %v", i, v.RetryAfter)
				}
			}
			if got, want := allowed, 5; got != want {
				t.Errorf("allowed %d of 50, want %d", got, want)
			}
			// 5 allowed calls, at most one deny from the store; the rest
			// are local denials.
			if got := f.store.calls.Load(); got > 6 {
				t.Errorf("store calls = %d, want at most 6", got)
			}
			if got, want := value(f.m.DecisionsTotal.WithLabelValues("pol", "r", "allowed")), 5.0; got != want {
				t.Errorf("allowed metric = %v, want %v", got, want)
			}
			if got, want := value(f.m.DecisionsTotal.WithLabelValues("pol", "r", "denied")), 45.0; got != want {
				t.Errorf("denied metric = %v, want %v", got, want)
			}
			if value(f.m.LocalDenialsTotal.WithLabelValues("pol", "r")) < 44 {
				t.Errorf("local denials = %v, want >= 44", value(f.m.LocalDenialsTotal.WithLabelValues("pol", "r")))
			}
			// Two periods later every algorithm admits again.
			f.clock.Add(2 * time.Minute)
			if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome != Allow {
				t.Errorf("after a minute: outcome %v, want allow", v.Outcome)
			}
		})
	}
}

func TestExhaustedKeyIsDeniedLocallyUntilExactlyRefilled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	r := f.rule(t, "r", perMinute(limiter.TokenBucket, 60), 1, false, false) // 1 token/s
	for range 60 {
		if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome != Allow {
			t.Fatal("bucket denied before it was empty")
		}
	}
	calls := f.store.calls.Load()
	v := f.decide(Hit{Rule: r, Key: "k", Cost: 1})
	if v.Outcome != Deny || v.Results[0].Source != FromDenyCache {
		t.Fatalf("empty bucket: %v from %v, want a local deny", v.Outcome, v.Results[0].Source)
	}
	if got := f.store.calls.Load(); got != calls {
		t.Errorf("a local deny called the store")
	}
	if v.RetryAfter <= 0 || v.RetryAfter > time.Second+time.Microsecond {
		t.Errorf("RetryAfter = %v, want (0, 1s] plus at most one tick", v.RetryAfter)
	}
	f.clock.Add(v.RetryAfter)
	if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome != Allow || v.Results[0].Source != FromStore {
		t.Errorf("at the refill instant: %v from %v, want allowed by the store", v.Outcome, v.Results[0].Source)
	}
}

func TestTightestWinsAndDenyingRuleTakesNothing(t *testing.T) {
	t.Parallel()
	for _, parallel := range []bool{false, true} {
		f := newFixture(t, parallel)
		wide := f.rule(t, "wide", perMinute(limiter.FixedWindow, 10), 1, false, false)
		tight := f.rule(t, "tight", perMinute(limiter.FixedWindow, 2), 1, false, false)
		hits := []Hit{{Rule: wide, Key: "w", Cost: 1}, {Rule: tight, Key: "t", Cost: 1}}
		for i := range 2 {
			v := f.decide(hits...)
			if v.Outcome != Allow {
				t.Fatalf("request %d denied", i)
			}
			if got, want := v.Binding, 1; got != want {
				t.Errorf("binding = %d, want the tight rule", got)
			}
		}
		v := f.decide(hits...)
		if v.Outcome != Deny || v.Binding != 1 {
			t.Fatalf("third request: %v binding %d, want deny by the tight rule", v.Outcome, v.Binding)
		}
		// The wide rule was not charged for the denied request.
		d, _, err := f.store.Take(context.Background(), limiter.Request{Key: "w", Limit: wide.Limit, Cost: 0})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := d.Remaining, int64(8); got != want {
			t.Errorf("parallel=%v: wide remaining = %d, want %d", parallel, got, want)
		}
	}
}

func TestShadowCountsButNeverBlocks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	sh := f.rule(t, "shadow", perMinute(limiter.TokenBucket, 2), 1, false, true)
	for i := range 10 {
		v := f.decide(Hit{Rule: sh, Key: "k", Cost: 1})
		if v.Outcome != Allow {
			t.Fatalf("request %d: shadow rule blocked", i)
		}
		if v.Binding != -1 {
			t.Errorf("a shadow rule must not bind the headers")
		}
	}
	if got, want := value(f.m.DecisionsTotal.WithLabelValues("pol", "shadow", "shadow_denied")), 8.0; got != want {
		t.Errorf("shadow_denied = %v, want %v", got, want)
	}
}

func TestFailOpenUsesLocalShare(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	r := f.rule(t, "open", perMinute(limiter.FixedWindow, 10), 4, false, false)
	f.store.fail.Store(true)
	allowed := 0
	// A request a second for 4 minutes: this replica's share of 10 per
	// minute among 4 is 2.5 per minute, 10 in 4 minutes, and it starts
	// empty.
	for range 240 {
		if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome == Allow {
			allowed++
		} else if v.Results[0].Source != FromFallback {
			t.Fatalf("deny from %v, want fallback", v.Results[0].Source)
		}
		f.clock.Add(time.Second)
	}
	if allowed < 9 || allowed > 10 {
		t.Errorf("allowed %d in 4 minutes with the store down, want this replica's share, 10 (9 when its first token falls late)", allowed)
	}
	if !f.e.FallbackActive() || value(f.m.FallbackActive) != 1 {
		t.Errorf("fallback not reported active")
	}
	f.store.fail.Store(false)
	if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome != Allow || v.Results[0].Source != FromStore {
		t.Errorf("store back: %v from %v", v.Outcome, v.Results[0].Source)
	}
	if f.e.FallbackActive() {
		t.Errorf("fallback still active after a good store call")
	}
}

func TestFallbackActiveWhileAnyShardIsDown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	// Two shards, named by the key's first letter; shard b is down.
	f.store.shardOf = func(key string) string { return key[:1] }
	r := f.rule(t, "open", perMinute(limiter.TokenBucket, 1000), 1, false, false)
	down := "b"
	f.store.failPrefix.Store(&down)
	// Calls alternate between a healthy and the dead shard: the dead one's
	// keys fall back, the healthy one's do not, and fallback stays active
	// after every call, not only after those to the dead shard.
	for i := range 10 {
		key := "a-key"
		if i%2 == 1 {
			key = "b-key"
		}
		v := f.decide(Hit{Rule: r, Key: key, Cost: 1})
		wantSource := FromStore
		if key[0] == 'b' {
			wantSource = FromFallback
		}
		if got := v.Results[0].Source; got != wantSource {
			t.Errorf("call %d on %s: source %v, want %v", i, key, got, wantSource)
		}
		if i >= 1 && (!f.e.FallbackActive() || value(f.m.FallbackActive) != 1) {
			t.Errorf("call %d on %s: fallback reported inactive (gauge %v) while shard b is down", i, key, value(f.m.FallbackActive))
		}
	}
	f.store.failPrefix.Store(nil)
	if v := f.decide(Hit{Rule: r, Key: "a-key", Cost: 1}); v.Results[0].Source != FromStore {
		t.Fatalf("healthy shard: source %v", v.Results[0].Source)
	}
	if !f.e.FallbackActive() {
		t.Error("fallback cleared by a call to another shard before shard b answered")
	}
	if v := f.decide(Hit{Rule: r, Key: "b-key", Cost: 1}); v.Results[0].Source != FromStore {
		t.Fatalf("shard b back: source %v", v.Results[0].Source)
	}
	if f.e.FallbackActive() || value(f.m.FallbackActive) != 0 {
		t.Errorf("fallback still active (gauge %v) after every shard answered", value(f.m.FallbackActive))
	}
	// The store calls are counted under the shard the store reported.
	for _, c := range []struct {
		shard, result string
		want          float64
	}{{"a", "ok", 6}, {"b", "ok", 1}, {"b", "unavailable", 5}, {"all", "ok", 0}} {
		if got := value(f.m.StoreOpsTotal.WithLabelValues("test", c.shard, c.result)); got != c.want {
			t.Errorf("store_operations_total{shard=%q,result=%q} = %v, want %v", c.shard, c.result, got, c.want)
		}
	}
}

func TestFallbackEndsWhenADownShardGetsNoMoreCalls(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	// Keys move from shard b to shard c, as when a replica at another
	// address is promoted in place of a failed master.
	var moved atomic.Bool
	f.store.shardOf = func(string) string {
		if moved.Load() {
			return "c"
		}
		return "b"
	}
	r := f.rule(t, "open", perMinute(limiter.TokenBucket, 1000), 1, false, false)
	f.store.fail.Store(true)
	f.decide(Hit{Rule: r, Key: "k", Cost: 1})
	if !f.e.FallbackActive() {
		t.Fatal("fallback not active with shard b down")
	}
	f.store.fail.Store(false)
	moved.Store(true)
	// Calls now succeed on shard c; shard b gets none. It counts as down
	// until fallbackHold has passed since its last failure, and no longer
	// once the next expiry check (every fallbackHold/4) has run after that.
	for elapsed := time.Duration(0); elapsed <= fallbackHold*3/2; elapsed += 250 * time.Millisecond {
		f.decide(Hit{Rule: r, Key: "k", Cost: 1})
		got := f.e.FallbackActive()
		if elapsed < fallbackHold && !got {
			t.Errorf("%v after shard b's last failure: fallback inactive, want active for %v", elapsed, fallbackHold)
		}
		if elapsed > fallbackHold*5/4 && got {
			t.Errorf("%v after shard b's last failure: fallback still active, want it ended by %v", elapsed, fallbackHold*5/4)
		}
		f.clock.Add(250 * time.Millisecond)
	}
	if got := value(f.m.FallbackActive); got != 0 {
		t.Errorf("gauge = %v after the hold, want 0", got)
	}
}

func TestFailClosedIsUnavailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	closed := f.rule(t, "closed", perMinute(limiter.TokenBucket, 10), 1, true, false)
	open := f.rule(t, "open", perMinute(limiter.TokenBucket, 10), 1, false, false)
	f.store.fail.Store(true)
	v := f.decide(Hit{Rule: open, Key: "a", Cost: 1}, Hit{Rule: closed, Key: "b", Cost: 1})
	if v.Outcome != Unavailable || v.Binding != 1 || v.RetryAfter != UnavailableRetryAfter {
		t.Errorf("verdict %+v, want Unavailable bound to the closed rule", v)
	}
	f.store.fail.Store(false)
	f.fallback.fail.Store(false)
	d, _, err := f.fallback.Take(context.Background(), limiter.Request{Key: "a", Limit: open.Fallback})
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != open.Fallback.Capacity() {
		t.Errorf("fallback bucket of the open rule has %d remaining, want it uncharged (%d)", d.Remaining, open.Fallback.Capacity())
	}
}

func TestProbeGatesConcurrentRequests(t *testing.T) {
	t.Parallel()
	// In a synctest bubble, Wait returns once every request is blocked:
	// the probe at the store, the others behind it.
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, true)
		r := f.rule(t, "r", perMinute(limiter.FixedWindow, 3), 1, false, false)
		for range 4 {
			f.decide(Hit{Rule: r, Key: "k", Cost: 1})
		}
		// Next window: the deny entry has expired.
		f.clock.Add(time.Minute)
		before := f.store.calls.Load()
		f.store.gate = make(chan struct{})
		var wg sync.WaitGroup
		var allowed atomic.Int64
		for range 8 {
			wg.Go(func() {
				if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome == Allow {
					allowed.Add(1)
				}
			})
		}
		synctest.Wait()
		// Only the probe reaches the store while it is in flight.
		if got := f.store.calls.Load() - before; got != 1 {
			t.Errorf("%d store calls with every request in, the probe still in flight, want 1", got)
		}
		close(f.store.gate)
		wg.Wait()
		if got, want := allowed.Load(), int64(3); got != want {
			t.Errorf("allowed %d in the new window, want %d", got, want)
		}
	})
}

// TestWaitersShareAFailedProbe holds the probe of an exhausted key in
// flight while 8 more requests arrive, then fails it: the waiters decide
// on their fallback buckets at once, on the probe's outcome, instead of
// sending store calls of their own one after the other (each of which
// would wait its own deadline on a stalled shard).
func TestWaitersShareAFailedProbe(t *testing.T) {
	t.Parallel()
	for _, failClosed := range []bool{false, true} {
		t.Run(fmt.Sprintf("failClosed=%v", failClosed), func(t *testing.T) {
			t.Parallel()
			// In a synctest bubble, Wait returns once the 9 requests are
			// blocked: the probe at the store, the other 8 behind it.
			synctest.Test(t, func(t *testing.T) {
				f := newFixture(t, true)
				r := f.rule(t, "r", perMinute(limiter.FixedWindow, 3), 2, failClosed, false)
				for range 4 {
					f.decide(Hit{Rule: r, Key: "k", Cost: 1})
				}
				f.clock.Add(time.Minute) // the deny entry has expired: the next request probes
				before, fbBefore := f.store.calls.Load(), f.fallback.calls.Load()
				f.store.gate = make(chan struct{})
				f.store.fail.Store(true)
				var wg sync.WaitGroup
				var mu sync.Mutex
				got := map[string]int{}
				for range 9 {
					wg.Go(func() {
						v := f.decide(Hit{Rule: r, Key: "k", Cost: 1})
						mu.Lock()
						got[v.Outcome.String()+"/"+v.Results[0].Source.String()]++
						mu.Unlock()
					})
				}
				synctest.Wait() // the other 8 queue behind the probe
				if n := f.store.calls.Load() - before; n != 1 {
					t.Errorf("%d store calls with the 9 requests in, want the probe's alone", n)
				}
				close(f.store.gate)
				wg.Wait()
				if n := f.store.calls.Load() - before; n != 1 {
					t.Errorf("%d store calls, want 1: the waiters must share the probe's failure", n)
				}
				if failClosed {
					if got["unavailable/unavailable"] != 9 {
						t.Errorf("outcomes %v, want all 9 unavailable", got)
					}
					if n := f.fallback.calls.Load() - fbBefore; n != 0 {
						t.Errorf("%d fallback calls for a fail-closed rule", n)
					}
					return
				}
				// The fallback decides on this replica's share of the limit, and
				// a key it has not seen starts with nothing to spend (so that
				// an outage adds no burst to what the fleet admits): all 9 are
				// denied there, none by a store call.
				if got["deny/fallback"] != 9 {
					t.Errorf("outcomes %v, want 9 deny, all from the fallback bucket", got)
				}
			})
		})
	}
}

// TestWaitersWaitOneBudget holds the probe of an exhausted key in flight
// and never answers it (a stalled shard whose calls the store does not time
// out): with a Budget, the requests waiting behind the probe stop waiting
// at their own deadline, one budget after each arrived, and fall back,
// while the probe is still out. The probe's call carries the decision's
// deadline, one budget from its arrival, for the store to end it by.
func TestWaitersWaitOneBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	const budget = 30 * time.Millisecond
	var err error
	f.e, err = New(Options{Store: f.store, StoreName: "test", Fallback: f.fallback, Metrics: f.m, Parallel: true, Now: f.clock.Now, Budget: budget})
	if err != nil {
		t.Fatal(err)
	}
	r := f.rule(t, "r", perMinute(limiter.FixedWindow, 3), 1, false, false)
	for range 4 {
		f.decide(Hit{Rule: r, Key: "k", Cost: 1})
	}
	f.clock.Add(time.Minute) // the deny entry has expired: the next request probes
	before := f.store.calls.Load()
	f.store.gate = make(chan struct{})
	probeDone := make(chan struct{})
	sent := time.Now()
	go func() {
		defer close(probeDone)
		f.decide(Hit{Rule: r, Key: "k", Cost: 1})
	}()
	for f.store.calls.Load() == before {
		time.Sleep(time.Millisecond)
	}
	if d := time.Unix(0, f.store.deadline.Load()); d.Before(sent.Add(budget)) || d.After(time.Now().Add(budget)) {
		t.Errorf("the probe's call carries the deadline %v after the request was sent; want the budget %v from its arrival", d.Sub(sent), budget)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	for range 8 {
		wg.Go(func() {
			start := time.Now()
			v := f.decide(Hit{Rule: r, Key: "k", Cost: 1})
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			got[v.Outcome.String()+"/"+v.Results[0].Source.String()]++
			if took < budget {
				t.Errorf("a waiter returned after %v, before its budget %v, with the probe still out", took, budget)
			}
		})
	}
	wg.Wait() // the waiters are back while the probe is still held
	select {
	case <-probeDone:
		t.Fatal("the probe returned without an answer")
	default:
	}
	if n := f.store.calls.Load() - before; n != 1 {
		t.Errorf("%d store calls, want 1: a waiter whose budget ran out must fall back, not call", n)
	}
	if got["allow/fallback"]+got["deny/fallback"] != 8 {
		t.Errorf("outcomes %v, want 8 decided by the fallback bucket", got)
	}
	close(f.store.gate)
	<-probeDone
}

func TestFloodCostsAboutOneStoreCallPerAdmission(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	st := newKeyedStore(c)
	m := metrics.NewMetrics(prometheus.NewRegistry())
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: time.Second}
	// Three sidecars share the store; each sees 1000 requests per second
	// on one key: 300 times the limit.
	var engines []*Engine
	var rules []*Rule
	for range 3 {
		e, err := New(Options{Store: st, Fallback: newKeyedStore(c), Metrics: m, Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewRule("p", "r", lim, 1, false, false, m)
		if err != nil {
			t.Fatal(err)
		}
		engines, rules = append(engines, e), append(rules, r)
	}
	const seconds = 20
	allowed := 0
	// Which replica's request reaches the store first varies at random,
	// as it does between real replicas.
	rng := rand.New(rand.NewPCG(1, 2))
	order := []int{0, 1, 2}
	for range seconds * 1000 {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			var v Verdict
			engines[i].Decide(context.Background(), []Hit{{Rule: rules[i], Key: "k", Cost: 1}}, &v)
			if v.Outcome == Allow {
				allowed++
			}
		}
		c.Add(time.Millisecond)
	}
	// The bucket starts full (10) and refills 10 per second.
	if want := 10 + 10*seconds; allowed > want || allowed < want-10 {
		t.Errorf("allowed %d, want about %d and never more", allowed, want)
	}
	calls := st.calls.Load()
	if bound := 1.1*float64(allowed) + float64(len(engines)*seconds); float64(calls) > bound {
		t.Errorf("%d store calls for %d admissions, want at most %.0f", calls, allowed, bound)
	}
	t.Logf("%d admissions, %d store calls", allowed, calls)
}

// value reads a counter or gauge.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// Concurrent first store calls on new shards resolve one set of metrics
// per shard, each labelled with its shard.
func TestShardMetricsConcurrent(t *testing.T) {
	t.Parallel()
	st, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.NewMetrics(reg)
	e, err := New(Options{Store: st, StoreName: "redis", Fallback: st, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	shards := []string{"a:1", "b:2", "c:3", "d:4"}
	got := make([][]*shardMetrics, 8)
	var wg sync.WaitGroup
	for g := range got {
		wg.Go(func() {
			for _, s := range shards {
				got[g] = append(got[g], e.shardMetrics(s))
			}
		})
	}
	wg.Wait()
	for g := range got {
		for i := range shards {
			if got[g][i] != got[0][i] {
				t.Fatalf("goroutine %d got other metrics for shard %s than goroutine 0", g, shards[i])
			}
		}
	}
	for i, s := range shards {
		got[0][i].ok.Inc()
		var out dto.Metric
		if err := m.StoreOpsTotal.WithLabelValues("redis", s, "ok").Write(&out); err != nil {
			t.Fatal(err)
		}
		if v := out.GetCounter().GetValue(); v != 1 {
			t.Errorf("store_operations_total{shard=%q,result=ok} = %v, want 1", s, v)
		}
	}
}

// TestStoreShardTransitionsAreLogged: an operator learns why the store
// fails (the error, such as a certificate the CA bundle does not vouch
// for) once when a shard starts failing, not once per request, and when
// it answers again.
func TestStoreShardTransitionsAreLogged(t *testing.T) {
	t.Parallel()
	// The engine is not Parallel: it logs on the deciding goroutine,
	// which is the test's.
	var buf bytes.Buffer
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	store, fb := newKeyedStore(clk), newKeyedStore(clk)
	m := metrics.NewMetrics(prometheus.NewPedanticRegistry())
	e, err := New(Options{Store: store, StoreName: "redis", Fallback: fb, Metrics: m, Now: clk.Now,
		Log: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRule("pol", "r", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1000, Period: time.Second}, 1, false, false, m)
	if err != nil {
		t.Fatal(err)
	}
	decide := func(n int) {
		for i := range n {
			clk.Add(time.Millisecond)
			var v Verdict
			e.Decide(context.Background(), []Hit{{Rule: r, Key: fmt.Sprint("k", i), Cost: 1}}, &v)
		}
	}
	store.fail.Store(true)
	decide(50)
	store.fail.Store(false)
	decide(5)
	out := buf.String()
	if n := strings.Count(out, "a store shard fails"); n != 1 || !strings.Contains(out, "127.0.0.1:1") || !strings.Contains(out, "store=redis") {
		t.Errorf("%d warnings for 50 failed calls, want one naming the store and the error:\n%s", n, out)
	}
	if n := strings.Count(out, "the store shard answers again"); n != 1 {
		t.Errorf("%d recovery notes, want one:\n%s", n, out)
	}
	// Within the interval a flapping shard logs nothing more.
	store.fail.Store(true)
	decide(5)
	if n := strings.Count(buf.String(), "a store shard fails"); n != 1 {
		t.Errorf("a failure within %v of the last warning logged another:\n%s", shardLogInterval, buf.String())
	}
	// After it, a new failure is logged again.
	clk.Add(shardLogInterval)
	store.fail.Store(false)
	decide(1)
	store.fail.Store(true)
	decide(1)
	if n := strings.Count(buf.String(), "a store shard fails"); n != 2 {
		t.Errorf("%d warnings after the interval, want 2:\n%s", n, buf.String())
	}
}
