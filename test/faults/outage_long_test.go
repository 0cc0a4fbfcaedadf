//go:build longfaults

package faults

import (
	"os"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestLongOutage is the outage users live with: every Redis node down for
// 5 minutes (FLOODGATE_OUTAGE overrides, as a Go duration) under 5
// sidecars that each offer a fail-open rule five times their share of its
// limit. It reports what the fleet admitted during the outage against the
// limit over the same time (admitted/L·T): each sidecar enforces
// limit/replicas on its own, so the fleet stays near the limit. It is not
// part of `make test`:
//
//	go test -tags longfaults -run TestLongOutage -timeout 30m -v ./test/faults/
func TestLongOutage(t *testing.T) {
	outage := 5 * time.Minute
	if v := os.Getenv("FLOODGATE_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FLOODGATE_OUTAGE=%q: %v", v, err)
		}
		outage = d
	}
	c := redistest.StartCluster(t, redistest.Options{Masters: 3})
	ctx := t.Context()
	const (
		sidecars = 5
		rate     = 100 // per sidecar per second: 500/s offered
	)
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second, Burst: 20}
	fleet, rules := newFleet(t, c, "outage", sidecars, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow}, lim)
	key := "long-outage"
	warmUp(t, fleet, rules, key)
	rec := &record{}
	stop := make(chan struct{})
	wg := drive(ctx, fleet, rules, key, rate, rec, stop)
	time.Sleep(5 * time.Second)
	for _, n := range c.Nodes() {
		if err := c.Kill(n); err != nil {
			t.Fatal(err)
		}
	}
	down := time.Now()
	time.Sleep(outage)
	up := time.Now()
	for _, n := range c.Nodes() {
		if err := c.Restart(n); err != nil {
			t.Fatal(err)
		}
	}
	// The machine's lateness over the return, this process's and the
	// restarted nodes'.
	n := startProbe(c.Nodes()...)
	defer n.End()
	if err := c.WaitClusterOK(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()
	n.End()

	var during, after []decision
	for _, d := range rec.all() {
		switch {
		case !d.at.Before(down) && d.at.Before(up):
			during = append(during, d)
		case !d.at.Before(back.Add(2 * time.Second)):
			after = append(after, d)
		}
	}
	span := up.Sub(down)
	// Each sidecar enforces its share of the limit over the time its
	// driver offered five times that share: the span, less what the
	// machine held the driver past (it skips rather than bursts).
	var scheduled time.Duration
	for i := range sidecars {
		scheduled += rec.scheduled(i, down, up)
	}
	limitT := float64(lim.Requests) / sidecars * scheduled.Seconds() / lim.Period.Seconds()
	got := admitted(during)
	per := make([]int, sidecars)
	for _, d := range during {
		if d.outcome == engine.Allow {
			per[d.sidecar]++
		}
	}
	ratio := float64(got) / limitT
	t.Logf("all Redis down %v under %d sidecars at %d/s each (the drivers kept to their schedules for %v of %v): admitted %d, limit over the outage L·T = %.0f, admitted/L·T = %.3f; per sidecar %v; %v",
		span.Round(time.Second), sidecars, rate, scheduled.Round(time.Second), sidecars*span.Round(time.Second), got, limitT, ratio, per, counts(during))
	t.Logf("after the store came back (from 2s on): %v", counts(after))
	if ratio > 1.1 || ratio < 0.9 {
		t.Errorf("admitted/L·T = %.3f during the outage, want within 10%% of 1", ratio)
	}
	// A decision that fell back 2s after the store was back is excused
	// only by what the machine delayed it, and the nodes, by since then.
	for _, d := range after {
		if d.source != engine.FromFallback {
			continue
		}
		since := d.at.Sub(back)
		if late := n.Excuse(back, since) + n.During(back, d.at).Others; since > 2*time.Second+late {
			t.Errorf("sidecar %d fell back %v after the store was back, more than 2s (+ the machine's lateness %v): %v", d.sidecar, since, late, counts(after))
			break
		}
	}
}
