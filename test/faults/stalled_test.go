package faults

import (
	"sync"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestStalledShardCostsOneBudget is the stalled shard as a new user tried
// it: 4 sidecars at 500 requests per second each on a key over its limit,
// whose master is stopped (SIGSTOP) for 5 seconds. The deny cache lets one
// request per sidecar ask Redis while the others wait for its answer; when
// that call times out, the waiters share its failure and fall back at
// once; the first call that times out opens the shard's breaker, so the
// calls after it fail fast until a probe is answered; and a request's
// waits and calls share one deadline set at its arrival. So no request
// waits more than one call budget from its arrival (plus a few ms, plus
// what the shared machine itself delayed goroutines by around it, measured
// in the same run by sleepers that owe nothing to floodgate). Before, each
// waiter in turn sent a call of its own and waited its own budget, until
// the breaker opened: up to five budgets.
func TestStalledShardCostsOneBudget(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{Masters: 3, NodeTimeout: 30 * time.Second, PartialCoverage: true})
	ctx := t.Context()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := masters[0]
	key := keyOn(t, c, victim, "hot")
	const (
		sidecars = 4
		rate     = 500 // per sidecar per second
		budget   = redisstore.DefaultTimeout
		few      = 5 * time.Millisecond
	)
	// A real limit, far below the offered 2000/s: the key is over it, so
	// the deny cache gates it with probes.
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 200, Period: time.Second, Burst: 50}
	fleet, rules := newFleet(t, c, "stalled", sidecars, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow}, lim)
	warmUp(t, fleet, rules, key)

	rec := &record{}
	stop := make(chan struct{})
	n := startProbe()
	wg := drive(ctx, fleet, rules, key, rate, rec, stop)
	halt := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
		n.End()
	})
	defer halt()
	time.Sleep(2 * time.Second)
	if err := c.Pause(victim); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	time.Sleep(5 * time.Second)
	if err := c.Resume(victim); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	// The store answers again: wait until every sidecar has decided from
	// it (or from the deny cache it fills) again, then run on a while, so
	// that the end of the run is the store at work.
	if !waitUntil(30*time.Second, func() bool { return rec.storeAgain(sidecars, resumed) }) {
		t.Errorf("not every sidecar decided from the store again within 30s of SIGCONT: %v", counts(rec.all()))
	}
	time.Sleep(max(time.Until(resumed.Add(2*time.Second)), time.Second))
	halt()
	ds := rec.all()
	var during []decision
	for _, d := range ds {
		if !d.at.Before(paused) && d.at.Before(resumed) {
			during = append(during, d)
		}
	}
	// Each request's wait is measured from its arrival (the Decide call)
	// to its answer. The bound is one call budget plus a few ms; what the
	// shared machine itself delayed this process by meanwhile is measured
	// in the same run by independent probes (test/lateness) and stated,
	// per decision and over the run. A request's wait ends on a timer of
	// its own (its store call's, or its deadline in the deny cache), which
	// the machine delays as it delays the probes'; a wait of floodgate's
	// own making (a second call budget) is not excused by them, the probes
	// not being late then.
	bound := budget + few
	over100, overBound := 0, 0
	var worstExcess time.Duration
	for _, d := range during {
		if d.took > 100*time.Millisecond {
			over100++
		}
	}
	reported := 0
	for _, d := range ds {
		late := n.Excuse(d.at, d.took)
		if d.took > bound {
			overBound++
		}
		if excess := d.took - bound - late; excess > 0 {
			around := n.During(d.at.Add(-10*time.Millisecond), d.at.Add(d.took))
			worstExcess = max(worstExcess, excess)
			if reported++; reported <= 10 {
				t.Errorf("sidecar %d: a decision at %+v from the stop waited %v from its arrival (%s; %v): more than one call budget (%v) + %v, and the machine's lateness around it (sleepers' timers %v + the longest run-queue wait of a goroutine %v or a thread's waits for a CPU %v) excuses only %v",
					d.sidecar, d.at.Sub(paused).Round(time.Millisecond), d.took, d.story(), counts([]decision{d}), budget, few,
					around.Timer, around.Goroutine, around.Held, late)
			}
		}
	}
	if reported > 10 {
		t.Errorf("%d more decisions over the bound; the worst by %v", reported-10, worstExcess)
	}
	var storeCalls, budgetCalls int
	for _, sc := range fleet {
		for _, c := range sc.calls.between(paused, resumed) {
			storeCalls++
			if c.took >= budget {
				budgetCalls++
			}
		}
	}
	t.Logf("%d decisions while the master was stopped (%v): max %v, p99 %v, p50 %v, %d over 100ms; %v",
		len(during), resumed.Sub(paused).Round(time.Millisecond), maxTook(during), percentile(during, .99), percentile(during, .5), over100, counts(during))
	w := n.Worst()
	t.Logf("bound: budget %v + %v = %v from each request's arrival, plus the machine's lateness around it (worst over the run: sleepers' timers %v, run-queue wait of a goroutine %v, of a thread %v); %d decisions of the run took longer than %v, %d longer than the bound and the lateness around them (worst by %v); %d store calls while stopped, %d of them waited out their budget",
		budget, few, bound, w.Timer, w.Goroutine, w.Thread, overBound, bound, reported, worstExcess, storeCalls, budgetCalls)
	// The load ran: the drivers sent what their schedules asked for over
	// the stop, less the spans the machine held them past (which they
	// skip rather than burst to catch up).
	var scheduled time.Duration
	for i := range sidecars {
		scheduled += rec.scheduled(i, paused, resumed)
	}
	want := rate * scheduled.Seconds()
	total := sidecars * resumed.Sub(paused)
	t.Logf("the drivers kept to their schedules for %v of their %v over the stop (the machine held them past the rest): %.0f requests due, %d decided",
		scheduled.Round(time.Millisecond), total.Round(time.Millisecond), want, len(during))
	if scheduled < time.Second {
		t.Fatalf("the machine held the drivers past all but %v of their %v over the stop: too little load ran to test it",
			scheduled.Round(time.Millisecond), total.Round(time.Millisecond))
	}
	if float64(len(during)) < 0.8*want {
		t.Fatalf("only %d decisions while stopped, of the %.0f the drivers' schedules asked for: the load did not run", len(during), want)
	}
	// The store answered again after SIGCONT, and still did at the end:
	// the last decisions (half a second's worth, at the drivers' rate)
	// came after every sidecar had decided from it again.
	if got := counts(ds[max(0, len(ds)-sidecars*rate/2):]); got["allow/store"]+got["deny/store"]+got["deny/local"] == 0 {
		t.Errorf("no store or deny-cache decision among the last %d: %v", sidecars*rate/2, got)
	}
}
