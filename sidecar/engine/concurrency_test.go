package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// slotStore is a memory store whose slot calls can be made to fail as an
// unreachable Redis shard does, and that counts them.
type slotStore struct {
	*memstore.Store
	fail                       atomic.Bool
	acquires, renews, releases atomic.Int64
}

func newSlotStore(t *testing.T) *slotStore {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	return &slotStore{Store: s}
}

func (s *slotStore) Acquire(ctx context.Context, req limiter.SlotRequest) (limiter.SlotDecision, string, error) {
	s.acquires.Add(1)
	if s.fail.Load() {
		return limiter.SlotDecision{}, "shard-a", fmt.Errorf("dial 127.0.0.1:1: %w", limiter.ErrUnavailable)
	}
	return s.Store.Acquire(ctx, req)
}

func (s *slotStore) Renew(ctx context.Context, req limiter.SlotRequest) (bool, string, error) {
	s.renews.Add(1)
	if s.fail.Load() {
		return false, "shard-a", fmt.Errorf("dial 127.0.0.1:1: %w", limiter.ErrUnavailable)
	}
	return s.Store.Renew(ctx, req)
}

func (s *slotStore) Release(ctx context.Context, req limiter.SlotRequest) (string, error) {
	s.releases.Add(1)
	if s.fail.Load() {
		return "shard-a", fmt.Errorf("dial 127.0.0.1:1: %w", limiter.ErrUnavailable)
	}
	return s.Store.Release(ctx, req)
}

type slotFixture struct {
	store, fallback *slotStore
	m               *metrics.Metrics
	e               *Engine
}

func newSlotFixture(t *testing.T) *slotFixture {
	t.Helper()
	f := &slotFixture{store: newSlotStore(t), fallback: newSlotStore(t), m: metrics.NewMetrics(prometheus.NewPedanticRegistry())}
	var err error
	if f.e, err = New(Options{Store: f.store, StoreName: "test", Fallback: f.fallback, Metrics: f.m}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *slotFixture) rule(t *testing.T, name string, maxN int64, replicas int32, failClosed, shadow bool) *ConcurrencyRule {
	t.Helper()
	r, err := NewConcurrencyRule("pol", name, maxN, 10*time.Second, replicas, failClosed, shadow, f.m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *slotFixture) acquire(hits ...SlotHit) *SlotVerdict {
	v := &SlotVerdict{}
	f.e.Acquire(context.Background(), hits, v)
	return v
}

func TestConcurrencyCapsAndReleases(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t)
	r := f.rule(t, "cap", 3, 1, false, false)
	var held []*SlotVerdict
	for i := range 3 {
		v := f.acquire(SlotHit{Rule: r, Key: "k"})
		if v.Outcome != Allow || v.Held.Len() != 1 || !v.Results[0].Acquired || v.Results[0].InFlight != int64(i+1) {
			t.Fatalf("request %d: %v %+v, want allowed holding one slot, %d in flight", i, v.Outcome, v.Results[0], i+1)
		}
		held = append(held, v)
	}
	v := f.acquire(SlotHit{Rule: r, Key: "k"})
	if v.Outcome != Deny || v.Binding != 0 || v.RetryAfter != ConcurrencyRetryAfter || v.Held.Len() != 0 {
		t.Fatalf("fourth request: %v binding %d retry %v holding %d; want Deny on hit 0 with Retry-After %v, holding nothing",
			v.Outcome, v.Binding, v.RetryAfter, v.Held.Len(), ConcurrencyRetryAfter)
	}
	if v := f.acquire(SlotHit{Rule: r, Key: "other"}); v.Outcome != Allow {
		t.Fatalf("another key: %v, want Allow (the cap is per key)", v.Outcome)
	}
	if got := value(r.inFlight); got != 4 {
		t.Errorf("in-flight gauge = %v, want 4", got)
	}
	held[0].Held.Release()
	held[0].Held.Release() // a second release does nothing
	if v := f.acquire(SlotHit{Rule: r, Key: "k"}); v.Outcome != Allow || v.Results[0].InFlight != 3 {
		t.Fatalf("after a release: %v %+v, want Allow with 3 in flight", v.Outcome, v.Results[0])
	}
	if got, want := value(r.m.Allowed), 5.0; got != want {
		t.Errorf("allowed = %v, want %v", got, want)
	}
	if got, want := value(r.m.Denied), 1.0; got != want {
		t.Errorf("denied = %v, want %v", got, want)
	}
}

// A request that one rule denies holds nothing on the others.
func TestConcurrencyDenyReleasesTheOtherRules(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t)
	wide, narrow := f.rule(t, "wide", 10, 1, false, false), f.rule(t, "narrow", 1, 1, false, false)
	first := f.acquire(SlotHit{Rule: wide, Key: "w"}, SlotHit{Rule: narrow, Key: "n"})
	if first.Outcome != Allow || first.Held.Len() != 2 {
		t.Fatalf("first: %v holding %d, want Allow holding 2", first.Outcome, first.Held.Len())
	}
	v := f.acquire(SlotHit{Rule: wide, Key: "w"}, SlotHit{Rule: narrow, Key: "n"})
	if v.Outcome != Deny || v.Binding != 1 || v.Held.Len() != 0 {
		t.Fatalf("second: %v binding %d holding %d, want Deny on the narrow rule holding nothing", v.Outcome, v.Binding, v.Held.Len())
	}
	if got := value(wide.inFlight); got != 1 {
		t.Errorf("wide in flight = %v, want 1: the denied request's slot was released", got)
	}
	d, _, err := f.store.Store.Acquire(context.Background(), limiter.SlotRequest{Key: "w", Lease: 1 << 40, Max: 10, TTL: time.Second})
	if err != nil || d.InFlight != 2 {
		t.Errorf("the store holds %d leases on the wide key (%v), want 2: the first request's and this one", d.InFlight, err)
	}
}

