package memstore_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// The benchmarks compare a keyed decision with golang.org/x/time/rate's
// AllowN on a single Limiter, in the same run, so the ratio can be read
// directly. The store's clock is one the benchmark moves itself, and
// AllowN takes its time as a parameter, so neither side pays for reading
// the system clock.
//
// The serial benchmarks also report cpu-ns/op, the process CPU time per
// operation: on a machine shared with other work, wall-clock ns/op counts
// the time the benchmark waited for a CPU, and cpu-ns/op does not.

// cpuTime returns the CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per operation since start.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

const manyKeys = 1_000_000

var benchLimit = limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second, Burst: 100}

// keyedLimit is the limit of the 1M-key benchmarks: slow enough that no
// key's state expires during a run, so every decision is on an existing key.
var keyedLimit = limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1000, Period: time.Hour, Burst: 1000}

var keyedBase = time.Unix(1_700_000_000, 0)

// serialClock is a store clock for one goroutine, which moves it before
// each decision: a read is a load and a conversion.
type serialClock struct{ us int64 }

func (c *serialClock) Now() time.Time { return time.UnixMicro(c.us) }

// sharedClock is a store clock for several goroutines. Reads are atomic
// loads; the goroutines move it in steps of many decisions, so that they
// rarely write the same cache line.
type sharedClock struct{ us atomic.Int64 }

func newSharedClock(t time.Time) *sharedClock {
	c := &sharedClock{}
	c.us.Store(t.UnixMicro())
	return c
}

func (c *sharedClock) Now() time.Time { return time.UnixMicro(c.us.Load()) }

// clockStep is how many decisions a goroutine makes between two moves of
// a sharedClock.
const clockStep = 64

// keyed is a store holding manyKeys keys and the keys in a random order,
// laid out in memory in that order, so that the slot a decision touches is
// random but reading the next key is not.
type keyed struct {
	store *memstore.Store
	clock *sharedClock
	keys  []string
}

var (
	keyedOnce = map[limiter.Algorithm]*sync.Once{}
	keyedSets = map[limiter.Algorithm]*keyed{}
	keyedMu   sync.Mutex
)

// keyedStore builds, once per algorithm and process, a store with manyKeys
// keys.
func keyedStore(b *testing.B, l limiter.Limit) *keyed {
	keyedMu.Lock()
	once, ok := keyedOnce[l.Algorithm]
	if !ok {
		once = new(sync.Once)
		keyedOnce[l.Algorithm] = once
	}
	keyedMu.Unlock()
	once.Do(func() {
		clk := newSharedClock(keyedBase)
		s, err := memstore.New(memstore.WithMaxKeys(manyKeys), memstore.WithClock(clk.Now))
		if err != nil {
			b.Fatal(err)
		}
		order := rand.New(rand.NewPCG(1, 2)).Perm(manyKeys)
		keys := make([]string, manyKeys)
		for i, k := range order {
			keys[i] = "fg:policy:rule:" + strconv.Itoa(k)
		}
		for _, k := range keys {
			if _, _, err := s.Take(context.Background(), limiter.Request{Key: k, Limit: l, Cost: 1}); err != nil {
				b.Fatal(err)
			}
		}
		keyedMu.Lock()
		keyedSets[l.Algorithm] = &keyed{store: s, clock: clk, keys: keys}
		keyedMu.Unlock()
	})
	keyedMu.Lock()
	defer keyedMu.Unlock()
	return keyedSets[l.Algorithm]
}

