package engine

import (
	"context"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// A Verdict reused across decisions, as a connection reuses its own,
// holds none of their calls afterwards: no deny-cache entry and no lease
// of a past decision stays reachable from it.
func TestDecideLeavesNoCallsInTheVerdict(t *testing.T) {
	t.Parallel()
	for _, parallel := range []bool{false, true} {
		f := newFixture(t, parallel)
		a := f.rule(t, "a", perMinute(limiter.TokenBucket, 2), 1, false, false)
		b := f.rule(t, "b", perMinute(limiter.FixedWindow, 3), 1, false, false)
		s := f.rule(t, "s", perMinute(limiter.GCRA, 1), 1, false, true)
		hits := []Hit{{Rule: a, Key: "a", Cost: 1}, {Rule: b, Key: "b", Cost: 1}, {Rule: s, Key: "s", Cost: 1}}
		var v Verdict
		// Allowed, then emptied (a deny-cache entry each), then denied
		// by the store and locally.
		for i := range 4 {
			for _, hs := range [][]Hit{hits, hits[:1], hits[1:]} {
				f.e.Decide(context.Background(), hs, &v)
				for j, c := range v.scratch {
					if c != (call{}) {
						t.Fatalf("parallel=%v, request %d on %d hits: call %d is left in the verdict: %+v", parallel, i, len(hs), j, c)
					}
				}
			}
		}
		if v.Outcome != Deny {
			t.Errorf("parallel=%v: last decision %v, want the keys exhausted", parallel, v.Outcome)
		}
	}
}
