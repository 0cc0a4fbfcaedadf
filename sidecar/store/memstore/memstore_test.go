package memstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

func newStore(t testing.TB, opts ...memstore.Option) *memstore.Store {
	t.Helper()
	s, err := memstore.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// clocked returns the options plus WithClock(now), unless now is nil.
func clocked(now func() time.Time, opts ...memstore.Option) []memstore.Option {
	if now == nil {
		return opts
	}
	return append(opts, memstore.WithClock(now))
}

func TestConformance(t *testing.T) {
	t.Parallel()
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Store { return newStore(t, clocked(now)...) })
}

// TestConformanceTinyShards runs the suite with one shard and a table that
// must grow, probe and shift on every subtest.
func TestConformanceTinyShards(t *testing.T) {
	t.Parallel()
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Store {
		return newStore(t, clocked(now, memstore.WithShards(1))...)
	})
}

func TestOptionsValidated(t *testing.T) {
	t.Parallel()
	for _, opts := range [][]memstore.Option{
		{memstore.WithMaxKeys(0)},
		{memstore.WithShards(0)},
		{memstore.WithShards(1 << 17)},
		{memstore.WithClock(nil)},
		{nil},
	} {
		if _, err := memstore.New(opts...); err == nil {
			t.Errorf("New(%d options): want an error", len(opts))
		}
	}
}

func take(t *testing.T, s *memstore.Store, key string, l limiter.Limit, cost int64) limiter.Decision {
	t.Helper()
	d, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: cost})
	if err != nil {
		t.Fatalf("Take(%s, %d): %v", key, cost, err)
	}
	return d
}

// TestClockAndExpiry: the store's clock decides; a key's state expires once
// it is back to full plus the TTL margin, as the Redis TTL would, and Sweep
// and new keys reclaim it.
func TestClockAndExpiry(t *testing.T) {
	t.Parallel()
	clk := limitertest.NewClock(time.Unix(1_700_000_000, 0))
	s := newStore(t, memstore.WithClock(clk.Now), memstore.WithShards(1))
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 2, Period: time.Second}
	take(t, s, "a", l, 2)
	if d := take(t, s, "a", l, 1); d.Allowed || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("third take = %v, want deny retry 500ms", d)
	}
	if got := s.Len(); got != 1 {
		t.Fatalf("Len = %d, want 1", got)
	}
	// Full after 1s; the state lives StateTTL(1s) = 2s.
	clk.Add(2*time.Second - time.Microsecond)
	if got := s.Sweep(time.Time{}); got != 0 {
		t.Fatalf("Sweep before expiry removed %d", got)
	}
	clk.Add(time.Microsecond)
	if got := s.Sweep(time.Time{}); got != 1 {
		t.Fatalf("Sweep at expiry removed %d, want 1", got)
	}
	if got := s.Len(); got != 0 {
		t.Fatalf("Len after sweep = %d, want 0", got)
	}
	// Expired keys are reclaimed by later inserts too.
	for i := range 100 {
		take(t, s, strconv.Itoa(i), l, 1)
	}
	clk.Add(time.Hour)
	for i := range 100 {
		take(t, s, "new"+strconv.Itoa(i), l, 1)
	}
	if got := s.Len(); got >= 200 {
		t.Fatalf("Len = %d: expired keys were not reclaimed by inserts", got)
	}
}

// TestPeekLenDelete covers the helpers the sidecar uses.
func TestPeekLenDelete(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 5, Period: time.Minute}
	d, err := s.Peek(t.Context(), "k", l)
	if err != nil || !d.Allowed || d.Remaining != 5 {
		t.Fatalf("Peek on a new key = %v, %v; want allowed, 5 remaining", d, err)
	}
	if got := s.Len(); got != 0 {
		t.Fatalf("Len after a peek = %d, want 0: a peek must not create state", got)
	}
	take(t, s, "k", l, 3)
	if d, _ := s.Peek(t.Context(), "k", l); d.Remaining != 2 {
		t.Fatalf("Peek after spending 3 = %v, want 2 remaining", d)
	}
	if got := s.Len(); got != 1 {
		t.Fatalf("Len = %d, want 1", got)
	}
	if !s.Delete("k") || s.Delete("k") {
		t.Fatal("Delete: want true then false")
	}
	if d, _ := s.Peek(t.Context(), "k", l); d.Remaining != 5 {
		t.Fatalf("Peek after Delete = %v, want 5 remaining", d)
	}
	// A deny creates no state either.
	take(t, s, "big", l, 6)
	if got := s.Len(); got != 0 {
		t.Fatalf("Len after an oversize deny = %d, want 0", got)
	}
}

