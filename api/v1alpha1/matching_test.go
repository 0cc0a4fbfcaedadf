package v1alpha1

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// matchingPolicy uses every matching field, a key expression and both
// exempt sections, and passes.
func matchingPolicy() *RateLimitPolicy {
	p := validPolicy()
	p.Spec.Exempt = &Exempt{SourceCIDRs: []CIDR{"10.0.0.0/8"}, When: []Expression{"request.path == '/healthz'"}}
	r := &p.Spec.Rules[0]
	r.Match.Headers = append(r.Match.Headers,
		HeaderMatch{Name: "X-Plan", Regex: "free|trial"},
		HeaderMatch{Name: "X-Internal", Absent: true},
		HeaderMatch{Name: "X-Beta", Value: "yes", Invert: true})
	r.Match.Hosts = []Hostname{"api.example.com", "*.example.org"}
	r.Match.Query = []QueryMatch{{Name: "page", Regex: "[0-9]+"}, {Name: "debug", Absent: true}}
	r.Match.SourceCIDRs = []CIDR{"192.0.2.0/24", "2001:db8::/32"}
	r.Match.When = []Expression{"request.method != 'DELETE'", "auth.claims.tier == 'free'"}
	r.Key = append(r.Key, KeyPart{Expression: "request.headers['x-org'] + '/' + request.path"})
	r.Exempt = &Exempt{When: []Expression{"cidr('172.16.0.0/12').containsIP(source.address)"}}
	return p
}

func TestValidateSemanticsAcceptsMatching(t *testing.T) {
	t.Parallel()
	if errs := matchingPolicy().ValidateSemantics(); len(errs) != 0 {
		t.Fatalf("ValidateSemantics() = %v, want no errors", errs.ToAggregate())
	}
}

// hasError reports whether errs has an error on fieldPath whose message
// contains detail.
func hasError(errs field.ErrorList, fieldPath, detail string) bool {
	for _, e := range errs {
		if e.Field == fieldPath && strings.Contains(e.Error(), detail) {
			return true
		}
	}
	return false
}

func TestValidateSemanticsRejectsBadMatching(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*RateLimitPolicy)
		field  string
		detail string
	}{{
		"a condition that does not parse",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.When = []Expression{"request.path.startsWith("} },
		"spec.rules[0].match.when[0]", "not a valid CEL expression",
	}, {
		"a condition with an unknown variable",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.When = []Expression{"request.pth == '/'"} },
		"spec.rules[0].match.when[0]", "undeclared reference to 'request' (in container ''); the variables are request.method, request.path",
	}, {
		"a condition that is not a bool",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.When = []Expression{"request.headers"} },
		"spec.rules[0].match.when[0]", "must be a condition (of type bool)",
	}, {
		"a condition over the cost limit",
		func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Match.When = []Expression{"request.headers.all(a, request.query.all(b, a != b))"}
		},
		"spec.rules[0].match.when[0]", "exceeds the limit 1000000",
	}, {
		"a condition reading claims without jwt",
		func(p *RateLimitPolicy) {
			p.Spec.JWT = nil
			p.Spec.Rules[0].Key = []KeyPart{{Header: "X-Key"}}
			p.Spec.Rules[0].Match.When = []Expression{"auth.claims.sub == 'x'"}
		},
		"spec.rules[0].match.when[0]", "reads auth.claims, so the policy's jwt section must be set",
	}, {
		"too many conditions",
		func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Match.When = make([]Expression, maxConditions+1)
			for i := range p.Spec.Rules[0].Match.When {
				p.Spec.Rules[0].Match.When[i] = "true"
			}
		},
		"spec.rules[0].match.when", "Too many",
	}, {
		"a key expression that computes a map",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Key = []KeyPart{{Expression: "request.headers"}} },
		"spec.rules[0].key[0].expression", "must compute a string, a number or a bool",
	}, {
		"a key part with an expression and a header",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Key = []KeyPart{{Expression: "request.path", Header: "X-A"}} },
		"spec.rules[0].key[0]", "exactly one of header, query, clientIP, jwtClaim, path, method or expression",
	}, {
		"a source network with host bits",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.SourceCIDRs = []CIDR{"10.1.2.3/8"} },
		"spec.rules[0].match.sourceCIDRs[0]", "must be a CIDR with no host bits set",
	}, {
		"a source network that is not a CIDR",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.SourceCIDRs = []CIDR{"10.0.0.1"} },
		"spec.rules[0].match.sourceCIDRs[0]", "must be a CIDR",
	}, {
		"an exempt network that is not a CIDR",
		func(p *RateLimitPolicy) { p.Spec.Exempt = &Exempt{SourceCIDRs: []CIDR{"internal"}} },
		"spec.exempt.sourceCIDRs[0]", "must be a CIDR",
	}, {
		"an empty exemption",
		func(p *RateLimitPolicy) { p.Spec.Rules[1].Exempt = &Exempt{} },
		"spec.rules[1].exempt", "set sourceCIDRs, when, or both",
	}, {
		"a bad exemption condition",
		func(p *RateLimitPolicy) { p.Spec.Rules[1].Exempt = &Exempt{When: []Expression{"request.path = '/'"}} },
		"spec.rules[1].exempt.when[0]", "not a valid CEL expression",
	}, {
		"a host with a port",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.Hosts = []Hostname{"api.example.com:443"} },
		"spec.rules[0].match.hosts[0]", "must be a lower-case DNS name",
	}, {
		"a host in upper case",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.Hosts = []Hostname{"API.example.com"} },
		"spec.rules[0].match.hosts[0]", "must be a lower-case DNS name",
	}, {
		"a header match with value and regex",
		func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Match.Headers = []HeaderMatch{{Name: "X-A", Value: "a", Regex: "b"}}
		},
		"spec.rules[0].match.headers[0]", "set at most one of value, regex and absent",
	}, {
		"a header regex that does not compile",
		func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.Headers = []HeaderMatch{{Name: "X-A", Regex: "(a"}} },
		"spec.rules[0].match.headers[0].regex", "not a valid RE2 regular expression",
	}, {
		"absent and invert",
		func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Match.Query = []QueryMatch{{Name: "q", Absent: true, Invert: true}}
		},
		"spec.rules[0].match.query[0].invert", "invert cannot go with absent",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := matchingPolicy()
			tc.mutate(p)
			if errs := p.ValidateSemantics(); !hasError(errs, tc.field, tc.detail) {
				t.Errorf("ValidateSemantics() = %v, want an error on %s containing %q", errs.ToAggregate(), tc.field, tc.detail)
			}
		})
	}
}

