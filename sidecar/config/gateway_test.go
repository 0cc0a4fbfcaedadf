package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The headers an expression reads by name are what a gateway must send
// for it; any other read of request.headers cannot be listed.
func TestExpressionHeaders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		kind ExpressionKind
		want []string
		any  bool
	}{
		{"request.headers['x-tier'] == 'free'", Condition, []string{"x-tier"}, false},
		{"'X-Beta' in request.headers && request.method == 'POST'", Condition, []string{"x-beta"}, false},
		{"has(request.headers.x_flag) || request.headers.x_flag == '1'", Condition, []string{"x_flag"}, false},
		{"request.headers['b'] != request.headers['a'] || 'a' in request.headers", Condition, []string{"a", "b"}, false},
		{"request.headers['x-tenant'] + '/' + request.path", KeyValue, []string{"x-tenant"}, false},
		{"request.path.startsWith('/api/') && source.address != '10.0.0.1'", Condition, nil, false},
		{"request.headers.exists(k, k.startsWith('x-'))", Condition, nil, true},
		{"size(request.headers) > 10", Condition, nil, true},
		{"request.headers[request.query['h']] == 'x'", Condition, nil, true},
	} {
		e, err := CompileExpression(tc.expr, tc.kind)
		if err != nil {
			t.Errorf("CompileExpression(%q) = %v", tc.expr, err)
			continue
		}
		if !slices.Equal(e.Headers, tc.want) || e.AnyHeader != tc.any {
			t.Errorf("CompileExpression(%q): headers %q, any %v; want %q, %v", tc.expr, e.Headers, e.AnyHeader, tc.want, tc.any)
		}
	}
}

// RequestHeaders lists every header a policy's HTTP rules read, in every
// place a rule can read one, and names an expression whose reads cannot
// be listed.
func TestRequestHeaders(t *testing.T) {
	t.Parallel()
	p := &Policy{
		JWT:    &JWT{Header: "X-Token", UpstreamVerified: true},
		Exempt: &Exempt{When: []string{"request.headers['x-internal'] == 'yes'"}},
		Rules: []Rule{{
			Name:  "a",
			Match: Match{Headers: []HeaderMatch{{Name: "x-api-key"}}, When: []string{"request.headers['x-tier'] == 'free'"}},
			Keys:  [][]KeyPart{{{Header: "X-Tenant"}}, {{Expression: "request.headers['x-user']"}}},
			Cost:  Cost{FromHeader: "X-Cost"},
		}, {
			Name:   "b",
			Key:    []KeyPart{{Expression: "string(auth.claims.sub)"}},
			Exempt: &Exempt{When: []string{"'x-canary' in request.headers"}},
		}, {
			Name:  "descriptors",
			Match: Match{Descriptors: &DescriptorMatch{Domain: "d"}, Headers: []HeaderMatch{{Name: "X-Ignored"}}},
		}},
	}
	got, err := RequestHeaders(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"X-Internal", "X-Api-Key", "X-Tier", "X-Tenant", "X-User", "X-Cost", "X-Token", "X-Canary"}
	if !slices.Equal(got, want) {
		t.Errorf("RequestHeaders = %q, want %q", got, want)
	}

	p.Rules[1].Match.When = []string{"request.headers.exists(k, k == 'x')"}
	if _, err := RequestHeaders(p); err == nil || err.Error() != "rules[1].match.when[0]: reads request.headers other than by a literal name, so no list of headers covers it" {
		t.Errorf("RequestHeaders with an unlisted read = %v", err)
	}
}

// A gateway's identity round-trips through its certificate URI, and only
// a well-formed identity of floodgate's trust domain names a gateway.
func TestGatewayIdentity(t *testing.T) {
	t.Parallel()
	parse := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	if got, want := GatewayIdentity("shop", "public.v1"), "spiffe://floodgate.dev/ns/shop/gateway/public.v1"; got != want {
		t.Fatalf("GatewayIdentity = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		uris []string
		want string
	}{
		{[]string{"spiffe://floodgate.dev/ns/shop/gateway/public.v1"}, "shop/public.v1"},
		{[]string{"https://example.com/x", "spiffe://floodgate.dev/ns/shop/gateway/public"}, "shop/public"},
		{[]string{"spiffe://floodgate.dev/ns/shop/gateway/public", "spiffe://floodgate.dev/ns/shop/gateway/public"}, "shop/public"},
		{[]string{"spiffe://floodgate.dev/ns/shop/gateway/a", "spiffe://floodgate.dev/ns/shop/gateway/b"}, ""},
		{[]string{"spiffe://other.dev/ns/shop/gateway/public"}, ""},
		{[]string{"spiffe://floodgate.dev/ns/shop/sa/public"}, ""},
		{[]string{"spiffe://floodgate.dev/ns/Shop/gateway/public"}, ""},
		{[]string{"spiffe://floodgate.dev/ns/shop/gateway/a/b"}, ""},
		{[]string{"spiffe://floodgate.dev/ns/shop/gateway/public?x=1"}, ""},
		{nil, ""},
	} {
		var us []*url.URL
		for _, s := range tc.uris {
			us = append(us, parse(s))
		}
		got, ok := GatewayOf(us)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("GatewayOf(%q) = %q, %v; want %q", tc.uris, got, ok, tc.want)
		}
	}
}

// Policy.Gateways is validated: well-formed references, sorted, unique,
// bounded.
func TestValidateGateways(t *testing.T) {
	t.Parallel()
	doc := func(gws ...string) *Config {
		return &Config{APIVersion: APIVersion, Policies: []Policy{{
			Name: "edge", Namespace: "shop", UID: "u1", Gateways: gws,
			Rules: []Rule{{Name: "r", Limit: Limit{Requests: 1, Per: metav1.Duration{Duration: time.Second}}}},
		}}}
	}
	if err := doc("infra/public", "shop/internal").Validate(); err != nil {
		t.Fatalf("valid gateways: %v", err)
	}
	for _, tc := range []struct {
		gws  []string
		want string
	}{
		{[]string{"public"}, "policies[0].gateways[0]: must be <namespace>/<name>"},
		{[]string{"Infra/public"}, `policies[0].gateways[0]: namespace "Infra"`},
		{[]string{"infra/pub lic"}, `policies[0].gateways[0]: name "pub lic"`},
		{[]string{"shop/b", "shop/a"}, `policies[0].gateways[1]: gateways must be sorted and unique: "shop/a" follows "shop/b"`},
		{[]string{"shop/a", "shop/a"}, "policies[0].gateways[1]: gateways must be sorted and unique"},
	} {
		err := doc(tc.gws...).Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(gateways %q) = %v, want %q", tc.gws, err, tc.want)
		}
	}
	many := make([]string, MaxGateways+1)
	for i := range many {
		many[i] = fmt.Sprintf("ns/gw-%03d", i)
	}
	if err := doc(many...).Validate(); err == nil || !strings.Contains(err.Error(), "policies[0].gateways: at most 32 gateways") {
		t.Errorf("Validate(%d gateways) = %v, want the bound", len(many), err)
	}
}
