package envoyrls_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

const benchPolicy = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: flood
    rate_limit: {unit: hour, requests_per_unit: 10}
`

// benchServer is a Server on the in-memory store, called in process: the
// cost of the front and the engine without gRPC or a network.
func benchServer(b *testing.B) *envoyrls.Server {
	b.Helper()
	st, _ := memstore.New()
	return benchServerOn(b, st, "memory", false, false)
}

// benchServerOn is a Server on the given store, set up as the sidecar sets
// it up for that store; headers turns on its ResponseHeaders.
func benchServerOn(b *testing.B, st limiter.Store, name string, parallel, headers bool) *envoyrls.Server {
	b.Helper()
	c, _, err := rlsimport.Load([]byte(benchPolicy), rlsimport.Options{})
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.NewMetrics(reg)
	set, err := ruleset.Compile(c, nil, m)
	if err != nil {
		b.Fatal(err)
	}
	fb, _ := memstore.New()
	eng, err := engine.New(engine.Options{Store: st, StoreName: name, Fallback: fb, Metrics: m, Parallel: parallel})
	if err != nil {
		b.Fatal(err)
	}
	s, err := envoyrls.New(envoyrls.Options{Registerer: reg, ResponseHeaders: headers})
	if err != nil {
		b.Fatal(err)
	}
	s.Install(eng, set)
	return s
}

var benchCases = []struct {
	name string
	req  func(i int) *rlsv3.RateLimitRequest
}{
	{"hot-allowed", func(int) *rlsv3.RateLimitRequest { return req("bench", d("user=hot")) }},
	{"hot-denied", func(int) *rlsv3.RateLimitRequest { return req("bench", d("flood=hot")) }},
	{"cold", func(i int) *rlsv3.RateLimitRequest { return req("bench", d("user=c"+strconv.Itoa(i))) }},
	{"unmatched", func(int) *rlsv3.RateLimitRequest { return req("bench", d("other=x")) }},
}

func BenchmarkShouldRateLimit(b *testing.B) {
	for _, tc := range benchCases {
		b.Run(tc.name, func(b *testing.B) {
			s := benchServer(b)
			reqs := make([]*rlsv3.RateLimitRequest, 1024)
			for i := range reqs {
				reqs[i] = tc.req(i)
			}
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// The cold requests are built in the loop, as a new key
				// arrives; the others are reused.
				r := reqs[i%len(reqs)]
				if tc.name == "cold" {
					r = tc.req(i)
				}
				if _, err := s.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkShouldRateLimitHeaders is BenchmarkShouldRateLimit's hot keys
// with ResponseHeaders on (--grpc-response-headers): the cost of the
// rate-limit fields in response_headers_to_add.
func BenchmarkShouldRateLimitHeaders(b *testing.B) {
	for _, tc := range benchCases[:2] {
		b.Run(tc.name, func(b *testing.B) {
			st, _ := memstore.New()
			s := benchServerOn(b, st, "memory", false, true)
			r := tc.req(0)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkShouldRateLimitRedis is BenchmarkShouldRateLimit on a real
// 3-master Redis Cluster on loopback, one call at a time: it includes the
// store client's work and the round trip, so its allocations (not its
// time, which is mostly waiting) are the figure to compare.
func BenchmarkShouldRateLimitRedis(b *testing.B) {
	c := redistest.StartCluster(b, redistest.Options{Masters: 3})
	for _, tc := range benchCases {
		b.Run(tc.name, func(b *testing.B) {
			st, err := redisstore.New(redisstore.Options{Addrs: c.Addrs(), Password: c.Password()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = st.Close() })
			s := benchServerOn(b, st, "redis", true, false)
			ctx := context.Background()
			// Load the slot map and the scripts before measuring.
			if _, err := s.ShouldRateLimit(ctx, req("bench", d("user=warm"))); err != nil {
				b.Fatal(err)
			}
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			reqs := make([]*rlsv3.RateLimitRequest, 1024)
			for i := range reqs {
				reqs[i] = tc.req(i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// As in BenchmarkShouldRateLimit, only the cold requests
				// are built in the loop.
				r := reqs[i%len(reqs)]
				if tc.name == "cold" {
					r = req("bench", d("user="+run+"-"+strconv.Itoa(i)))
				}
				if _, err := s.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
