package envoyrls_test

import (
	"context"
	"strconv"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/test/rlstest"
)

// benchGatewayPolicy is benchPolicy as the central rate-limit service's
// compiled document has it: a policy with a targetRef, whose rules a
// gateway's request descriptors are decided on.
const benchGatewayPolicy = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: bench
  namespace: bench
  uid: bench
  rules:
  - name: user
    match: {path: {type: Prefix, value: /api}}
    key: [{header: X-User}]
    limit: {requests: 1000000000, per: 1h, algorithm: FixedWindow}
  - name: flood
    match: {path: {type: Exact, value: /flood}}
    key: [{header: X-User}]
    limit: {requests: 10, per: 1h, algorithm: FixedWindow}
`

// requestCall is the call a gateway sends for one request to path by user.
func requestCall(path, user string) *rlsv3.RateLimitRequest {
	return req(config.GatewayDomain, rd("bench/bench", "GET", path, "10.0.0.7", "X-User: "+user, "User-Agent: bench"))
}

// BenchmarkShouldRateLimitRequest is BenchmarkShouldRateLimit's cases as
// request descriptors: the central rate-limit service's decision, which
// also rebuilds the request and matches and keys it as the proxy does.
func BenchmarkShouldRateLimitRequest(b *testing.B) {
	cases := []struct {
		name string
		req  func(i int) *rlsv3.RateLimitRequest
	}{
		{"hot-allowed", func(int) *rlsv3.RateLimitRequest { return requestCall("/api/items", "hot") }},
		{"hot-denied", func(int) *rlsv3.RateLimitRequest { return requestCall("/flood", "hot") }},
		{"cold", func(i int) *rlsv3.RateLimitRequest { return requestCall("/api/items", "c"+strconv.Itoa(i)) }},
		{"unmatched", func(int) *rlsv3.RateLimitRequest { return requestCall("/other", "x") }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			s := benchRequestServer(b)
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

func benchRequestServer(b *testing.B) *envoyrls.Server {
	b.Helper()
	c, err := config.Load([]byte(benchGatewayPolicy))
	if err != nil {
		b.Fatal(err)
	}
	return rlstest.Serve(b, c)
}