// TestMaxKeysEvictsIdlest: at the bound, new keys evict the keys that
// expire first, never the busy ones.
func TestMaxKeysEvictsIdlest(t *testing.T) {
	t.Parallel()
	const maxKeys = 1000
	now := time.Unix(1_700_000_000, 0)
	clk := limitertest.NewClock(now)
	s := newStore(t, memstore.WithMaxKeys(maxKeys), memstore.WithShards(4), memstore.WithClock(clk.Now))
	short := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 100, Period: time.Second}
	long := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 100, Period: time.Hour}
	req := func(key string, l limiter.Limit, n int64, at time.Time) limiter.Decision {
		clk.Set(at)
		d, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: n})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// 50 keys with an hour-long window, nearly spent.
	for i := range 50 {
		req("hot"+strconv.Itoa(i), long, 99, now)
	}
	for i := range 5 * maxKeys {
		req("cold"+strconv.Itoa(i), short, 1, now.Add(time.Duration(i)*time.Microsecond))
		if got := s.Len(); got > maxKeys {
			t.Fatalf("Len = %d after %d inserts, above the bound %d", got, i+1, maxKeys)
		}
	}
	kept := 0
	for i := range 50 {
		if d := req("hot"+strconv.Itoa(i), long, 0, now); d.Remaining == 1 {
			kept++
		}
	}
	// Eviction samples 8 slots, so a hot key survives unless 8 hot keys
	// sit together; nearly all must survive 5000 cold inserts.
	if kept < 45 {
		t.Fatalf("%d of 50 busy keys survived eviction, want nearly all", kept)
	}
}

// TestSlidingLogMemoryReleased: a SlidingLog key's log is freed when the
// key expires or is deleted, and a key can switch algorithms.
func TestSlidingLogSwitchAndRelease(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	clk := limitertest.NewClock(now)
	s := newStore(t, memstore.WithShards(1), memstore.WithClock(clk.Now))
	logL := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 3, Period: time.Second}
	tb := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Period: time.Second}
	do := func(l limiter.Limit, n int64, at time.Time) limiter.Decision {
		clk.Set(at)
		d, _, err := s.Take(t.Context(), limiter.Request{Key: "k", Limit: l, Cost: n})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	do(logL, 3, now)
	if d := do(logL, 1, now); d.Allowed {
		t.Fatal("fourth log request admitted")
	}
	// Switching algorithm starts afresh, in both directions.
	if d := do(tb, 3, now); !d.Allowed {
		t.Fatalf("token bucket after log = %v", d)
	}
	if d := do(logL, 3, now); !d.Allowed {
		t.Fatalf("log after token bucket = %v", d)
	}
	if got := s.Len(); got != 1 {
		t.Fatalf("Len = %d, want 1", got)
	}
	if got := s.Sweep(now.Add(time.Hour)); got != 1 {
		t.Fatalf("Sweep = %d, want 1", got)
	}
	if d := do(logL, 3, now.Add(time.Hour)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("log after expiry = %v", d)
	}
}

