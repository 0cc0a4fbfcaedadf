package v1alpha1

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// validGatewayPolicy targets an HTTPRoute and uses what a gateway can
// send: headers, the client address, the path, the method, a query
// parameter and claims of tokens the gateway verified.
func validGatewayPolicy() *RateLimitPolicy {
	return &RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "shop"},
		Spec: RateLimitPolicySpec{
			TargetRef: &TargetReference{Group: GatewayAPIGroup, Kind: KindHTTPRoute, Name: "api", SectionName: "login"},
			Rules: []Rule{{
				Name:  "per-user",
				Match: &RuleMatch{Path: &PathMatch{Type: PathMatchPrefix, Value: "/api/"}, Headers: []HeaderMatch{{Name: "X-Tier", Value: "free"}}},
				Key:   []KeyPart{{Header: "X-API-Key"}, {ClientIP: &ClientIPKey{}}, {JWTClaim: "sub"}, {Path: &PathKey{}}, {Method: &MethodKey{}}, {Query: "t"}},
				Limit: Limit{Requests: 100, Per: metav1.Duration{Duration: time.Minute}},
				Cost:  &Cost{FromHeader: "X-Cost", Default: 1, Max: 10},
			}},
			JWT: &JWT{UpstreamVerified: true},
		},
	}
}

func TestValidateSemanticsAcceptsAGatewayPolicy(t *testing.T) {
	t.Parallel()
	if errs := validGatewayPolicy().ValidateSemantics(); len(errs) != 0 {
		t.Fatalf("ValidateSemantics() = %v, want no errors", errs.ToAggregate())
	}
	p := validGatewayPolicy()
	p.Spec.TargetRef = &TargetReference{Group: GatewayAPIGroup, Kind: KindGateway, Name: "public"}
	if errs := p.ValidateSemantics(); len(errs) != 0 {
		t.Fatalf("ValidateSemantics() of a Gateway target = %v, want no errors", errs.ToAggregate())
	}
	// A GRPCRoute rule, and a rule that limits one gRPC method: its
	// path, /<package>.<Service>/<Method>.
	p = validGatewayPolicy()
	p.Spec.TargetRef = &TargetReference{Group: GatewayAPIGroup, Kind: KindGRPCRoute, Name: "orders", SectionName: "create"}
	p.Spec.Rules[0].Match = &RuleMatch{Path: &PathMatch{Type: PathMatchExact, Value: "/shop.v1.Orders/Create"}, Methods: []HTTPMethod{"POST"}}
	if errs := p.ValidateSemantics(); len(errs) != 0 {
		t.Fatalf("ValidateSemantics() of a GRPCRoute target = %v, want no errors", errs.ToAggregate())
	}
	p = validGatewayPolicy()
	p.Spec.TargetRef = &TargetReference{Group: GatewayAPIGroup, Kind: KindGateway, Name: "public"}
	if !p.GatewayEnforced() || validPolicy().GatewayEnforced() {
		t.Errorf("GatewayEnforced() is %v for a targetRef policy and %v for a podSelector one, want true and false",
			p.GatewayEnforced(), validPolicy().GatewayEnforced())
	}
}

