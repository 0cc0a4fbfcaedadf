package limiter_test

import (
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// TestStateAccessors: the accessors read the fields ALGORITHMS.md gives
// each algorithm.
func TestStateAccessors(t *testing.T) {
	t.Parallel()
	const minute = int64(1_700_000_040_000_000) // µs, a whole minute
	take := func(l limiter.Limit, s *limiter.State, nowUs, n int64) {
		t.Helper()
		p, err := limiter.NewParams(l)
		if err != nil {
			t.Fatal(err)
		}
		if d, _, err := p.Take(s, p, nowUs, n); err != nil || !d.Allowed {
			t.Fatalf("%v: take %d at %d: %v, %v", l, n, nowUs, d, err)
		}
	}
	field := func(name string, got, want int64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}

	// 10 per second: a token is 100000 units, one unit refills per µs
	// tick.
	var tb limiter.State
	take(limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: time.Second}, &tb, minute+17, 3)
	field("TokenBucket Level", tb.Level(), 7*100_000)
	field("TokenBucket LastTick", tb.LastTick(), minute+17)

	// 3 per second: a token is 1000000 units, 3 refill per tick, so one
	// token of debt is 333333 ticks and 1 unit.
	var gcra limiter.State
	take(limiter.Limit{Algorithm: limiter.GCRA, Requests: 3, Period: time.Second}, &gcra, minute+17, 1)
	field("GCRA TAT", gcra.TAT(), minute+17+333_333)
	field("GCRA TATFraction", gcra.TATFraction(), 1)

	var fw limiter.State
	take(limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 5, Period: time.Minute}, &fw, minute+45_000_000, 2)
	field("FixedWindow WindowStart", fw.WindowStart(), minute)
	field("FixedWindow Count", fw.Count(), 2)

	var sw limiter.State
	l := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 5, Period: time.Second}
	take(l, &sw, minute+100, 2)
	take(l, &sw, minute+1_200_000, 1)
	field("SlidingWindow WindowStart", sw.WindowStart(), minute+1_000_000)
	field("SlidingWindow Count", sw.Count(), 1)
	field("SlidingWindow PrevCount", sw.PrevCount(), 2)
}
