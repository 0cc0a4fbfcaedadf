package redisstore_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

// extremeLimits are limits at the edges of what Limit.Validate accepts:
// huge capacities and periods (levels near 2^50 units), rates with few
// common factors (coarse ticks), and odd periods. The conformance suite
// uses small numbers; these check that the scripts' doubles stay exact
// where the integers are largest.
func extremeLimits(alg limiter.Algorithm) []limiter.Limit {
	day := 24 * time.Hour
	ls := []limiter.Limit{
		{Algorithm: alg, Requests: 1, Period: time.Second},
		{Algorithm: alg, Requests: 7, Period: time.Second + time.Microsecond},
		{Algorithm: alg, Requests: 999_983, Period: 7*day + 13*time.Second},
		{Algorithm: alg, Requests: limiter.MaxRequests, Period: limiter.MaxPeriod},
		{Algorithm: alg, Requests: 123_457, Period: 30 * day},
		{Algorithm: alg, Requests: 3, Period: limiter.MaxPeriod},
	}
	switch alg {
	case limiter.TokenBucket, limiter.GCRA:
		ls = append(ls,
			limiter.Limit{Algorithm: alg, Requests: limiter.MaxRequests, Period: time.Second, Burst: limiter.MaxRequests},
			limiter.Limit{Algorithm: alg, Requests: 123_457, Period: 30 * day, Burst: 999_999_937},
			limiter.Limit{Algorithm: alg, Requests: 1, Period: limiter.MaxPeriod, Burst: 100},
			// A 1µs tick with a 33-year fill time: a GCRA TAT passes
			// 2^53 µs when now is within 33 years of it.
			bigTickLimit(alg),
		)
	case limiter.SlidingLog:
		// The log holds one entry per admitted unit: keep it small.
		for i := range ls {
			ls[i].Requests = min(ls[i].Requests, 2000)
		}
	}
	var valid []limiter.Limit
	for _, l := range ls {
		if l.Validate() == nil {
			valid = append(valid, l)
		}
	}
	return valid
}

// bigTickLimit has a clock tick of 1µs and a fill time of 2^50 µs (33
// years), the longest a 1µs tick allows.
func bigTickLimit(alg limiter.Algorithm) limiter.Limit {
	return limiter.Limit{Algorithm: alg, Requests: 1, Period: 1 << 20 * time.Microsecond, Burst: limiter.MaxRequests}
}

// TestGCRAPast2To53 stores a GCRA TAT beyond 2^53 µs, which a Lua double
// cannot hold, and checks that it is written exactly and read back
// exactly.
func TestGCRAPast2To53(t *testing.T) {
	t.Parallel()
	clk := limitertest.NewClock(time.Unix(0, 0))
	s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: clk.Now})
	l := bigTickLimit(limiter.GCRA)
	p, err := limiter.NewParams(l)
	if err != nil {
		t.Fatal(err)
	}
	if p.TickMicros != 1 || p.TickUnits != 1 {
		t.Fatalf("params %+v: want a 1µs tick and one unit per tick", p)
	}
	lim, err := limiter.New(l)
	if err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t)
	now0 := int64(1<<53 - 1_000_000_000_001) // odd: the TAT is odd too, no double holds it
	const cost = 1_000_000
	steps := []struct{ at, n int64 }{{now0, cost}, {now0 + 1, 0}, {now0 + 7, 1}, {now0 + 1<<20 + 3, 2}, {now0 - 5, 1}, {1<<53 - 1, 0}}
	for i, st := range steps {
		at := time.UnixMicro(st.at)
		want, err := lim.AllowN(at, st.n)
		if err != nil {
			t.Fatal(err)
		}
		clk.Set(at)
		got, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: st.n})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("step %d: AllowN(%d, %d) = %v, want %v", i, st.at, st.n, got, want)
		}
		if i == 0 {
			cl := cluster.NewClient()
			st, err := cl.Get(t.Context(), redislayout.CounterKey(key, limiter.GCRA)).Result()
			_ = cl.Close()
			if err != nil {
				t.Fatal(err)
			}
			// The state is seven little-endian doubles; the TAT is the
			// sum of the first two, each exact.
			if len(st) != 56 {
				t.Fatalf("stored state is %d bytes, want 56", len(st))
			}
			var parts [2]float64
			for j := range parts {
				parts[j] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(st[8*j : 8*j+8])))
				if parts[j] != math.Trunc(parts[j]) || math.Abs(parts[j]) >= 1<<53 {
					t.Fatalf("stored TAT part %d = %v: not an exact integer", j, parts[j])
				}
			}
			a := int64(parts[0]) + int64(parts[1])
			// Fresh state: TAT = now + cost*K ticks.
			if want := now0 + cost*p.TokenUnits; a != want {
				t.Fatalf("stored TAT %d (%v + %v), want %d", a, parts[0], parts[1], want)
			}
			if a < 1<<53 {
				t.Fatalf("stored TAT %d is below 2^53: the case is not exercised", a)
			}
		}
	}
}

// TestDifferentialExtremes drives the store and the pure limiter.Limiter
// through the same random sequence of requests, limit edits and clock
// jumps (backwards too), at instants up to just below 2^53 µs, and
// requires the same Decision at every step.
func TestDifferentialExtremes(t *testing.T) {
	t.Parallel()
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			clk := limitertest.NewClock(time.Unix(0, 0))
			s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: clk.Now})
			seed := uint64(time.Now().UnixNano())
			rng := rand.New(rand.NewPCG(seed, uint64(alg)))
			limits := extremeLimits(alg)
			// Two epochs: today, and the last decades before 2^53 µs.
			for _, base := range []int64{1_700_000_000_000_000, 1<<53 - 1_000_000_000_000_000} {
				l := limits[rng.IntN(len(limits))]
				lim, err := limiter.New(l)
				if err != nil {
					t.Fatal(err)
				}
				key := uniqueKey(t)
				now := base + rng.Int64N(l.Period.Microseconds())
				for i := range 250 {
					switch r := rng.IntN(20); {
					case r == 0:
						// A limit edit: counters survive it.
						l = limits[rng.IntN(len(limits))]
						if err := lim.SetLimit(l); err != nil {
							t.Fatal(err)
						}
					case r == 1:
						now -= rng.Int64N(l.Period.Microseconds()/2 + 1) // the clock goes back
					case r < 6:
						now += rng.Int64N(3)
					case r < 12:
						now += rng.Int64N(l.Period.Microseconds()/max(1, l.Requests) + 1)
					default:
						now += rng.Int64N(2*l.Period.Microseconds() + 1)
					}
					now = min(max(now, 0), 1<<53-1)
					c := l.Capacity()
					var n int64
					switch rng.IntN(10) {
					case 0:
						n = 0
					case 1:
						n = c + 1
					case 2:
						n = max(1, rng.Int64N(c+1))
					default:
						n = 1 + rng.Int64N(min(3, c))
					}
					if alg == limiter.SlidingLog {
						n = min(n, 2001)
					}
					at := time.UnixMicro(now)
					want, err := lim.AllowN(at, n)
					if err != nil {
						t.Fatal(err)
					}
					clk.Set(at)
					got, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: n})
					if err != nil {
						t.Fatalf("seed %d step %d: Take(%v, %d, %v): %v", seed, i, now, n, l, err)
					}
					if got != want {
						t.Fatalf("seed %d step %d: %v: AllowN(%d, %d) = %v, want %v (limiter)", seed, i, l, now, n, got, want)
					}
				}
			}
		})
	}
}
