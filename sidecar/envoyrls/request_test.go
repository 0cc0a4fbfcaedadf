package envoyrls_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/proxy"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// gatewayDoc is a compiled document of the central rate-limit service:
// policies without a podSelector, told apart by namespace and name, with
// ordinary HTTP rules; the last policy is another namespace's with the
// same name, and a descriptor rule shares the call.
const gatewayDoc = `
apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: edge
  namespace: shop
  uid: edge-shop
  rules:
  - name: per-key
    match: {path: {type: Prefix, value: /api}, methods: [GET], headers: [{name: X-Tier, value: free}]}
    key: [{header: X-API-Key}]
    limit: {requests: 3, per: 1h}
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 5, per: 1h}
  - name: strict
    match: {path: {type: Exact, value: /strict}}
    key: [{header: X-Tenant}]
    onMissingKey: Reject
    limit: {requests: 100, per: 1h}
  - name: costly
    match: {path: {type: Exact, value: /batch}}
    key: [{query: tenant}]
    cost: {fromHeader: X-Cost, default: 1, max: 4}
    limit: {requests: 4, per: 1h}
- name: edge
  namespace: other
  uid: edge-other
  rules:
  - name: all
    key: [{method: {}}]
    limit: {requests: 1, per: 1h}
- name: legacy
  uid: legacy
  rules:
  - name: by-user
    match: {descriptors: {domain: floodgate, entries: [{key: user}]}}
    limit: {requests: 1, per: 1h}
`

// rd builds a request descriptor for policy id ("namespace/name") from
// the request's method, path with query, client address and headers.
func rd(id, method, pathQuery, client string, headers ...string) *rlcommonv3.RateLimitDescriptor {
	pairs := []string{config.PolicyEntryKey + "=" + id, config.AuthorityEntryKey + "=shop.example.com",
		config.MethodEntryKey + "=" + method, config.PathEntryKey + "=" + pathQuery}
	if client != "" {
		pairs = append(pairs, config.RemoteAddressEntryKey+"="+client)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		pairs = append(pairs, strings.ToLower(k)+"="+v)
	}
	return d(pairs...)
}

func TestRequestDescriptorExactCounts(t *testing.T) {
	t.Parallel()
	r := newRLS(t, gatewayDoc, setup{})
	call := func(ds ...*rlcommonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		return r.call(t, req(config.GatewayDomain, ds...))
	}
	// The per-key rule: 3 per hour per API key, only for GET /api... with
	// X-Tier: free. Paths are cleaned and decoded as the proxy does.
	paths := []string{"/api/items", "/api/../api/x", "//api/y", "/%61pi/z?x=1"}
	for i, p := range paths {
		out := call(rd("shop/edge", "GET", p, "10.0.0.1", "X-API-Key: k1", "X-Tier: free"))
		if got := out.Statuses[0].Code; got != ok && i < 3 {
			t.Fatalf("call %d (%s) = %v, want OK", i, p, got)
		}
		if i == 3 {
			if got := out.OverallCode; got != over {
				t.Fatalf("call 4 (%s) = %v, want OVER_LIMIT: the paths are one route", p, got)
			}
			if got, want := out.Statuses[0].CurrentLimit.GetName(), "edge.per-key"; got != want {
				t.Errorf("binding rule %q, want %q", got, want)
			}
		}
	}
	// Not matched: another tier, a POST, /apiv1 (Prefix is by path element).
	for _, dsc := range []*rlcommonv3.RateLimitDescriptor{
		rd("shop/edge", "GET", "/api/items", "10.0.0.2", "X-API-Key: k1", "X-Tier: paid"),
		rd("shop/edge", "POST", "/api/items", "10.0.0.3", "X-API-Key: k1", "X-Tier: free"),
		rd("shop/edge", "GET", "/apiv1", "10.0.0.4", "X-API-Key: k1", "X-Tier: free"),
	} {
		if got := call(dsc).OverallCode; got != ok {
			t.Errorf("%v = %v, want OK: the per-key rule does not match", dsc, got)
		}
	}
	// The per-ip rule counted the calls above of 10.0.0.1 that were
	// admitted: three (a denied call charges nothing), so two more are
	// admitted (on a path the per-key rule does not match).
	for i := range 3 {
		want := ok
		if i == 2 {
			want = over
		}
		if got := call(rd("shop/edge", "GET", "/other", "10.0.0.1")).OverallCode; got != want {
			t.Errorf("call %d of 10.0.0.1 = %v, want %v", 4+i, got, want)
		}
	}
	// The same name in another namespace is another policy.
	if got := call(rd("other/edge", "GET", "/", "10.0.0.9")).OverallCode; got != ok {
		t.Errorf("other/edge first call = %v, want OK", got)
	}
	if got := call(rd("other/edge", "GET", "/", "10.0.0.9")).OverallCode; got != over {
		t.Errorf("other/edge second call = %v, want OVER_LIMIT", got)
	}
	// A policy not in force: a bare OK.
	out := call(rd("shop/missing", "GET", "/", "10.0.0.9"))
	if out.OverallCode != ok || out.Statuses[0].CurrentLimit != nil {
		t.Errorf("unknown policy: %v, want a bare OK", out)
	}
}