func TestConcurrencyShadowNeverDenies(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t)
	r := f.rule(t, "shadow", 1, 1, false, true)
	a, b := f.acquire(SlotHit{Rule: r, Key: "k"}), f.acquire(SlotHit{Rule: r, Key: "k"})
	if a.Outcome != Allow || b.Outcome != Allow || a.Held.Len() != 1 || b.Held.Len() != 0 || b.Results[0].Acquired {
		t.Fatalf("shadow: %v/%d and %v/%d %+v; want both allowed, the second holding nothing", a.Outcome, a.Held.Len(), b.Outcome, b.Held.Len(), b.Results[0])
	}
	if got := value(r.m.ShadowDenied); got != 1 {
		t.Errorf("shadow_denied = %v, want 1", got)
	}
}

// While the store is down a fail-open rule holds its local share (max /
// replicas) and a fail-closed one makes the request Unavailable; the
// leases taken on the fallback go back to it.
func TestConcurrencyFailureModes(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t)
	open, closed := f.rule(t, "open", 10, 4, false, false), f.rule(t, "closed", 10, 4, true, false)
	if open.Fallback != 2 {
		t.Fatalf("fallback share of 10 over 4 replicas = %d, want 2", open.Fallback)
	}
	f.store.fail.Store(true)
	var held []*SlotVerdict
	for i := range 2 {
		v := f.acquire(SlotHit{Rule: open, Key: "k"})
		if v.Outcome != Allow || v.Results[0].Source != FromFallback {
			t.Fatalf("request %d on the fallback: %v %+v, want Allow from the fallback", i, v.Outcome, v.Results[0])
		}
		held = append(held, v)
	}
	if v := f.acquire(SlotHit{Rule: open, Key: "k"}); v.Outcome != Deny || v.Results[0].Source != FromFallback {
		t.Fatalf("third request on the fallback: %v %+v, want Deny: the local share is 2", v.Outcome, v.Results[0])
	}
	if !f.e.FallbackActive() {
		t.Error("FallbackActive() = false while the store fails")
	}
	v := f.acquire(SlotHit{Rule: closed, Key: "k"})
	if v.Outcome != Unavailable || v.Results[0].Source != FromNowhere || v.RetryAfter != UnavailableRetryAfter {
		t.Fatalf("fail-closed rule: %v %+v retry %v, want Unavailable", v.Outcome, v.Results[0], v.RetryAfter)
	}
	before := f.fallback.releases.Load()
	for _, v := range held {
		v.Held.Release()
	}
	if got := f.fallback.releases.Load() - before; got != 2 {
		t.Errorf("%d releases reached the fallback, want 2", got)
	}
	if got := f.store.releases.Load(); got != 0 {
		t.Errorf("%d releases went to the store that did not issue the leases", got)
	}
	if got, want := value(open.m.FallbackAllowed), 2.0; got != want {
		t.Errorf("fallback allowed = %v, want %v", got, want)
	}
}

