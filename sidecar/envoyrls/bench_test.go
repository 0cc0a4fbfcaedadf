package envoyrls_test

import (
	"context"
	"strconv"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/envoyconfig"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
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
	c, _, err := envoyconfig.Load([]byte(benchPolicy), envoyconfig.Options{})
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.NewMetrics(reg)
	set, err := ruleset.Compile(c, nil, m)
	if err != nil {
		b.Fatal(err)
	}
	st, _ := memstore.New()
	fb, _ := memstore.New()
	eng, err := engine.New(engine.Options{Store: st, Fallback: fb, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	s, err := envoyrls.New(envoyrls.Options{Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	s.Install(eng, set)
	return s
}

func BenchmarkShouldRateLimit(b *testing.B) {
	cases := []struct {
		name string
		req  func(i int) *rlsv3.RateLimitRequest
	}{
		{"hot-allowed", func(int) *rlsv3.RateLimitRequest { return req("bench", d("user=hot")) }},
		{"hot-denied", func(int) *rlsv3.RateLimitRequest { return req("bench", d("flood=hot")) }},
		{"cold", func(i int) *rlsv3.RateLimitRequest { return req("bench", d("user=c"+strconv.Itoa(i))) }},
		{"unmatched", func(int) *rlsv3.RateLimitRequest { return req("bench", d("other=x")) }},
	}
	for _, tc := range cases {
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