// BenchmarkTake is a decision on an existing key.
func BenchmarkTake(b *testing.B) {
	b.Run("1key", func(b *testing.B) {
		clk := &serialClock{us: keyedBase.UnixMicro()}
		s, err := memstore.New(memstore.WithClock(clk.Now))
		if err != nil {
			b.Fatal(err)
		}
		req := limiter.Request{Key: "fg:policy:rule:42", Limit: benchLimit, Cost: 1}
		ctx := context.Background()
		b.ReportAllocs()
		start := cpuTime()
		for b.Loop() {
			clk.us += 10_000 // 10ms: a token
			if _, _, err := s.Take(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, start)
	})
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow} {
		b.Run("1Mkeys-random/"+alg.String(), func(b *testing.B) {
			l := keyedLimit
			l.Algorithm = alg
			if alg != limiter.TokenBucket && alg != limiter.GCRA {
				l.Burst = 0
			}
			ks := keyedStore(b, l)
			ctx := context.Background()
			req := limiter.Request{Limit: l, Cost: 1}
			i := 0
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				req.Key = ks.keys[i]
				if i++; i == manyKeys {
					i = 0
				}
				ks.clock.us.Add(1)
				if _, _, err := ks.store.Take(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkTakeZipf is a decision on 1M existing keys drawn from a Zipf
// distribution (s = 1.1), closer to real traffic, where a few keys are hot.
func BenchmarkTakeZipf(b *testing.B) {
	ks := keyedStore(b, keyedLimit)
	z := rand.NewZipf(rand.New(rand.NewPCG(5, 6)), 1.1, 1, manyKeys-1)
	seq := make([]uint32, 1<<20)
	for i := range seq {
		seq[i] = uint32(z.Uint64())
	}
	ctx := context.Background()
	req := limiter.Request{Limit: keyedLimit, Cost: 1}
	i := 0
	b.ReportAllocs()
	start := cpuTime()
	for b.Loop() {
		req.Key = ks.keys[seq[i]]
		if i++; i == len(seq) {
			i = 0
		}
		ks.clock.us.Add(1)
		if _, _, err := ks.store.Take(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, start)
}

// BenchmarkTakeParallel is BenchmarkTake from GOMAXPROCS goroutines.
func BenchmarkTakeParallel(b *testing.B) {
	b.Run("1key", func(b *testing.B) {
		clk := newSharedClock(keyedBase)
		s, err := memstore.New(memstore.WithClock(clk.Now))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			req := limiter.Request{Key: "fg:policy:rule:42", Limit: benchLimit, Cost: 1}
			ctx := context.Background()
			for i := 0; pb.Next(); i++ {
				if i%clockStep == 0 {
					clk.us.Add(clockStep * 10_000) // 10ms a decision: a token each
				}
				if _, _, err := s.Take(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("1Mkeys-random", func(b *testing.B) {
		ks := keyedStore(b, keyedLimit)
		var worker atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := int(worker.Add(1)) * 7919 % manyKeys
			ctx := context.Background()
			req := limiter.Request{Limit: keyedLimit, Cost: 1}
			for n := 0; pb.Next(); n++ {
				req.Key = ks.keys[i]
				if i++; i == manyKeys {
					i = 0
				}
				if n%clockStep == 0 {
					ks.clock.us.Add(clockStep) // 1µs a decision
				}
				if _, _, err := ks.store.Take(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkXTimeRateAllowN is the reference: golang.org/x/time/rate's
// AllowN on one Limiter with the same rate and burst.
func BenchmarkXTimeRateAllowN(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(100), 100)
		now := time.Unix(1_700_000_000, 0)
		b.ReportAllocs()
		start := cpuTime()
		for b.Loop() {
			now = now.Add(10 * time.Millisecond)
			lim.AllowN(now, 1)
		}
		reportCPU(b, start)
	})
	b.Run("parallel", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(100), 100)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			now := time.Unix(1_700_000_000, 0)
			for pb.Next() {
				now = now.Add(10 * time.Millisecond)
				lim.AllowN(now, 1)
			}
		})
	})
}

// BenchmarkHeapPerKey reports the heap per key after 1M keys.
func BenchmarkHeapPerKey(b *testing.B) {
	for b.Loop() {
		b.ReportMetric(heapPerKey(b, limiter.TokenBucket, manyKeys, 1), "B/key")
	}
}

// BenchmarkMemoryFloor is the hardware floor under the 1M-key benchmarks,
// over 64 MB of written memory (what a million keys' tables occupy):
//
//   - independent: a locked read-modify-write of a random 32-byte slot per
//     operation with nothing else, so the CPU overlaps many misses;
//   - dependent: each slot's address depends on the previous slot's
//     content (a random cycle), so every miss is paid in full, as in a
//     decision whose few hundred instructions keep the next miss from
//     starting early.
func BenchmarkMemoryFloor(b *testing.B) {
	type slot struct {
		h, a uint64
		_    [2]uint64 // 32 bytes, as a memstore slot
	}
	table := make([]slot, 2<<20)
	rng := rand.New(rand.NewPCG(3, 4))
	perm := rng.Perm(len(table))
	for i := range perm {
		table[perm[i]].h = uint64(perm[(i+1)%len(perm)])
	}
	idx := make([]uint32, 1<<20)
	for i := range idx {
		idx[i] = uint32(rng.IntN(len(table)))
	}
	b.Run("independent", func(b *testing.B) {
		var mu sync.Mutex
		i := 0
		b.ReportAllocs()
		start := cpuTime()
		for b.Loop() {
			mu.Lock()
			table[idx[i]].a++
			mu.Unlock()
			if i++; i == len(idx) {
				i = 0
			}
		}
		reportCPU(b, start)
	})
	b.Run("dependent", func(b *testing.B) {
		var mu sync.Mutex
		j := uint64(perm[0])
		b.ReportAllocs()
		start := cpuTime()
		for b.Loop() {
			mu.Lock()
			table[j].a++
			j = table[j].h
			mu.Unlock()
		}
		reportCPU(b, start)
	})
}
