package gatewayconfig_test

import (
	"context"
	"net/http"
	"net/netip"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/envoyemu"
	"github.com/floodgate-dev/floodgate/test/rlstest"
)

// roundTripPolicy reads headers only through a condition and a key
// expression: the generated route actions must send them all the same.
const roundTripPolicy = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: api
  namespace: shop
  uid: api-1
  rules:
  - name: free-tier
    match:
      hosts: [api.example.com]
      when: ["request.headers['x-tier'] == 'free'"]
    keys:
    - [{header: X-Tenant}]
    - [{expression: "request.headers['x-user']"}]
    onMissingKey: Skip
    limit: {requests: 2, per: 1h, algorithm: FixedWindow}
`

// TestGeneratedActionsCarryWhatTheRulesRead turns sample requests into
// descriptors with the route actions generated for a policy (through the
// model of Envoy's descriptor population) and asks the central service's
// decision about them: a condition and a key alternative that read headers
// by name see the headers, as a sidecar would.
func TestGeneratedActionsCarryWhatTheRulesRead(t *testing.T) {
	t.Parallel()
	c, err := config.Load([]byte(roundTripPolicy))
	if err != nil {
		t.Fatal(err)
	}
	s := rlstest.Serve(t, c)

	rl := gatewayconfig.RateLimit(gatewayconfig.PolicyFor(&c.Policies[0]))
	if err := rl.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	ask := func(host string, headers ...string) string {
		h := http.Header{}
		for i := 0; i+1 < len(headers); i += 2 {
			h.Set(headers[i], headers[i+1])
		}
		call, err := envoyemu.Call(config.GatewayDomain, []*routev3.RateLimit{rl}, gatewayconfig.Stage, &envoyemu.Request{
			Method: http.MethodGet, Target: "/items", Authority: host, Headers: h, Client: netip.MustParseAddr("203.0.113.7"),
		})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.ShouldRateLimit(context.Background(), call)
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode().String()
	}
	ok, over := rlsv3.RateLimitResponse_OK.String(), rlsv3.RateLimitResponse_OVER_LIMIT.String()
	for i, tc := range []struct {
		host    string
		headers []string
		want    string
	}{
		{"api.example.com", []string{"X-Tier", "free", "X-User", "u1"}, ok},
		{"api.example.com", []string{"X-Tier", "free", "X-User", "u1"}, ok},
		{"api.example.com", []string{"X-Tier", "free", "X-User", "u1"}, over},
		{"api.example.com", []string{"X-Tier", "free", "X-User", "u2"}, ok},                   // another user, keyed by the expression
		{"api.example.com", []string{"X-Tier", "free", "X-Tenant", "t1", "X-User", "u1"}, ok}, // the first alternative wins
		{"api.example.com", []string{"X-Tier", "paid", "X-User", "u1"}, ok},                   // the condition does not hold
		{"api.example.com", []string{"X-User", "u1"}, ok},                                     // nor without the header
		{"www.example.com", []string{"X-Tier", "free", "X-User", "u1"}, ok},                   // another host
	} {
		if got := ask(tc.host, tc.headers...); got != tc.want {
			t.Errorf("request %d (%s %q) = %s, want %s", i, tc.host, tc.headers, got, tc.want)
		}
	}
}