// TestConcurrentManyKeys hammers many keys from many goroutines; every key
// must admit exactly its capacity.
func TestConcurrentManyKeys(t *testing.T) {
	t.Parallel()
	s := newStore(t, memstore.WithShards(4), memstore.WithClock(limitertest.NewClock(time.Unix(1_700_000_000, 0)).Now))
	l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 5, Period: time.Hour}
	const keys, workers = 200, 16
	wins := make([]int64, keys)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 400 {
				k := rng.IntN(keys)
				d, _, err := s.Take(context.Background(), limiter.Request{Key: "k" + strconv.Itoa(k), Limit: l, Cost: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					wins[k]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for k, n := range wins {
		if n > 5 {
			t.Fatalf("key %d admitted %d, capacity 5", k, n)
		}
	}
}

// TestHeapPerKey measures the heap one million keys take, index included,
// with runtime.MemStats, and asserts the 128-byte bound. It is not
// parallel so that no other test allocates meanwhile.
//
// Every fixed-size algorithm uses the same 32-byte slot; TokenBucket and
// SlidingWindow (which packs two counts into one word) stand for them.
// SlidingLog is measured too, with its O(Requests) log: 3 requests per key
// at 3 instants hold 3 runs.
func TestHeapPerKey(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			perKey := heapPerKey(t, alg, 1_000_000, 1)
			t.Logf("%v: %.1f bytes of heap per key after 1M keys", alg, perKey)
			if perKey > 128 {
				t.Fatalf("%v: %.1f bytes per key, want at most 128", alg, perKey)
			}
		})
	}
	t.Run("SlidingLog", func(t *testing.T) {
		perKey := heapPerKey(t, limiter.SlidingLog, 100_000, 3)
		t.Logf("SlidingLog: %.1f bytes of heap per key holding 3 runs, after 100k keys", perKey)
		// Slot (at most 73) + Log (40) + a run buffer of capacity 4 (64).
		if perKey > 73+40+64+8 {
			t.Fatalf("SlidingLog: %.1f bytes per key holding 3 runs, want at most 185", perKey)
		}
	})
}