func TestValidateSemanticsRejectsWhatAGatewayCannotSend(t *testing.T) {
	t.Parallel()
	manyHeaders := func(p *RateLimitPolicy) {
		var hs []HeaderMatch
		for i := range 16 {
			hs = append(hs, HeaderMatch{Name: fmt.Sprintf("X-H%d", i)})
		}
		p.Spec.Rules[0].Match.Headers = hs
		p.Spec.Rules = append(p.Spec.Rules, *p.Spec.Rules[0].DeepCopy())
		p.Spec.Rules[1].Name = "more"
		for i := range p.Spec.Rules[1].Match.Headers {
			p.Spec.Rules[1].Match.Headers[i].Name = fmt.Sprintf("X-Other%d", i)
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(p *RateLimitPolicy)
		field  string
		detail string
	}{
		{"a podSelector beside the targetRef", func(p *RateLimitPolicy) {
			p.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}
		}, "spec.podSelector", "exactly one of podSelector and targetRef"},
		{"another group", func(p *RateLimitPolicy) { p.Spec.TargetRef.Group = "networking.istio.io" },
			"spec.targetRef.group", "Unsupported value"},
		{"another kind", func(p *RateLimitPolicy) { p.Spec.TargetRef.Kind = "TCPRoute" },
			"spec.targetRef.kind", "Unsupported value"},
		{"a bad name", func(p *RateLimitPolicy) { p.Spec.TargetRef.Name = "Not_A_Name" },
			"spec.targetRef.name", "Invalid value"},
		{"a bad section name", func(p *RateLimitPolicy) { p.Spec.TargetRef.SectionName = "a b" },
			"spec.targetRef.sectionName", "Invalid value"},
		{"trusted proxies", func(p *RateLimitPolicy) { p.Spec.TrustedProxies = &TrustedProxies{Hops: 1} },
			"spec.trustedProxies", "the gateway resolves the client address"},
		{"a JWT key the central service cannot read", func(p *RateLimitPolicy) {
			p.Spec.JWT = &JWT{HMACSecretRef: &KeyReference{Name: "jwt", Key: "k"}}
		}, "spec.jwt", "only upstreamVerified: true"},
		{"too many headers to send", manyHeaders, "spec.rules", "at most 24 distinct request headers"},
		{"a concurrency rule", func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Limit = Limit{}
			p.Spec.Rules[0].Concurrency = &Concurrency{Max: 10}
		}, "spec.rules[0].concurrency", "the central rate-limit service never sees"},
		{"a priority", func(p *RateLimitPolicy) { p.Spec.Rules[0].Priority = PriorityCritical },
			"spec.rules[0].priority", "the sidecar's load shedder"},
		{"load shedding", func(p *RateLimitPolicy) { p.Spec.LoadShedding = &LoadShedding{} },
			"spec.loadShedding", "a gateway's central rate-limit service sees no responses"},
		{"too many headers, counting those conditions and keys read", func(p *RateLimitPolicy) {
			manyHeaders(p)
			p.Spec.Rules[1].Match.Headers = p.Spec.Rules[1].Match.Headers[:8]
			p.Spec.Rules[1].Match.When = []Expression{"request.headers['x-when'] == 'a'"}
			p.Spec.Rules[1].Key = nil
			p.Spec.Rules[1].Keys = [][]KeyPart{{{Header: "X-Alt"}}, {{Expression: "request.headers['x-expr']"}}}
		}, "spec.rules", "this one reads 30"}, // 27 without x-when, X-Alt and x-expr
		{"a condition that reads headers by no name", func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Match.When = []Expression{"request.headers.exists(h, h.startsWith('x-debug'))"}
		}, "spec", "rules[0].match.when[0]: reads request.headers other than by a literal name"},
		{"an exemption that reads every header", func(p *RateLimitPolicy) {
			p.Spec.Exempt = &Exempt{When: []Expression{"size(request.headers) > 50"}}
		}, "spec", "exempt.when[0]: reads request.headers other than by a literal name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := validGatewayPolicy()
			tc.mutate(p)
			errs := p.ValidateSemantics()
			var found []string
			for _, e := range errs {
				found = append(found, e.Error())
				if e.Field == tc.field && strings.Contains(e.Error(), tc.detail) {
					return
				}
			}
			t.Errorf("no error on %s containing %q; got %q", tc.field, tc.detail, found)
		})
	}
}

func TestTargetReferenceString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ref  TargetReference
		want string
	}{
		{TargetReference{Kind: KindHTTPRoute, Name: "api"}, "HTTPRoute/api"},
		{TargetReference{Kind: KindGateway, Name: "public", SectionName: "https"}, "Gateway/public/https"},
		{TargetReference{Kind: KindGRPCRoute, Name: "orders", SectionName: "create"}, "GRPCRoute/orders/create"},
	} {
		if got := tc.ref.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.ref, got, tc.want)
		}
	}
}
