package faults

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// failoverWindows returns, per sidecar, the span from its first to its last
// fallback decision, and when it counted in the store again for good after
// the failover of the master at dead: its first store decision after its
// last fallback decision that had called dead (zero when it has none). A
// decision that fell back on a call to another shard (the new master's
// connection still being made, or a call the machine delayed past its
// budget) does not count against that: the sidecar no longer routes to
// the dead master then.
func failoverWindows(ds []decision, sidecars int, dead string) (spans []time.Duration, back []time.Time) {
	first := make([]time.Time, sidecars)
	last := make([]time.Time, sidecars)
	lastDead := make([]time.Time, sidecars)
	for _, d := range ds {
		if d.source != engine.FromFallback && d.source != engine.FromNowhere {
			continue
		}
		if first[d.sidecar].IsZero() || d.at.Before(first[d.sidecar]) {
			first[d.sidecar] = d.at
		}
		end := d.at.Add(d.took)
		if end.After(last[d.sidecar]) {
			last[d.sidecar] = end
		}
		if slices.ContainsFunc(d.calls, func(c storeCall) bool { return c.shard == dead }) && end.After(lastDead[d.sidecar]) {
			lastDead[d.sidecar] = end
		}
	}
	spans = make([]time.Duration, sidecars)
	back = make([]time.Time, sidecars)
	for i := range sidecars {
		if first[i].IsZero() {
			continue
		}
		spans[i] = last[i].Sub(first[i])
		if lastDead[i].IsZero() {
			continue
		}
		for _, d := range ds {
			if d.sidecar == i && d.source == engine.FromStore && !d.at.Before(lastDead[i]) && (back[i].IsZero() || d.at.Before(back[i])) {
				back[i] = d.at
			}
		}
	}
	return spans, back
}

// followBudget is how long a sidecar may take to count in the store again
// once Redis has promoted a replica: the calls its breaker fails fast ask
// for a slot-map reload at most every 375 ms (redisstore's reload spacing,
// jittered), go-redis spaces its lazy reloads by 200 ms, and the reload
// and the first call to the new master each take a round trip, allowed
// one call budget (250 ms here). That sums to 1.075 s. It takes the Redis
// nodes to answer, and to hear of the promotion, as promptly as on an idle
// machine: what the machine delayed them by is measured and excused.
const followBudget = 1075 * time.Millisecond