func heapPerKey(tb testing.TB, alg limiter.Algorithm, keys, requests int) float64 {
	l := limiter.Limit{Algorithm: alg, Requests: 100, Period: time.Minute}
	now := time.Unix(1_700_000_000, 0)
	var at time.Time
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := memstore.New(memstore.WithMaxKeys(keys), memstore.WithClock(func() time.Time { return at }))
	if err != nil {
		tb.Fatal(err)
	}
	buf := make([]byte, 0, 32)
	for i := range keys {
		buf = strconv.AppendInt(append(buf[:0], "policy-uid:rule:"...), int64(i), 10)
		for r := range requests {
			at = now.Add(time.Duration(r) * time.Millisecond)
			if _, _, err := s.Take(context.Background(), limiter.Request{Key: string(buf), Limit: l, Cost: 1}); err != nil {
				tb.Fatal(err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := s.Len(); got != keys {
		tb.Fatalf("Len = %d, want %d", got, keys)
	}
	perKey := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(keys)
	runtime.KeepAlive(s)
	return perKey
}

func ExampleStore_Take() {
	// A clock that stands still, so that the output is the same on every
	// run; leave WithClock out for time.Now.
	now := time.Unix(1_700_000_000, 0)
	s, err := memstore.New(memstore.WithMaxKeys(100_000), memstore.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 2, Period: time.Second}
	for range 3 {
		d, _, _ := s.Take(context.Background(), limiter.Request{Key: "user:42", Limit: l, Cost: 1})
		fmt.Println(d)
	}
	// Output:
	// {allow limit=2 remaining=1 reset=500ms retry=0s}
	// {allow limit=2 remaining=0 reset=1s retry=0s}
	// {deny limit=2 remaining=0 reset=1s retry=500ms}
}

// TestExistingKeyAllocatesNothing: a decision on a key that has state makes
// no heap allocation, for every fixed-size algorithm.
func TestExistingKeyAllocatesNothing(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow} {
		now := time.Unix(1_700_000_000, 0)
		s := newStore(t, memstore.WithClock(func() time.Time { return now }))
		l := limiter.Limit{Algorithm: alg, Requests: 1000, Period: time.Hour}
		req := limiter.Request{Key: "fg:{uid:rule:0123456789abcdef}:" + alg.String(), Limit: l, Cost: 1}
		ctx := context.Background()
		if _, _, err := s.Take(ctx, req); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(500, func() {
			now = now.Add(time.Millisecond)
			if _, _, err := s.Take(ctx, req); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%v: %v allocations per decision on an existing key, want 0", alg, allocs)
		}
	}
}

// TestEvictionKeepsKeysInUse: a flood of new keys on a long-window rule
// must not evict the keys of a short-window rule that clients keep using:
// evicting them resets their counts (the bypass of issue 18: eviction took
// the soonest-expiring key, which is the busy short-window one).
func TestEvictionKeepsKeysInUse(t *testing.T) {
	t.Parallel()
	const maxKeys = 1000
	now := time.Unix(1_700_000_000, 0)
	clk := limitertest.NewClock(now)
	s := newStore(t, memstore.WithMaxKeys(maxKeys), memstore.WithShards(4), memstore.WithClock(clk.Now))
	short := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Period: time.Second}
	long := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1000, Period: 24 * time.Hour}
	take := func(key string, l limiter.Limit, n int64) limiter.Decision {
		d, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: n})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	const active = 100
	for i := range active {
		take("active"+strconv.Itoa(i), short, 1)
	}
	// The flood: 20 new keys for every request of each active client, all
	// within one second, so no count expires.
	for round := range 100 {
		clk.Set(now.Add(time.Duration(round) * 5 * time.Millisecond))
		for i := range active {
			take("active"+strconv.Itoa(i), short, 0)
		}
		for i := range 20 * active / 10 {
			take("flood"+strconv.Itoa(round*1000+i), long, 1)
			if got := s.Len(); got > maxKeys {
				t.Fatalf("Len = %d, above the bound %d", got, maxKeys)
			}
		}
	}
	kept := 0
	for i := range active {
		if d := take("active"+strconv.Itoa(i), short, 0); d.Remaining == 9 {
			kept++
		}
	}
	if kept != active {
		t.Fatalf("%d of %d keys in use kept their counts through the flood, want all", kept, active)
	}
}

// TestEvictionPrefersIdleKeys: at the bound, a key whose count has expired
// goes before any key with a live count.
func TestEvictionPrefersIdleKeys(t *testing.T) {
	t.Parallel()
	const maxKeys = 64
	now := time.Unix(1_700_000_000, 0)
	clk := limitertest.NewClock(now)
	s := newStore(t, memstore.WithMaxKeys(maxKeys), memstore.WithShards(1), memstore.WithClock(clk.Now))
	short := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Period: time.Second}
	long := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Period: time.Hour}
	take := func(key string, l limiter.Limit, n int64) limiter.Decision {
		d, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: n})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Half the keys have counts that expire; the other half live on.
	for i := range maxKeys / 2 {
		take("idle"+strconv.Itoa(i), short, 1)
		take("live"+strconv.Itoa(i), long, 1)
	}
	clk.Set(now.Add(10 * time.Second))
	for i := range maxKeys / 2 {
		take("new"+strconv.Itoa(i), long, 1)
	}
	for i := range maxKeys / 2 {
		if d := take("live"+strconv.Itoa(i), long, 0); d.Remaining != 9 {
			t.Errorf("live%d lost its count while idle keys were there to evict", i)
		}
	}
}

// TestLeaseConformance runs the lease suite against the memory store.
func TestLeaseConformance(t *testing.T) {
	t.Parallel()
	limitertest.RunLease(t, func(t *testing.T, now func() time.Time) limitertest.LeaseStore { return newStore(t, clocked(now)...) })
}

// TestLeaseConformanceTinyShards runs the lease suite on one shard.
func TestLeaseConformanceTinyShards(t *testing.T) {
	t.Parallel()
	limitertest.RunLease(t, func(t *testing.T, now func() time.Time) limitertest.LeaseStore {
		return newStore(t, clocked(now, memstore.WithShards(1))...)
	})
}