func TestRequestDescriptorRejectsAndCosts(t *testing.T) {
	t.Parallel()
	r := newRLS(t, gatewayDoc, setup{headers: true})
	call := func(ds ...*rlcommonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		return r.call(t, req(config.GatewayDomain, ds...))
	}
	// onMissingKey Reject: OVER_LIMIT, and nothing is charged, not even
	// the per-ip rule.
	for range 3 {
		out := call(rd("shop/edge", "GET", "/strict", "10.1.0.1"))
		if out.OverallCode != over || out.Statuses[0].Code != over {
			t.Fatalf("a request without X-Tenant = %v, want OVER_LIMIT", out)
		}
		if len(out.ResponseHeadersToAdd) != 0 {
			t.Errorf("a rejected request carries rate-limit fields %v; no rule binds it", out.ResponseHeadersToAdd)
		}
	}
	for i := range 5 {
		if got := call(rd("shop/edge", "GET", "/strict", "10.1.0.1", "X-Tenant: t")).OverallCode; got != ok {
			t.Fatalf("call %d with X-Tenant = %v, want OK: the rejected calls charged the per-ip rule", i, got)
		}
	}
	// Cost from a header: 4 per hour per tenant.
	out := call(rd("shop/edge", "POST", "/batch?tenant=a", "10.1.0.2", "X-Cost: 3"))
	if out.OverallCode != ok {
		t.Fatalf("cost 3 = %v, want OK", out)
	}
	if got := headerValue(out, "X-RateLimit-Remaining"); got != "1" {
		t.Errorf("X-RateLimit-Remaining = %q, want 1 (4 - 3)", got)
	}
	if got := call(rd("shop/edge", "POST", "/batch?tenant=a", "10.1.0.3", "X-Cost: 2")).OverallCode; got != over {
		t.Errorf("cost 2 with 1 left = %v, want OVER_LIMIT", got)
	}
	if got := call(rd("shop/edge", "POST", "/batch?tenant=b", "10.1.0.4", "X-Cost: 5")).OverallCode; got != over {
		t.Errorf("cost 5 above max 4 = %v, want OVER_LIMIT (the proxy answers 400)", got)
	}
	if got := call(rd("shop/edge", "POST", "/batch?tenant=b", "10.1.0.4", "X-Cost: 4")).OverallCode; got != ok {
		t.Errorf("cost 4 for tenant b = %v, want OK: the refused call charged nothing", got)
	}
}

func headerValue(out *rlsv3.RateLimitResponse, name string) string {
	for _, h := range out.ResponseHeadersToAdd {
		if strings.EqualFold(h.Key, name) {
			return h.Value
		}
	}
	return ""
}