// TestKilledMasterBounds kills (SIGKILL) the master of a key that three
// sidecars flood far beyond a real limit, and holds the fleet to its
// promises: every sidecar counts in the store again within floodgate's own
// budget of the promotion that Redis reports (the replica's "failover
// election won" in its log; how long Redis takes to get there is its node
// timeout and election, which a busy machine stretches, and is only
// reported), and the fleet
// admits no more than the limit over the run, plus the bucket's burst,
// plus what each sidecar's fallback bucket (limit/replicas) can admit over
// the window it was in fallback.
func TestKilledMasterBounds(t *testing.T) {
	const nodeTimeout = time.Second
	c := redistest.StartCluster(t, redistest.Options{Masters: 3, Replicas: 1, NodeTimeout: nodeTimeout, PartialCoverage: true})
	ctx := t.Context()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := masters[0]
	key := keyOn(t, c, victim, "flooded")
	const (
		sidecars = 3
		rate     = 100 // per sidecar per second: 300/s against a limit of 100/s
	)
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second, Burst: 20}
	// A budget a loaded machine meets, so that calls time out only
	// when the master is gone; the breaker as shipped.
	fleet, rules := newFleet(t, c, "killed", sidecars, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: 250 * time.Millisecond}, lim)
	warmUp(t, fleet, rules, key)
	// Let the bucket drain, so the run starts from an empty bucket...
	time.Sleep(time.Second)

	rec := &record{}
	stop := make(chan struct{})
	n := startProbe(c.Nodes()...)
	start := time.Now()
	wg := drive(ctx, fleet, rules, key, rate, rec, stop)
	halt := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
		n.End()
	})
	defer halt()
	time.Sleep(2 * time.Second)
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	promotedNode, err := c.WaitForFailover(victim, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	seen := time.Now()
	promoted, err := promotedNode.PromotedAt()
	if err != nil {
		t.Fatal(err)
	}
	// Run on past the promotion, for 5s and until every sidecar counts in
	// the store again after its last fallback decision: the end of the
	// run is measured from the failover, however long Redis took to get
	// there on this machine.
	waitUntil(30*time.Second, func() bool {
		if time.Since(seen) < 5*time.Second {
			return false
		}
		_, back := failoverWindows(rec.all(), sidecars, victim.Addr())
		return !slices.Contains(back, time.Time{})
	})
	halt()
	ds := rec.all()
	end := start
	for _, d := range ds {
		if e := d.at.Add(d.took); e.After(end) {
			end = e
		}
	}
	span := end.Sub(start)

	spans, back := failoverWindows(ds, sidecars, victim.Addr())
	var recovery time.Duration
	for i := range sidecars {
		if back[i].IsZero() {
			t.Fatalf("sidecar %d never counted in the store again after the kill; %v", i, counts(ds))
		}
		recovery = max(recovery, back[i].Sub(promoted))
	}
	// What the fleet may admit: the limit over the run, the burst, and
	// each fallback bucket's burst and rate over its window.
	fb := rules[0].Fallback
	bound := lim.Requests*int64(span/time.Second) + int64(float64(lim.Requests)*(span%time.Second).Seconds()) + lim.Burst
	var fallbackShare float64
	for _, w := range spans {
		if w > 0 {
			fallbackShare += float64(fb.Burst) + float64(fb.Requests)*w.Seconds()/fb.Period.Seconds()
		}
	}
	got := admitted(ds)
	// The recovery is timed from the promotion: excuse what the machine
	// delayed this process by over that span, and the Redis nodes, whose
	// answers to the sidecars' reloads, and news of the promotion to one
	// another, the followBudget takes to be prompt.
	goLate, redisLate := n.Excuse(promoted, recovery), n.During(promoted, promoted.Add(recovery)).Others
	lateness := goLate + redisLate
	recoveryBound := followBudget + lateness
	t.Logf("killed %s: %s won the failover election %v after the SIGKILL (node timeout %v); every sidecar counted in the store again %v after the promotion (bound %v + lateness %v = %v: this process %v, the Redis nodes %v); fallback windows %v",
		victim.Addr(), promotedNode.Addr(), promoted.Sub(killed).Round(time.Millisecond), nodeTimeout, recovery.Round(time.Millisecond), followBudget, lateness, recoveryBound, goLate, redisLate, spans)
	t.Logf("admitted %d of %d over %v: bound limit×T %d + burst %d + fallback shares %.1f (bucket %d/%v burst %d per sidecar) = %.1f; %v",
		got, len(ds), span.Round(time.Millisecond), bound-lim.Burst, lim.Burst, fallbackShare, fb.Requests, fb.Period, fb.Burst,
		float64(bound)+fallbackShare, counts(ds))
	if recovery > recoveryBound {
		t.Errorf("shared counting came back %v after Redis promoted %s, more than floodgate's budget %v (+ lateness %v)", recovery, promotedNode.Addr(), followBudget, lateness)
	}
	if float64(got) > float64(bound)+fallbackShare {
		t.Errorf("admitted %d, more than limit×T + burst + fallback shares = %.1f", got, float64(bound)+fallbackShare)
	}
	// Starved: it admitted less than half of what it should, the limit
	// over the run or, should the machine have held the drivers back to
	// less than that, what they sent.
	if floor := min(int(lim.Requests)*int(span/time.Second), len(ds)) / 2; got < floor {
		t.Errorf("admitted only %d of %d requests over %v of a %d/s limit (want at least %d): the fleet starved", got, len(ds), span, lim.Requests, floor)
	}
}
