package limiter_test

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// BenchmarkAllowN measures one decision of the pure algorithms on a single
// key, next to golang.org/x/time/rate's AllowN with the same rate and burst.
func BenchmarkAllowN(b *testing.B) {
	for _, alg := range allAlgorithms {
		b.Run(alg.String(), func(b *testing.B) {
			l := limiter.Limit{Algorithm: alg, Requests: 100, Period: time.Second}
			lim, err := limiter.New(l)
			if err != nil {
				b.Fatal(err)
			}
			now := time.Unix(1_700_000_000, 0)
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(10 * time.Millisecond)
				if _, err := lim.AllowN(now, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("x-time-rate", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(100), 100)
		now := time.Unix(1_700_000_000, 0)
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(10 * time.Millisecond)
			lim.AllowN(now, 1)
		}
	})
}
