package limiter_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
)

// emptyForStep is a request on a key and the wait EmptyFor must report
// for its decision.
type emptyForStep struct {
	at   time.Duration
	cost int64
	want time.Duration
}

// emptyForTables are worked by hand from ALGORITHMS.md. For the buckets,
// with the tick q, TickUnits u, TokenUnits k and CapacityUnits cu of the
// limit, a key at level l units (just after the request) reports
//
//	ResetAfter = ceil((cu-l)/u) ticks, to the tick boundary
//	EmptyFor   = ResetAfter - (ceil((cu-k)/u) - 1) ticks
//
// which is at or at most one tick after the first instant the key holds a
// whole token again, ceil((k-l)/u) ticks away.
var emptyForTables = []struct {
	name  string
	limit limiter.Limit
	base  time.Time
	steps []emptyForStep
}{
	{
		// q = 1µs, u = 1, k = 100000, cu = 1000000: the first token is
		// (k-l) µs away; EmptyFor is one µs more.
		name:  "TokenBucket/10 per 1s",
		limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: time.Second},
		base:  time.Unix(1_700_000_017, 345_678_000),
		steps: []emptyForStep{
			{0, 1, 0}, // 9 left: room
			{0, 9, 100*time.Millisecond + time.Microsecond}, // empty, l = 0
			{0, 1, 0},                     // a deny
			{50 * time.Millisecond, 0, 0}, // a peek on the empty key is a deny, l = 50000
			{50 * time.Millisecond, 1, 0}, // and a cost of 1 is denied too: the peek spent nothing
			{100 * time.Millisecond, 1, 100*time.Millisecond + time.Microsecond}, // the token refilled and taken
			{250 * time.Millisecond, 1, 50*time.Millisecond + time.Microsecond},  // 1.5 tokens, one taken, l = 50000
			{2 * time.Second, 5, 0}, // full again, 5 left
		},
	},
	{
		// q = 1µs, u = 3, k = 1000000, cu = 3000000: a token every
		// 333333.33µs, so the rounding of both ceilings shows.
		name:  "TokenBucket/3 per 1s",
		limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Period: time.Second},
		base:  time.Unix(1_700_000_040, 0),
		steps: []emptyForStep{
			// l = 0: the token is 333334 ticks away, and so is EmptyFor.
			{0, 3, 333334 * time.Microsecond},
			// l = 2: the token is ceil(999998/3) = 333333 ticks away;
			// EmptyFor is ceil(2999998/3) - 666666 = 333334.
			{333334 * time.Microsecond, 1, 333334 * time.Microsecond},
		},
	},
	{
		// q = 1µs, u = 1, k = 20000000 (20s a token), cu = 5 tokens.
		name:  "TokenBucket/3 per 1m burst 5",
		limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Period: time.Minute, Burst: 5},
		base:  time.Unix(1_700_000_040, 0),
		steps: []emptyForStep{
			{0, 5, 20*time.Second + time.Microsecond},
			{20 * time.Second, 1, 20*time.Second + time.Microsecond},
			{30 * time.Second, 0, 0}, // a peek on the empty key: a deny
		},
	},
	{
		// A capacity so large that the tick is 10µs: q = 10, u = 3,
		// k = 1000000, cu = 5e14. The base is 8µs into a tick. The first
		// token is 333334 ticks after the tick of the request, 3333340µs
		// less the 8µs: EmptyFor is that instant exactly.
		name:  "TokenBucket/3 per 10s burst 5e8",
		limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Period: 10 * time.Second, Burst: 500_000_000},
		base:  time.Unix(1_700_000_017, 345_678_000),
		steps: []emptyForStep{
			{0, 400_000_000, 0},
			{0, 100_000_000, 3333332 * time.Microsecond},
		},
	},
	{
		// GCRA admits what TokenBucket admits; its debt after a take is
		// cu - l, so the same waits come out.
		name:  "GCRA/3 per 1s",
		limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 3, Period: time.Second},
		base:  time.Unix(1_700_000_040, 0),
		steps: []emptyForStep{
			{0, 3, 333334 * time.Microsecond},
			{0, 1, 0},
			{333334 * time.Microsecond, 1, 333334 * time.Microsecond},
		},
	},
	{
		name:  "GCRA/10 per 1s",
		limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 10, Period: time.Second},
		base:  time.Unix(1_700_000_017, 345_678_000),
		steps: []emptyForStep{
			{0, 10, 100*time.Millisecond + time.Microsecond},
			{250 * time.Millisecond, 2, 50*time.Millisecond + time.Microsecond},
		},
	},
	{
		// The window ends 15s after the base: EmptyFor is the rest of
		// the window, exactly.
		name:  "FixedWindow/3 per 1m mid-window",
		limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 3, Period: time.Minute},
		base:  time.Unix(1_700_000_040, 0).Add(45 * time.Second),
		steps: []emptyForStep{
			{0, 2, 0},
			{10 * time.Second, 1, 5 * time.Second},
			{10 * time.Second, 1, 0},           // a deny
			{12 * time.Second, 0, 0},           // a peek on the spent window: a deny
			{15 * time.Second, 3, time.Minute}, // a new window, spent at once
		},
	},
	{
		// The weighted previous window and the log are not in the
		// decision: EmptyFor cannot tell.
		name:  "SlidingWindow/2 per 1s",
		limit: limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 2, Period: time.Second},
		base:  time.Unix(1_700_000_040, 0),
		steps: []emptyForStep{{0, 2, 0}},
	},
	{
		name:  "SlidingLog/2 per 10s",
		limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 2, Period: 10 * time.Second},
		base:  time.Unix(1_700_000_040, 0),
		steps: []emptyForStep{{0, 2, 0}},
	},
}

