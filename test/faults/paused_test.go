package faults

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestPausedMaster stops a master (SIGSTOP: its sockets accept, it answers
// nothing) for half the node timeout, and then for twice it, under three
// sidecars deciding 200 requests per second each on one of its keys:
//
//   - every decision answers within the call budget plus 10ms from its
//     arrival (plus what the machine delayed goroutines by meanwhile,
//     measured in the same run: see test/lateness), never seconds;
//   - at 0.5x the master comes back as the master; the scripts that timed
//     out may run late, once each, never twice;
//   - at 2x its replica takes over while it is stopped, and the old master,
//     resumed, rejoins as a replica; what it ran late is discarded with its
//     data, so the new master holds exactly what the store admitted (less
//     at most the last few milliseconds of writes a replica may miss),
//     never more: no double counting.
func TestPausedMaster(t *testing.T) {
	const nodeTimeout = 2 * time.Second
	for _, factor := range []float64{0.5, 2} {
		t.Run(fmt.Sprintf("%.1fx", factor), func(t *testing.T) {
			testPausedMaster(t, nodeTimeout, time.Duration(factor*float64(nodeTimeout)), factor > 1)
		})
	}
}

func testPausedMaster(t *testing.T, nodeTimeout, pause time.Duration, failover bool) {
	c := redistest.StartCluster(t, redistest.Options{Masters: 3, Replicas: 1, NodeTimeout: nodeTimeout, PartialCoverage: true})
	ctx := t.Context()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := masters[1]
	key := keyOn(t, c, victim, "paused")
	const (
		sidecars = 3
		rate     = 200
		budget   = redisstore.DefaultTimeout
		slack    = 10 * time.Millisecond
	)
	lim := exactCounter
	fleet, rules := newFleet(t, c, "paused", sidecars, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow}, lim)
	warmUp(t, fleet, rules, key)
	before := remaining(t, c, key, lim)

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
	time.Sleep(time.Second)
	if err := c.Pause(victim); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	time.Sleep(pause)
	var promoted *redistest.Node
	if failover {
		// The replica took over while the master was stopped.
		if promoted, err = c.WaitForFailover(victim, 30*time.Second); err != nil {
			_ = c.Resume(victim)
			t.Fatal(err)
		}
	}
	if err := c.Resume(victim); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	if err := c.WaitClusterOK(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	var rejoined bool
	if failover {
		// The old master, resumed, learns from its peers that its replica
		// took over, and turns itself into a replica: wait for that.
		rejoined = waitUntil(30*time.Second, func() bool {
			role, err := victim.Client().Do(ctx, "role").Slice()
			return err == nil && len(role) > 0 && role[0] == "slave"
		})
	}
	time.Sleep(2 * time.Second)
	halt()
	ds := rec.all()

	bound := budget + slack
	over := 0
	for _, d := range ds {
		if d.took > bound {
			over++
		}
		if late := n.Excuse(d.at, d.took); d.took > bound+late {
			t.Errorf("sidecar %d: a decision at %+v from the pause took %v: more than the call budget %v + %v, and the machine's delays around it excuse only %v; %s",
				d.sidecar, d.at.Sub(paused).Round(time.Millisecond), d.took, budget, slack, late, d.story())
		}
	}
	var during []decision
	for _, d := range ds {
		if !d.at.Before(paused) && d.at.Before(resumed) {
			during = append(during, d)
		}
	}
	w := n.Worst()
	t.Logf("stopped %v for %v: %d decisions, %d while stopped (max %v, p99 %v); %d took longer than %v; %v; the machine's lateness over the run: sleepers' timers up to %v, run-queue waits up to %v (goroutines) and %v (threads)",
		victim.Addr(), resumed.Sub(paused).Round(time.Millisecond), len(ds), len(during), maxTook(during), percentile(during, .99), over, bound, counts(ds), w.Timer, w.Goroutine, w.Thread)

	// What Redis holds against what the store admitted, and the calls
	// sent to a shard that got no answer (they may have run, once).
	storeAdmitted := 0
	for _, d := range ds {
		if d.source == engine.FromStore && d.outcome == engine.Allow {
			storeAdmitted++
		}
	}
	timedOut := func(n *redistest.Node, before time.Time) int {
		total := 0
		for _, sc := range fleet {
			total += sc.calls.unanswered(n.Addr(), before)
		}
		return total
	}
	end := time.Now()
	charged := int(before - remaining(t, c, key, lim))
	if failover {
		if !rejoined {
			role, err := victim.Client().Do(ctx, "role").Slice()
			t.Errorf("the old master's role 30s after it was resumed: %v, %v; want a replica", role, err)
		}
		// A replica may miss the writes of the last milliseconds before
		// the stop: at most those of the decisions the store admitted in
		// the last 50ms before it (plus however late the machine ran
		// this process then, the window in which the old master's
		// answers reached it), or whose answers were on their way when
		// it stopped. The new master answers none before it is promoted.
		promotedAt, err := promoted.PromotedAt()
		if err != nil {
			t.Fatal(err)
		}
		lagWindow := 50*time.Millisecond + n.Stall(paused.Add(-50*time.Millisecond), paused)
		lag := 0
		for _, d := range ds {
			if end := d.at.Add(d.took); d.source == engine.FromStore && d.outcome == engine.Allow &&
				!end.Before(paused.Add(-lagWindow)) && end.Before(promotedAt) {
				lag++
			}
		}
		// The calls that went unanswered and may count on the new
		// master: those it got itself, and those the old master got
		// before it stopped, which it may have run and replicated before
		// their answers left. What the old master ran after it was
		// resumed is discarded with its data when it rejoins as a
		// replica: counting it would be double counting.
		late := timedOut(promoted, end)
		inFlight := timedOut(victim, paused)
		t.Logf("promoted %v %v after the stop; the new master holds %d charges: the store admitted %d, %d calls to the new master went unanswered (they may have run), %d calls to the stopped master went unanswered, %d of them sent before the stop (they may have run and replicated); replication may lose at most %d (the admissions answered from %v before the stop on)",
			promoted.Addr(), promotedAt.Sub(paused).Round(time.Millisecond), charged, storeAdmitted, late, timedOut(victim, end), inFlight, lag, lagWindow.Round(time.Millisecond))
		if charged > storeAdmitted+late+inFlight {
			t.Errorf("the new master holds %d charges but the store admitted %d, only %d calls to it went unanswered and %d to the old master before the stop: the stopped master's late scripts were counted",
				charged, storeAdmitted, late, inFlight)
		}
		if charged < storeAdmitted-lag {
			t.Errorf("the new master holds %d charges, %d fewer than the store admitted", charged, storeAdmitted-charged)
		}
		return
	}
	maybeRan := timedOut(victim, end)
	t.Logf("the master holds %d charges: %d the store admitted, %d of the %d calls that went unanswered ran late (once each)",
		charged, storeAdmitted, charged-storeAdmitted, maybeRan)
	if charged < storeAdmitted || charged > storeAdmitted+maybeRan {
		t.Errorf("the master holds %d charges; want between the %d admitted and %d (admitted + unanswered calls, each run at most once)",
			charged, storeAdmitted, storeAdmitted+maybeRan)
	}
}

// exactCounter is a limit the tests never reach and whose count never
// refills during a run: a fixed window of the longest period, so every
// admission is one charge and the count in Redis says exactly what ran.
var exactCounter = limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000, Period: limiter.MaxPeriod}

// remaining peeks at key's remaining tokens on the cluster, through a store
// of its own.
func remaining(t *testing.T, c *redistest.Cluster, key string, lim limiter.Limit) int64 {
	t.Helper()
	s, err := redisstore.New(redisstore.Options{Addrs: c.Addrs(), Password: c.Password(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		d, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: lim, Cost: 0})
		if err == nil {
			return d.Remaining
		}
		if time.Now().After(deadline) {
			t.Fatalf("peek at %s: %v", key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