// A request that outlives its lease TTL keeps its slot: the lease is
// renewed every third of the TTL until the request ends.
//
// The renewal timers and the store's TTL run in a synctest bubble, on its
// clock: a timer fires when it is due, however busy the machine, so the
// test sees the renewals the engine schedules rather than how late the
// machine runs them.
func TestConcurrencyLeaseRenewal(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newSlotFixture(t)
		const ttl = 300 * time.Millisecond
		r, err := NewConcurrencyRule("pol", "stream", 1, ttl, 1, false, false, f.m)
		if err != nil {
			t.Fatal(err)
		}
		long := f.acquire(SlotHit{Rule: r, Key: "k"})
		if long.Outcome != Allow {
			t.Fatalf("first: %v", long.Outcome)
		}
		start := time.Now()
		for time.Since(start) < 5*ttl {
			if v := f.acquire(SlotHit{Rule: r, Key: "k"}); v.Outcome != Deny {
				t.Fatalf("another request got the slot of a request still in flight after %v (renewals %d)",
					time.Since(start), f.store.renews.Load())
			}
			time.Sleep(ttl / 9)
		}
		// One renewal per third of a TTL: 15 in 5 TTLs.
		if n := f.store.renews.Load(); n != 15 {
			t.Errorf("%d renewals over 5 TTLs, want 15 (one per third of a TTL)", n)
		}
		if got := value(r.renewals[0]); got != 15 {
			t.Errorf("renewed = %v, want 15", got)
		}
		long.Held.Release()
		renews := f.store.renews.Load()
		time.Sleep(ttl)
		if got := f.store.renews.Load(); got != renews {
			t.Errorf("%d renewals after the release, want none", got-renews)
		}
		if v := f.acquire(SlotHit{Rule: r, Key: "k"}); v.Outcome != Allow {
			t.Errorf("after the release: %v, want Allow", v.Outcome)
		}
	})
}

func TestNewConcurrencyRuleRejectsBadInput(t *testing.T) {
	t.Parallel()
	m := metrics.NewMetrics(prometheus.NewPedanticRegistry())
	for _, tc := range []struct {
		maxN int64
		ttl  time.Duration
	}{{0, time.Second}, {limiter.MaxSlots + 1, time.Second}, {1, 0}, {1, 2 * time.Hour}} {
		if _, err := NewConcurrencyRule("p", "r", tc.maxN, tc.ttl, 1, false, false, m); err == nil {
			t.Errorf("NewConcurrencyRule(max %d, ttl %v) succeeded, want an error", tc.maxN, tc.ttl)
		}
	}
	if _, err := NewConcurrencyRule("p", "r", 1, time.Second, 1, false, false, nil); err == nil {
		t.Error("NewConcurrencyRule with nil metrics succeeded")
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	st, err := memstore.New()
	if err != nil {
		b.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	e, err := New(Options{Store: st, Fallback: st, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	r, err := NewConcurrencyRule("p", "r", 1<<10, 10*time.Second, 1, false, false, m)
	if err != nil {
		b.Fatal(err)
	}
	hits := []SlotHit{{Rule: r, Key: "p:r:k"}}
	var v SlotVerdict
	b.ReportAllocs()
	for b.Loop() {
		e.Acquire(context.Background(), hits, &v)
		v.Held.Release()
	}
}
