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

// grpcPolicy limits one method of a gRPC service, and the whole of
// another service, by their paths: a gRPC call is an HTTP/2 POST to
// /<package>.<Service>/<Method>.
const grpcPolicy = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: orders
  namespace: shop
  uid: orders-1
  rules:
  - name: create
    match:
      path: {type: Exact, value: /shop.v1.Orders/Create}
      methods: [POST]
    key: [{header: X-Api-Key}]
    limit: {requests: 3, per: 1h, algorithm: FixedWindow}
  - name: admin
    match:
      path: {type: Prefix, value: /shop.v1.Admin}
    key: [{header: X-Api-Key}]
    limit: {requests: 1, per: 1h, algorithm: FixedWindow}
`

// TestGRPCMethodsRoundTrip sends gRPC calls, as a gateway describes them
// with the generated route actions, to the central service: a method
// limited on its own is refused exactly past its limit while the
// service's other methods are not, and a service-wide rule covers every
// method of that service and of no other whose name starts alike.
func TestGRPCMethodsRoundTrip(t *testing.T) {
	t.Parallel()
	c, err := config.Load([]byte(grpcPolicy))
	if err != nil {
		t.Fatal(err)
	}
	s := rlstest.Serve(t, c)
	rl := gatewayconfig.RateLimit(gatewayconfig.PolicyFor(&c.Policies[0]))
	if err := rl.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	call := func(method, key string) string {
		h := http.Header{"Content-Type": []string{"application/grpc"}, "Te": []string{"trailers"}, "X-Api-Key": []string{key}}
		req, err := envoyemu.Call(config.GatewayDomain, []*routev3.RateLimit{rl}, gatewayconfig.Stage, &envoyemu.Request{
			Method: http.MethodPost, Target: method, Authority: "grpc.example.com", Scheme: "https", Headers: h,
			Client: netip.MustParseAddr("203.0.113.7"),
		})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode().String()
	}
	ok, over := rlsv3.RateLimitResponse_OK.String(), rlsv3.RateLimitResponse_OVER_LIMIT.String()
	for i, tc := range []struct {
		method, key, want string
	}{
		{"/shop.v1.Orders/Create", "k1", ok},
		{"/shop.v1.Orders/Create", "k1", ok},
		{"/shop.v1.Orders/Create", "k1", ok},
		{"/shop.v1.Orders/Create", "k1", over},
		{"/shop.v1.Orders/Get", "k1", ok},         // another method of the service
		{"/shop.v1.Orders/Get", "k1", ok},         //
		{"/shop.v1.Orders/Get", "k1", ok},         //
		{"/shop.v1.Orders/Get", "k1", ok},         //
		{"/shop.v1.Orders/CreateBatch", "k1", ok}, // Exact: not a method whose name starts alike
		{"/shop.v2.Orders/Create", "k1", ok},      // nor the method of another package
		{"/shop.v1.Orders/Create", "k2", ok},      // another key
		{"/shop.v1.Admin/Purge", "k1", ok},
		{"/shop.v1.Admin/Reindex", "k1", over},           // any method of the service
		{"/shop.v1.AdminAudit/Read", "k1", ok},           // Prefix takes whole path elements
		{"/shop.v1.AdminAudit/Read", "k1", ok},           //
		{"/shop.v1.Orders/Create", "k1", over},           // still over
		{"/shop.v1.Admin/Purge/extra", "k1", over},       // a deeper path is still the service's
		{"/grpc.health.v1.Health/Check", "k1", ok},       // another service
		{"/grpc.health.v1.Health/Check", "k1", ok},       //
		{"/grpc.health.v1.Health/Check", "k1", ok},       //
		{"/grpc.health.v1.Health/Check", "k1", ok},       //
		{"/grpc.health.v1.Health/Check", "k1", ok},       //
		{"/grpc.health.v1.Health/Check", "k3", ok},       //
		{"/shop.v1.Orders/Create", "k3", ok},             //
		{"/shop.v1.Orders/Create?x=1", "k3", ok},         // a query (never sent by gRPC) is not the path
		{"/shop.v1.Orders/Create", "k3", ok},             //
		{"/shop.v1.Orders/Create", "k3", over},           //
		{"/shop.v1.orders/create", "k3", over},           // paths compare without regard to case: a name differing only in case counts too
		{"/shop.v1.Orders/Create/../Create", "k3", over}, // the path is cleaned, as a sidecar cleans it
	} {
		if got := call(tc.method, tc.key); got != tc.want {
			t.Errorf("call %d (%s, key %s) = %s, want %s", i, tc.method, tc.key, got, tc.want)
		}
	}
}
