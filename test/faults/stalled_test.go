package faults

import (
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
// once, so no request waits more than one call budget (plus a few ms, plus
// what the shared machine itself delays goroutines by, measured over the
// same run, or what it delayed the timer of the store call the request
// waited for). Before, each waiter in turn sent a call of its own and waited
// its own budget, until the breaker opened: up to five budgets.
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
	n := startNoise()
	wg := drive(ctx, fleet, rules, key, rate, rec, stop)
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
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	n.end()

	ds := rec.all()
	var during []decision
	for _, d := range ds {
		if !d.at.Before(paused) && d.at.Before(resumed) {
			during = append(during, d)
		}
	}
	bound := budget + few
	over100, excused := 0, 0
	var worstExcess time.Duration
	for _, d := range during {
		if d.took > 100*time.Millisecond {
			over100++
		}
	}
	// A store call fails at its deadline when its timer fires; on a
	// machine this busy the runtime fires it late at times (the slip),
	// which is the machine's and not the engine's: a request waits for at
	// most the one call it shares, slip included.
	var worstSlip time.Duration
	for _, sc := range fleet {
		for _, c := range sc.calls.between(paused, resumed) {
			worstSlip = max(worstSlip, c.took-budget)
		}
	}
	for _, d := range ds {
		late := n.excuse(d.at, d.took)
		if d.took > bound {
			excused++
		}
		end := d.at.Add(d.took)
		var slip time.Duration
		for _, c := range fleet[d.sidecar].calls.between(d.at.Add(-budget-time.Second), end) {
			if cEnd := c.at.Add(c.took); !cEnd.Before(d.at) && !cEnd.After(end.Add(time.Millisecond)) {
				slip = max(slip, c.took-budget)
			}
		}
		if excess := d.took - bound - max(late, slip); excess > 0 {
			worstExcess = max(worstExcess, excess)
			t.Errorf("sidecar %d: a decision at %+v took %v: more than one call budget (%v) + %v, and the machine's delays around it excuse only %v (goroutines) or %v (the store call it waited for, past its deadline)",
				d.sidecar, d.at.Sub(paused).Round(time.Millisecond), d.took, budget, few, late, slip)
		}
	}
	t.Logf("%d decisions while the master was stopped (%v): max %v, p99 %v, p50 %v, %d over 100ms; %v",
		len(during), resumed.Sub(paused).Round(time.Millisecond), maxTook(during), percentile(during, .99), percentile(during, .5), over100, counts(during))
	t.Logf("bound: budget %v + %v = %v, plus the machine's lateness during each decision (worst over the run %v; store calls failed up to %v past their deadline); %d decisions took longer than %v",
		budget, few, bound, n.worst(), worstSlip, excused, bound)
	if len(during) < sidecars*rate*4 {
		t.Fatalf("only %d decisions in 5s of 4x500/s: the load did not run", len(during))
	}
	// The store answered again after SIGCONT.
	if got := counts(ds[len(ds)-sidecars*rate/2:]); got["allow/store"]+got["deny/store"]+got["deny/local"] == 0 {
		t.Errorf("no store or deny-cache decision in the last half second: %v", got)
	}
}
