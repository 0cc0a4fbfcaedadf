package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// newMemoryEngine is an engine on memory stores, with its metrics.
func newMemoryEngine(t *testing.T) (*engine.Engine, *metrics.Metrics) {
	t.Helper()
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	fb, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewPedanticRegistry())
	e, err := engine.New(engine.Options{Store: ms, Fallback: fb, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return e, m
}

// newRule is engine.NewRule on one replica, enforcing, failing open.
func newRule(t *testing.T, m *metrics.Metrics, name string, l limiter.Limit) *engine.Rule {
	t.Helper()
	r, err := engine.NewRule("pol", name, l, 1, false, false, m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A delaying rule admits a request over its rate with a wait for its
// reserved slot; Await releases it after the wait, gives the slot back
// when the client goes away or the rule's waiting bound is reached, and
// counts each in delayed_total.
func TestAwaitReleasesAbandonsAndBounds(t *testing.T) {
	t.Parallel()
	e, m := newMemoryEngine(t)
	// 10 per second, one at once, queued up to 2s: the emission interval
	// is 100ms.
	const interval = 100 * time.Millisecond
	r := newRule(t, m, "smooth", limiter.Limit{Algorithm: limiter.GCRA, Requests: 10, Period: time.Second, Burst: 1, MaxDelay: 2 * time.Second})
	hits := []engine.Hit{{Rule: r, Key: "k", Cost: 1}}
	decide := func() *engine.Verdict {
		v := &engine.Verdict{}
		e.Decide(context.Background(), hits, v)
		if v.Outcome != engine.Allow {
			t.Fatalf("verdict %v %+v: want Allow, with a wait within maxDelay", v.Outcome, v.Results)
		}
		return v
	}
	released := func() float64 {
		return testutil.ToFloat64(m.DelayedTotal.WithLabelValues("pol", "smooth", metrics.DelayReleased))
	}

	if v := decide(); v.Wait != 0 {
		t.Fatalf("the first request of an idle key waits %v, want 0", v.Wait)
	}
	// The second queues behind the first by about one interval; it is
	// let go no earlier.
	v2 := decide()
	if v2.Wait <= 0 || v2.Wait > interval {
		t.Fatalf("second request's wait %v, want (0, %v]", v2.Wait, interval)
	}
	start := time.Now()
	if got := e.Await(context.Background(), hits, v2, 0, nil); got != engine.Released {
		t.Fatalf("Await = %v, want Released", got)
	}
	if waited := time.Since(start); waited < v2.Wait {
		t.Errorf("released after %v, before its wait of %v", waited, v2.Wait)
	}
	if released() != 1 {
		t.Errorf("delayed_total{released} = %v, want 1", released())
	}

	// A request whose client has gone gives its slot back: the next one
	// waits for the same slot, not the one after it.
	v3 := decide()
	w3 := v3.Wait
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if got := e.Await(gone, hits, v3, 0, nil); got != engine.Abandoned {
		t.Fatalf("Await with its client gone = %v, want Abandoned", got)
	}
	if v4 := decide(); v4.Wait > w3 {
		t.Errorf("after a slot came back, the next request waits %v, more than the abandoned one's %v", v4.Wait, w3)
	} else {
		// v4 holds the slot now; free it for what follows.
		if got := e.Await(context.Background(), hits, v4, 0, nil); got != engine.Released {
			t.Fatalf("Await = %v, want Released", got)
		}
	}
	if got := testutil.ToFloat64(m.DelayedTotal.WithLabelValues("pol", "smooth", metrics.DelayAbandoned)); got != 1 {
		t.Errorf("delayed_total{abandoned} = %v, want 1", got)
	}

	// With one request waiting and a bound of 1, the next is refused and
	// gives its slot back. A rule of 2 a minute: the waiting one's slot
	// is 30s away, so that it still waits, whatever the machine's load,
	// until the test lets it go.
	q := newRule(t, m, "queued", limiter.Limit{Algorithm: limiter.GCRA, Requests: 2, Period: time.Minute, Burst: 1, MaxDelay: time.Minute})
	qhits := []engine.Hit{{Rule: q, Key: "q", Cost: 1}}
	decideQ := func() *engine.Verdict {
		v := &engine.Verdict{}
		e.Decide(context.Background(), qhits, v)
		if v.Outcome != engine.Allow {
			t.Fatalf("queued rule: %v %+v, want Allow", v.Outcome, v.Results)
		}
		return v
	}
	if v := decideQ(); v.Wait != 0 {
		t.Fatalf("queued rule's first request waits %v, want 0", v.Wait)
	}
	v5 := decideQ()
	leave, cancelV5 := context.WithCancel(context.Background())
	defer cancelV5()
	done := make(chan engine.AwaitOutcome, 1)
	go func() { done <- e.Await(leave, qhits, v5, 1, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	for q.Waiting.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the first request never counted as waiting")
		}
		time.Sleep(time.Millisecond)
	}
	if got := testutil.ToFloat64(m.DelayedWaiting.WithLabelValues("pol", "queued")); got != 1 {
		t.Errorf("delayed_waiting = %v while one waits, want 1", got)
	}
	v6 := decideQ()
	w6 := v6.Wait
	if got := e.Await(context.Background(), qhits, v6, 1, nil); got != engine.Overflow {
		t.Fatalf("Await over the bound = %v, want Overflow", got)
	}
	if v7 := decideQ(); v7.Wait > w6 {
		t.Errorf("after an overflow gave its slot back, the next request waits %v, more than the refused one's %v", v7.Wait, w6)
	}
	cancelV5()
	if got := <-done; got != engine.Abandoned {
		t.Errorf("the waiting request, its client gone: %v, want Abandoned", got)
	}
	if got := testutil.ToFloat64(m.DelayedTotal.WithLabelValues("pol", "queued", metrics.DelayOverflow)); got != 1 {
		t.Errorf("delayed_total{overflow} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.DelayedWaiting.WithLabelValues("pol", "queued")); got != 0 {
		t.Errorf("delayed_waiting = %v after every wait ended, want 0", got)
	}

}

// A request past maxDelay is denied with the time until it would be
// admitted within maxDelay, and takes nothing; a rule that delays never
// leases.
func TestDelayPastMaxDelayDenies(t *testing.T) {
	t.Parallel()
	e, m := newMemoryEngine(t)
	r := newRule(t, m, "smooth", limiter.Limit{Algorithm: limiter.GCRA, Requests: 1, Period: time.Minute, Burst: 1, MaxDelay: time.Minute})
	if err := r.Spread(true, 1, m); err != nil {
		t.Fatal(err)
	}
	hits := []engine.Hit{{Rule: r, Key: "k", Cost: 1}}
	var outcomes []engine.Outcome
	var last engine.Verdict
	for range 3 {
		last = engine.Verdict{}
		e.Decide(context.Background(), hits, &last)
		outcomes = append(outcomes, last.Outcome)
	}
	// One at once, one a minute later (within maxDelay), then refused.
	if outcomes[0] != engine.Allow || outcomes[1] != engine.Allow || outcomes[2] != engine.Deny {
		t.Fatalf("outcomes %v, want allow, allow (delayed), deny", outcomes)
	}
	if last.RetryAfter <= 0 || last.RetryAfter > time.Minute {
		t.Errorf("deny RetryAfter %v, want (0, 1m]: until a wait of at most maxDelay", last.RetryAfter)
	}
	// The denial is remembered: the next request is refused without a
	// store call, until then.
	e.Decide(context.Background(), hits, &last)
	if last.Outcome != engine.Deny || last.Results[0].Source != engine.FromDenyCache {
		t.Errorf("the next request: %v from %v, want a deny from the local deny cache", last.Outcome, last.Results[0].Source)
	}
}

// A caller that can only answer yes or no refuses a request that would
// wait, with the wait as its RetryAfter, and the slot goes back.
func TestRefuseDelayedGivesTheSlotBack(t *testing.T) {
	t.Parallel()
	e, m := newMemoryEngine(t)
	r := newRule(t, m, "smooth", limiter.Limit{Algorithm: limiter.GCRA, Requests: 1, Period: time.Minute, Burst: 1, MaxDelay: time.Minute})
	hits := []engine.Hit{{Rule: r, Key: "k", Cost: 1}}
	var v engine.Verdict
	e.Decide(context.Background(), hits, &v)
	if v.Outcome != engine.Allow || v.Wait != 0 {
		t.Fatalf("first: %v wait %v, want allow at once", v.Outcome, v.Wait)
	}
	e.Decide(context.Background(), hits, &v)
	wait := v.Wait
	if v.Outcome != engine.Allow || wait <= 0 {
		t.Fatalf("second: %v wait %v, want allow with a wait", v.Outcome, wait)
	}
	e.RefuseDelayed(context.Background(), hits, &v)
	if v.Outcome != engine.Deny || v.RetryAfter != wait || v.Results[v.Binding].RetryAfter != wait || v.Wait != 0 {
		t.Fatalf("refused: %v retry %v (binding %v) wait %v, want deny with RetryAfter %v", v.Outcome, v.RetryAfter, v.Results[v.Binding].RetryAfter, v.Wait, wait)
	}
	// The slot came back: the next request waits for it, not for the
	// one after (which would be a minute later).
	e.Decide(context.Background(), hits, &v)
	if v.Outcome != engine.Allow || v.Wait > wait || v.Wait < wait-10*time.Second {
		t.Fatalf("after the refusal: %v wait %v, want the refused request's slot, about %v", v.Outcome, v.Wait, wait)
	}
}

// A request that another rule refuses leaves no reservation behind on its
// delaying rule: the next request queues for the same slot.
func TestAnotherRulesDenialReservesNothing(t *testing.T) {
	t.Parallel()
	e, m := newMemoryEngine(t)
	delay := newRule(t, m, "smooth", limiter.Limit{Algorithm: limiter.GCRA, Requests: 10, Period: time.Second, Burst: 1, MaxDelay: time.Minute})
	quota := newRule(t, m, "quota", limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 2, Period: time.Hour})
	both := []engine.Hit{{Rule: delay, Key: "d", Cost: 1}, {Rule: quota, Key: "q", Cost: 1}}
	var v engine.Verdict
	var waits []time.Duration
	for range 2 {
		e.Decide(context.Background(), both, &v)
		if v.Outcome != engine.Allow {
			t.Fatalf("request within the quota: %v", v.Outcome)
		}
		waits = append(waits, v.Wait)
	}
	// The quota is spent: the third is refused by it, and must not keep
	// the slot 200ms out that the delaying rule would give it.
	for range 3 {
		e.Decide(context.Background(), both, &v)
		if v.Outcome != engine.Deny || v.Wait != 0 {
			t.Fatalf("request over the quota: %v wait %v, want deny", v.Outcome, v.Wait)
		}
	}
	alone := []engine.Hit{{Rule: delay, Key: "d", Cost: 1}}
	e.Decide(context.Background(), alone, &v)
	// Its slot is the one after the second request's: 100ms after it,
	// less the time since; had the refusals reserved, 400ms after it.
	if v.Outcome != engine.Allow || v.Wait > waits[1]+100*time.Millisecond {
		t.Fatalf("after the refusals the delaying rule's next slot is %v away, want at most %v (the slot after the second request's): the refused requests reserved slots", v.Wait, waits[1]+100*time.Millisecond)
	}
}
