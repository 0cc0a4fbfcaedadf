package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

var benchCases = []struct {
	name string
	lim  limiter.Limit
	keys int
}{
	{"hot-allowed", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: limiter.MaxRequests, Period: time.Second}, 1},
	{"hot-denied", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1, Period: time.Hour}, 1},
	{"cold-keys", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second}, 1 << 20},
}

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