// A request descriptor and an ordinary descriptor in one call are one
// decision: when the ordinary one denies, the request's rules are not
// charged.
func TestRequestDescriptorSharesTheCallsDecision(t *testing.T) {
	t.Parallel()
	r := newRLS(t, gatewayDoc, setup{})
	mixed := req(config.GatewayDomain, rd("other/edge", "GET", "/", "10.2.0.1"), d("user=u1"))
	if got := r.call(t, mixed).OverallCode; got != ok {
		t.Fatalf("first mixed call = %v, want OK", got)
	}
	out := r.call(t, req(config.GatewayDomain, rd("shop/edge", "GET", "/x", "10.2.0.2"), d("user=u1")))
	if out.OverallCode != over || out.Statuses[1].Code != over || out.Statuses[0].Code != ok {
		t.Fatalf("second call = %v, want OVER_LIMIT from the user descriptor only", out)
	}
	// The per-ip rule of shop/edge was not charged by the denied call: 5
	// calls of 10.2.0.2 pass.
	for i := range 5 {
		if got := r.call(t, req(config.GatewayDomain, rd("shop/edge", "GET", "/x", "10.2.0.2"))).OverallCode; got != ok {
			t.Fatalf("call %d of 10.2.0.2 = %v, want OK", i, got)
		}
	}
}

func TestRequestDescriptorBounds(t *testing.T) {
	t.Parallel()
	r := newRLS(t, gatewayDoc, setup{})
	long := "/api/" + strings.Repeat("a", 40<<10)
	if got := r.call(t, req(config.GatewayDomain, rd("shop/edge", "GET", long, "10.3.0.1"))).OverallCode; got != ok {
		t.Errorf("a 40 KiB path = %v, want OK: a request Envoy passes on must not be refused as malformed", got)
	}
	if got, want := envoyrls.MaxEntries, 5+config.MaxRequestDescriptorHeaders; got < want {
		t.Errorf("a call may have %d entries per descriptor, a request descriptor up to %d", got, want)
	}
	ctx := context.Background()
	_, err := r.client.ShouldRateLimit(ctx, req(config.GatewayDomain, rd("shop/edge", "GET", "/"+strings.Repeat("a", envoyrls.MaxRequestValueLength), "10.3.0.1")))
	if err == nil || !strings.Contains(err.Error(), "value: at most") {
		t.Errorf("a path over %d bytes: %v, want INVALID_ARGUMENT naming the value", envoyrls.MaxRequestValueLength, err)
	}
}

// TestRequestDescriptorsDecideAsTheProxy sends the same requests to the
// HTTP proxy's decision (proxy.Check) and, as request descriptors, to the
// Envoy front, each on its own store, and compares every outcome: the
// central rate-limit service and a sidecar enforce one policy alike.
func TestRequestDescriptorsDecideAsTheProxy(t *testing.T) {
	t.Parallel()
	// One HTTP policy: the proxy applies every policy of its set, the
	// Envoy front the one a request descriptor names.
	doc := gatewayDoc[:strings.Index(gatewayDoc, "- name: edge\n  namespace: other")]
	r := newRLS(t, doc, setup{headers: true})
	px := newCheckProxy(t, doc)
	type request struct {
		method, target, client string
		headers                []string
	}
	var reqs []request
	for i := range 40 {
		client := fmt.Sprintf("10.9.0.%d", i%3)
		switch i % 5 {
		case 0:
			reqs = append(reqs, request{"GET", "/api/v1/items?x=1", client, []string{"X-API-Key: k" + fmt.Sprint(i%2), "X-Tier: free"}})
		case 1:
			reqs = append(reqs, request{"GET", "/a/../api", client, []string{"X-API-Key: k1", "X-Tier: free"}})
		case 2:
			reqs = append(reqs, request{"POST", "/batch?tenant=t" + fmt.Sprint(i%2), client, []string{"X-Cost: " + fmt.Sprint(1+i%3)}})
		case 3:
			reqs = append(reqs, request{"GET", "/strict", client, nil})
		default:
			reqs = append(reqs, request{"GET", "/strict", client, []string{"X-Tenant: t"}})
		}
	}
	for i, q := range reqs {
		hr := httptest.NewRequest(q.method, q.target, nil)
		hr.RemoteAddr = q.client + ":40000"
		for _, h := range q.headers {
			k, v, _ := strings.Cut(h, ": ")
			hr.Header.Add(k, v)
		}
		var st proxy.State
		dec := px.Check(hr, &st)
		wantOK := dec.Outcome == proxy.Pass || dec.Outcome == proxy.Allowed
		out := r.call(t, req(config.GatewayDomain, rd("shop/edge", q.method, q.target, q.client, q.headers...)))
		if gotOK := out.OverallCode == ok; gotOK != wantOK {
			t.Fatalf("request %d %s %s from %s %v: proxy outcome %v, Envoy front %v", i, q.method, q.target, q.client, q.headers, dec.Outcome, out.OverallCode)
		}
		// The response fields describe the call's binding rule, as the
		// proxy's do.
		if dec.Rule != nil {
			if got := headerValue(out, "RateLimit-Policy"); !strings.HasPrefix(got, `"`+dec.Rule.PolicyName+`"`) {
				t.Errorf("request %d: RateLimit-Policy %q, want the proxy's binding rule %q", i, got, dec.Rule.PolicyName)
			}
			want := fmt.Sprint(dec.Binding.Remaining)
			if dec.Binding.Denied {
				want = "0"
			}
			if got := headerValue(out, "X-RateLimit-Remaining"); got != want {
				t.Errorf("request %d: X-RateLimit-Remaining %q, the proxy's %s", i, got, want)
			}
		}
	}
}

