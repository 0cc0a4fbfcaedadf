package redisstore_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

// TestDelayTracesMatchModel runs GCRA limits that delay (MaxDelay)
// through the counter function on the real cluster and compares every
// decision, its Wait included, with the brute-force model: the script
// reserves a delayed request's slot in the same call that decides it.
func TestDelayTracesMatchModel(t *testing.T) {
	t.Parallel()
	clk := limitertest.NewClock(time.Unix(0, 0))
	s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: clk.Now})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>3))
	waits := 0
	for range 8 {
		l := limitertest.RandomDelayLimit(rng)
		key := uniqueKey(t)
		limitertest.CompareTrace(t, l, rng, 300, func(now, n int64) (limiter.Decision, error) {
			clk.Set(time.UnixMicro(now))
			d, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: n})
			if d.Wait > 0 {
				waits++
			}
			return d, err
		})
	}
	if waits == 0 {
		t.Fatal("no decision waited: the traces do not exercise the delay")
	}
}
