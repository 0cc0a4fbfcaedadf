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

// TestDelayReservationsAcrossSidecars has three stores, as three sidecars,
// send 90 requests at once for one key of a delaying limit (20/s, one at
// once, up to 1s of wait) at one instant: the counter function reserves
// each admitted request's slot atomically, so exactly 21 are admitted,
// one at once and one in each of the next 20 slots 50ms apart, whichever
// store asked, and the others are denied.
func TestDelayReservationsAcrossSidecars(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	stores := make([]*redisstore.Store, 3)
	for i := range stores {
		stores[i] = newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: clock})
	}
	l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 20, Period: time.Second, Burst: 1, MaxDelay: time.Second}
	key := uniqueKey(t)
	type answer struct {
		d   limiter.Decision
		err error
	}
	answers := make(chan answer, 90)
	for i := range 90 {
		go func() {
			d, _, err := stores[i%3].Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: 1})
			answers <- answer{d, err}
		}()
	}
	slots := map[time.Duration]int{}
	denied := 0
	for range 90 {
		a := <-answers
		if a.err != nil {
			t.Fatal(a.err)
		}
		if !a.d.Allowed {
			denied++
			continue
		}
		slots[a.d.Wait]++
	}
	if len(slots) != 21 || denied != 69 {
		t.Fatalf("%d distinct waits (%v), %d denied; want 21 slots and 69 denied", len(slots), slots, denied)
	}
	for k := range 21 {
		if w := time.Duration(k) * 50 * time.Millisecond; slots[w] != 1 {
			t.Errorf("slot at +%v admitted %d requests, want 1", w, slots[w])
		}
	}
}
