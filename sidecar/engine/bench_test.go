package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

var benchCases = []struct {
	name string
	lim  limiter.Limit
	keys int
}{
	{"hot-allowed", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: limiter.MaxRequests, Period: time.Second}, 1},
	{"hot-denied", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1, Period: time.Hour}, 1},
	{"cold-keys", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second}, 1 << 20},
	{"hot-allowed-leased", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: limiter.MaxRequests, Period: time.Second}, 1},
	// onExceed: Delay: every decision reserves the next slot with a wait
	// (the loop outruns a million a second), or is denied past maxDelay
	// and then from the deny cache.
	{"hot-delayed", limiter.Limit{Algorithm: limiter.GCRA, Requests: 1_000_000, Period: time.Second, Burst: 1, MaxDelay: time.Minute}, 1},
	{"hot-delay-denied", limiter.Limit{Algorithm: limiter.GCRA, Requests: 1, Period: time.Hour, Burst: 1, MaxDelay: time.Millisecond}, 1},
}

// leased reports whether a bench case's rule takes leases on its hot keys.
func leased(name string) bool { return strings.HasSuffix(name, "-leased") }

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("uid:r:%032x", i)
	}
	return keys
}

// BenchmarkDecide is the engine's hot path on the in-memory store: one rule,
// one key per request, deny cache and metrics included.
func BenchmarkDecide(b *testing.B) {
	for _, tc := range benchCases {
		if leased(tc.name) {
			continue // leases are a Redis store matter
		}
		b.Run(tc.name, func(b *testing.B) {
			st, err := memstore.New()
			if err != nil {
				b.Fatal(err)
			}
			m := metrics.NewMetrics(prometheus.NewRegistry())
			e, err := New(Options{Store: st, Fallback: st, Metrics: m})
			if err != nil {
				b.Fatal(err)
			}
			r, err := NewRule("p", "r", tc.lim, 1, false, false, m)
			if err != nil {
				b.Fatal(err)
			}
			keys := benchKeys(tc.keys)
			hits := []Hit{{Rule: r, Cost: 1}}
			var v Verdict
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				hits[0].Key = keys[i%len(keys)]
				i++
				e.Decide(ctx, hits, &v)
			}
		})
	}
}

// BenchmarkDecideParallel runs Decide from GOMAXPROCS goroutines.
func BenchmarkDecideParallel(b *testing.B) {
	for _, tc := range benchCases {
		if leased(tc.name) {
			continue // leases are a Redis store matter
		}
		b.Run(tc.name, func(b *testing.B) {
			st, err := memstore.New()
			if err != nil {
				b.Fatal(err)
			}
			m := metrics.NewMetrics(prometheus.NewRegistry())
			e, err := New(Options{Store: st, Fallback: st, Metrics: m})
			if err != nil {
				b.Fatal(err)
			}
			r, err := NewRule("p", "r", tc.lim, 1, false, false, m)
			if err != nil {
				b.Fatal(err)
			}
			keys := benchKeys(tc.keys)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				hits := []Hit{{Rule: r, Cost: 1}}
				var v Verdict
				i := 0
				for pb.Next() {
					hits[0].Key = keys[i%len(keys)]
					i++
					e.Decide(context.Background(), hits, &v)
				}
			})
		})
	}
}

// BenchmarkReferenceXTimeRate is the yardstick: a mutex-guarded map of
// golang.org/x/time/rate limiters, the simplest keyed limiter in Go, with
// none of the engine's metrics, deny cache or store abstraction.
func BenchmarkReferenceXTimeRate(b *testing.B) {
	for _, tc := range benchCases {
		if leased(tc.name) {
			continue // leases are a Redis store matter
		}
		b.Run(tc.name, func(b *testing.B) {
			var mu sync.Mutex
			m := map[string]*rate.Limiter{}
			lim := rate.Limit(float64(tc.lim.Requests) / tc.lim.Period.Seconds())
			keys := benchKeys(tc.keys)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := keys[i%len(keys)]
				i++
				mu.Lock()
				l := m[k]
				if l == nil {
					l = rate.NewLimiter(lim, int(tc.lim.Capacity()))
					m[k] = l
				}
				mu.Unlock()
				l.Allow()
			}
		})
	}
}

// BenchmarkDecideRedis is BenchmarkDecide on a real 3-master Redis Cluster
// on loopback, set up as the sidecar sets it up (shard-labelled store
// metrics, parallel store calls), one decision at a time. Its time is
// mostly the round trip; its allocations are the engine's plus the store
// client's.
func BenchmarkDecideRedis(b *testing.B) {
	c := redistest.StartCluster(b, redistest.Options{Masters: 3})
	for _, tc := range benchCases {
		b.Run(tc.name, func(b *testing.B) {
			st, err := redisstore.New(redisstore.Options{Addrs: c.Addrs(), Password: c.Password(), BatchWindow: redisstore.DefaultBatchWindow})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = st.Close() })
			fb, err := memstore.New()
			if err != nil {
				b.Fatal(err)
			}
			m := metrics.NewMetrics(prometheus.NewRegistry())
			o := Options{Store: st, StoreName: "redis", Fallback: fb, Metrics: m, Parallel: true}
			if leased(tc.name) {
				o.Leases = &LeaseOptions{}
			}
			e, err := New(o)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = e.Close(context.Background()) })
			r, err := NewRule("p", "r", tc.lim, 1, false, false, m)
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Spread(leased(tc.name), 1, m); err != nil {
				b.Fatal(err)
			}
			run := fmt.Sprintf("%x:", time.Now().UnixNano())
			keys := benchKeys(min(tc.keys, 1<<16))
			for i := range keys {
				keys[i] = run + keys[i]
			}
			hits := []Hit{{Rule: r, Cost: 1}}
			var v Verdict
			ctx := context.Background()
			// Load the slot map and the scripts before measuring. On a
			// loaded machine the first calls can miss the 50ms deadline
			// while the connections are dialled: try again, on fresh keys.
			for try := 0; ; try++ {
				hits[0].Key = fmt.Sprintf("%swarm-%d", run, try)
				e.Decide(ctx, hits, &v)
				if v.Results[0].Source == FromStore {
					break
				}
				if try == 100 {
					b.Fatalf("warm-up decisions from %v, want the store", v.Results[0].Source)
				}
				time.Sleep(50 * time.Millisecond)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				hits[0].Key = keys[i%len(keys)]
				i++
				e.Decide(ctx, hits, &v)
			}
		})
	}
}

// BenchmarkShardMetrics is the per-store-call lookup of a shard's store
// metrics, for a store of three masters.
func BenchmarkShardMetrics(b *testing.B) {
	st, err := memstore.New()
	if err != nil {
		b.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	e, err := New(Options{Store: st, StoreName: "redis", Fallback: st, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	shards := []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if e.shardMetrics(shards[i%len(shards)]) == nil {
			b.Fatal("no shard metrics")
		}
		i++
	}
}
