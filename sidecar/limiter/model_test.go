package limiter_test

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
)

var allAlgorithms = []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow, limiter.SlidingLog}

func seed(t testing.TB) *rand.Rand {
	s := uint64(time.Now().UnixNano())
	t.Logf("seed %d", s)
	return rand.New(rand.NewPCG(s, s>>7))
}

func pureTake(t testing.TB, l limiter.Limit) func(now, n int64) (limiter.Decision, error) {
	lim, err := limiter.New(l)
	if err != nil {
		t.Fatal(err)
	}
	return func(now, n int64) (limiter.Decision, error) { return lim.AllowN(time.UnixMicro(now), n) }
}

// TestRandomTracesMatchModel compares every algorithm with the brute-force
// model over long random traces of small limits.
func TestRandomTracesMatchModel(t *testing.T) {
	t.Parallel()
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			rng := seed(t)
			for range 8 {
				l := limitertest.RandomLimit(rng, alg)
				limitertest.CompareTrace(t, l, rng, 1500, pureTake(t, l))
			}
		})
	}
}

// TestRandomDelayTracesMatchModel compares GCRA limits that delay
// (MaxDelay) with the model, which pours a delayed request's cost in at
// once and lets it go when the water has drained to the capacity.
func TestRandomDelayTracesMatchModel(t *testing.T) {
	t.Parallel()
	rng := seed(t)
	waits := 0
	for range 24 {
		l := limitertest.RandomDelayLimit(rng)
		take := pureTake(t, l)
		limitertest.CompareTrace(t, l, rng, 1500, func(now, n int64) (limiter.Decision, error) {
			d, err := take(now, n)
			if d.Wait > 0 {
				waits++
			}
			return d, err
		})
	}
	if waits == 0 {
		t.Fatal("no decision of the traces waited: the traces do not exercise the delay")
	}
}

// TestRandomTracesExtremeLimits compares the algorithms with the model for
// very large and very small rates and windows from 1s to 366 days,
// including limits whose clock resolution is coarser than 1µs.
func TestRandomTracesExtremeLimits(t *testing.T) {
	t.Parallel()
	limits := []limiter.Limit{
		{Requests: 1_000_000_000, Period: time.Second},
		{Requests: 999_999_937, Period: time.Second, Burst: 1_000_000_000},
		{Requests: 1, Period: 366 * 24 * time.Hour},
		{Requests: 7, Period: 366 * 24 * time.Hour, Burst: 3},
		{Requests: 123_457, Period: 30 * 24 * time.Hour},
		{Requests: 999_999_937, Period: 366 * 24 * time.Hour, Burst: 400_000_000},
		{Requests: 1_000_000_000, Period: 366 * 24 * time.Hour},
		{Requests: 3, Period: 1_234_567 * time.Microsecond},
	}
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			rng := seed(t)
			for _, l := range limits {
				l.Algorithm = alg
				if alg != limiter.TokenBucket && alg != limiter.GCRA {
					l.Burst = 0
				}
				if alg == limiter.SlidingLog {
					l.Requests = min(l.Requests, limiter.MaxLogRequests)
				}
				if err := l.Validate(); err != nil {
					t.Fatalf("%v: %v", l, err)
				}
				limitertest.CompareTrace(t, l, rng, 300, pureTake(t, l))
			}
		})
	}
}

// TestGCRAEqualsTokenBucket: with the clock moving forward, GCRA and
// TokenBucket admit the same requests and report the same decisions.
func TestGCRAEqualsTokenBucket(t *testing.T) {
	t.Parallel()
	rng := seed(t)
	for range 50 {
		l := limitertest.RandomLimit(rng, limiter.TokenBucket)
		g := l
		g.Algorithm = limiter.GCRA
		tb, gc := pureTake(t, l), pureTake(t, g)
		now := int64(1_700_000_000_000_000)
		for i := range 2000 {
			now += rng.Int64N(l.Period.Microseconds() / 2)
			n := rng.Int64N(l.Capacity() + 2)
			d1, err1 := tb(now, n)
			d2, err2 := gc(now, n)
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			if d1 != d2 {
				t.Fatalf("%v step %d: TokenBucket %v, GCRA %v", l, i, d1, d2)
			}
		}
	}
}

// leakyMeter is a leaky bucket used as a meter (Shopify's API, nginx
// limit_req): each request pours its cost into a bucket of the given size
// that leaks continuously at rate; a request that would overflow it is
// refused and pours nothing.
type leakyMeter struct {
	size  int64
	rate  *big.Rat // per µs
	water *big.Rat
	last  int64
}

func (m *leakyMeter) pour(now, n int64) (ok bool, free int64) {
	leaked := new(big.Rat).Mul(m.rate, big.NewRat(now-m.last, 1))
	m.water.Sub(m.water, leaked)
	if m.water.Sign() < 0 {
		m.water.SetInt64(0)
	}
	m.last = now
	after := new(big.Rat).Add(m.water, big.NewRat(n, 1))
	if ok = after.Cmp(big.NewRat(m.size, 1)) <= 0; ok {
		m.water = after
	}
	room := new(big.Rat).Sub(big.NewRat(m.size, 1), m.water)
	return ok, new(big.Int).Quo(room.Num(), room.Denom()).Int64()
}

// TestLeakyBucketMeterIsGCRA documents that a leaky bucket used as a meter
// is GCRA: the meter's water level is GCRA's debt, its size the capacity.
func TestLeakyBucketMeterIsGCRA(t *testing.T) {
	t.Parallel()
	rng := seed(t)
	for range 50 {
		l := limitertest.RandomLimit(rng, limiter.GCRA)
		gc := pureTake(t, l)
		now := int64(1_700_000_000_000_000)
		m := &leakyMeter{size: l.Capacity(), rate: big.NewRat(l.Requests, l.Period.Microseconds()), water: new(big.Rat), last: now}
		for i := range 2000 {
			now += rng.Int64N(l.Period.Microseconds()/l.Requests + 1)
			n := 1 + rng.Int64N(min(3, l.Capacity()))
			d, err := gc(now, n)
			if err != nil {
				t.Fatal(err)
			}
			ok, free := m.pour(now, n)
			if d.Allowed != ok || d.Remaining != free {
				t.Fatalf("%v step %d: GCRA %v, leaky bucket allowed=%v free=%d", l, i, d, ok, free)
			}
		}
	}
}