func TestEmptyFor(t *testing.T) {
	t.Parallel()
	for _, tb := range emptyForTables {
		t.Run(tb.name, func(t *testing.T) {
			t.Parallel()
			lim, err := limiter.New(tb.limit)
			if err != nil {
				t.Fatal(err)
			}
			p, err := limiter.NewParams(tb.limit)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tb.steps {
				at := tb.base.Add(s.at)
				d, err := lim.AllowN(at, s.cost)
				if err != nil {
					t.Fatal(err)
				}
				if got := p.EmptyFor(d); got != s.want {
					t.Errorf("step %d: AllowN(%v, %v) = %v, EmptyFor = %v, want %v", i, at.UTC().Format(time.RFC3339Nano), s.cost, d, got, s.want)
				}
			}
		})
	}
}

// TestEmptyForNeverEarly drives random keys and checks every wait EmptyFor
// reports against the algorithm itself: at its end the key admits a
// request of cost 1, and more than one tick before it (one µs for
// FixedWindow) it does not.
func TestEmptyForNeverEarly(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow} {
		checked := 0
		for range 200 {
			l := limitertest.RandomLimit(rng, alg)
			p, err := limiter.NewParams(l)
			if err != nil {
				t.Fatal(err)
			}
			late := p.TickMicros
			if alg == limiter.FixedWindow {
				late = 0
			}
			var st limiter.State
			now := int64(1_700_000_000_000_000) + rng.Int64N(l.Period.Microseconds())
			for range 300 {
				now += rng.Int64N(l.Period.Microseconds()/l.Requests + 1)
				n := 1 + rng.Int64N(l.Capacity())
				d, _, err := p.Take(&st, p, now, n)
				if err != nil {
					t.Fatal(err)
				}
				hold := p.EmptyFor(d).Microseconds()
				if hold == 0 {
					continue
				}
				checked++
				at := func(us int64) bool {
					s := st
					d, _, err := p.Take(&s, p, us, 1)
					if err != nil {
						t.Fatal(err)
					}
					return d.Allowed
				}
				if !at(now + hold) {
					t.Fatalf("%v at %d: after %v EmptyFor = %dµs, but cost 1 is denied then", l, now, d, hold)
				}
				if early := now + hold - late - 1; early >= now && at(early) {
					t.Fatalf("%v at %d: after %v EmptyFor = %dµs, but cost 1 is admitted %dµs sooner", l, now, d, hold, late+1)
				}
			}
		}
		// Random costs up to the capacity empty keys often.
		if checked < 1000 {
			t.Errorf("%v: only %d waits checked", alg, checked)
		}
	}
}
