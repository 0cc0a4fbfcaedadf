package redisstore_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

// benchCallers is the number of concurrent callers of the parallel
// benchmarks, as in the acceptance harness (cmd/floodgate-storebench).
const benchCallers = 64

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench-policy:rule:%016x", rand.Uint64())
	}
	return keys
}

// BenchmarkTake measures decisions through the store on the shared
// 3-master cluster with 64 concurrent callers, batched and not, against a
// plain go-redis ClusterClient running the same script with EvalSha, one
// call per decision, in the same run. The cluster shares the machine with
// the benchmark; cmd/floodgate-storebench pins them apart.
func BenchmarkTake(b *testing.B) {
	keys := benchKeys(10000)
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1_000_000_000, Period: time.Hour}
	par := max(1, benchCallers/runtime.GOMAXPROCS(0))
	for _, mode := range []struct {
		name   string
		window time.Duration
	}{{"batched", redisstore.DefaultBatchWindow}, {"window=0", 0}} {
		b.Run(mode.name, func(b *testing.B) {
			s := newStore(b, cluster, redisstore.Options{Timeout: time.Second, BatchWindow: mode.window})
			b.ReportAllocs()
			b.SetParallelism(par)
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
				for pb.Next() {
					if _, _, err := s.Take(b.Context(), limiter.Request{Key: keys[rng.IntN(len(keys))], Limit: l, Cost: 1}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	b.Run("go-redis-evalsha", func(b *testing.B) {
		p, err := limiter.NewParams(l)
		if err != nil {
			b.Fatal(err)
		}
		src, _, _, _ := redislayout.TakeScript(limiter.TokenBucket)
		script := redis.NewScript(src)
		cc := cluster.NewClient()
		defer func() { _ = cc.Close() }()
		args := make([]any, 0, 10)
		for _, a := range redisstore.ScriptArgs(p, -1, 1) {
			args = append(args, a)
		}
		b.ReportAllocs()
		b.SetParallelism(par)
		b.RunParallel(func(pb *testing.PB) {
			rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
			for pb.Next() {
				key := redislayout.CounterKey(keys[rng.IntN(len(keys))], limiter.TokenBucket)
				if err := script.Run(b.Context(), cc, []string{key}, args...).Err(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