// newCheckProxy returns a proxy deciding doc's rules on an in-memory
// store; only its Check is used.
func newCheckProxy(t *testing.T, doc string) *proxy.Proxy {
	t.Helper()
	c, err := config.Load([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	set, err := ruleset.Compile(c, labels.Set{}, m)
	if err != nil {
		t.Fatal(err)
	}
	st, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	fb, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Options{Store: st, Fallback: fb, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	px, err := proxy.New(proxy.Options{Upstream: &url.URL{Scheme: "http", Host: "127.0.0.1:1"}, Engine: eng, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	px.SetRules(set)
	return px
}

// TestHostsMatchInBothModes runs a rule restricted to match.hosts, exact
// and wildcard, through the proxy and as request descriptors: each host
// that matches is limited (one request an hour), in both, and the others
// never are.
func TestHostsMatchInBothModes(t *testing.T) {
	t.Parallel()
	doc := `
apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: edge
  namespace: shop
  uid: edge-shop
  rules:
  - name: per-host
    match: {hosts: [api.example.com, "*.shop.example.com"]}
    key: [{header: X-Client}]
    limit: {requests: 1, per: 1h}
`
	r := newRLS(t, doc, setup{})
	px := newCheckProxy(t, doc)
	for _, tc := range []struct {
		host    string
		limited bool
	}{
		{"api.example.com", true},
		{"API.Example.com:8443", true},
		{"a.shop.example.com", true},
		{"b.c.shop.example.com", true},
		{"shop.example.com", false},
		{"xshop.example.com", false},
		{"api.example.com.evil", false},
		{"other.example.com", false},
	} {
		for n := range 2 {
			wantOK := !tc.limited || n == 0
			hr := httptest.NewRequest("GET", "/x", nil)
			hr.Host = tc.host
			hr.Header.Set("X-Client", tc.host) // a counter per case
			var st proxy.State
			dec := px.Check(hr, &st)
			if gotOK := dec.Outcome == proxy.Pass || dec.Outcome == proxy.Allowed; gotOK != wantOK {
				t.Errorf("proxy: request %d to %s: outcome %v, want admitted %v", n+1, tc.host, dec.Outcome, wantOK)
			}
			out := r.call(t, req(config.GatewayDomain, d(config.PolicyEntryKey+"=shop/edge", config.AuthorityEntryKey+"="+tc.host,
				config.MethodEntryKey+"=GET", config.PathEntryKey+"=/x", config.RemoteAddressEntryKey+"=10.0.0.1", "x-client="+tc.host)))
			if gotOK := out.OverallCode == ok; gotOK != wantOK {
				t.Errorf("request descriptor %d for %s: %v, want admitted %v", n+1, tc.host, out.OverallCode, wantOK)
			}
		}
	}
}