func validClusterPolicy() *ClusterRateLimitPolicy {
	return &ClusterRateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "floor"},
		Spec: ClusterRateLimitPolicySpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"floodgate.dev/floor": "true"}},
			TrustedProxies:    &TrustedProxies{CIDRs: []CIDR{"192.0.2.0/24"}, Hops: 1},
			Exempt:            &Exempt{When: []Expression{"request.path == '/healthz'"}},
			Defaults: &ClusterRules{Rules: []Rule{{
				Name:  "per-ip",
				Key:   []KeyPart{{ClientIP: &ClientIPKey{}}},
				Limit: Limit{Requests: 1000, Per: metav1.Duration{Duration: time.Second}},
			}}},
			Overrides: &ClusterRules{Rules: []Rule{{
				Name:  "per-host",
				Match: &RuleMatch{When: []Expression{"request.host.endsWith('.internal')"}},
				Key:   []KeyPart{{Expression: "request.host"}},
				Limit: Limit{Requests: 100000, Per: metav1.Duration{Duration: time.Second}},
			}}},
		},
	}
}

func TestClusterPolicyValidateSemantics(t *testing.T) {
	t.Parallel()
	if errs := validClusterPolicy().ValidateSemantics(); len(errs) != 0 {
		t.Fatalf("ValidateSemantics() = %v, want no errors", errs.ToAggregate())
	}
	tests := []struct {
		name   string
		mutate func(*ClusterRateLimitPolicy)
		field  string
		detail string
	}{{
		"no rules",
		func(p *ClusterRateLimitPolicy) { p.Spec.Defaults, p.Spec.Overrides = nil, nil },
		"spec", "set defaults, overrides, or both",
	}, {
		"a name both a default and an override",
		func(p *ClusterRateLimitPolicy) { p.Spec.Overrides.Rules[0].Name = "per-ip" },
		"spec.overrides.rules[0].name", "Duplicate value",
	}, {
		"a jwtClaim key",
		func(p *ClusterRateLimitPolicy) { p.Spec.Defaults.Rules[0].Key = []KeyPart{{JWTClaim: "sub"}} },
		"spec.defaults.rules[0].key[0].jwtClaim", "has no namespace to hold the keys",
	}, {
		"auth.claims in a condition",
		func(p *ClusterRateLimitPolicy) {
			p.Spec.Defaults.Rules[0].Match = &RuleMatch{When: []Expression{"has(auth.claims.sub)"}}
		},
		"spec.defaults.rules[0].match.when[0]", "reads auth.claims, which a ClusterRateLimitPolicy cannot use",
	}, {
		"a bad namespace selector",
		func(p *ClusterRateLimitPolicy) {
			p.Spec.NamespaceSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}
		},
		"spec.namespaceSelector.matchExpressions[0].operator", "Near",
	}, {
		"a bad exemption network",
		func(p *ClusterRateLimitPolicy) { p.Spec.Exempt.SourceCIDRs = []CIDR{"10.0.0.1/8"} },
		"spec.exempt.sourceCIDRs[0]", "no host bits",
	}, {
		"a name too long for the sidecar config",
		func(p *ClusterRateLimitPolicy) { p.Name = strings.Repeat("a", 56) },
		"metadata.name", "Too long",
	}, {
		"a bad override condition",
		func(p *ClusterRateLimitPolicy) {
			p.Spec.Overrides.Rules[0].Match.When = []Expression{"request.host.endsWith(1)"}
		},
		"spec.overrides.rules[0].match.when[0]", "not a valid CEL expression",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := validClusterPolicy()
			tc.mutate(p)
			if errs := p.ValidateSemantics(); !hasError(errs, tc.field, tc.detail) {
				t.Errorf("ValidateSemantics() = %v, want an error on %s containing %q", errs.ToAggregate(), tc.field, tc.detail)
			}
		})
	}
}
