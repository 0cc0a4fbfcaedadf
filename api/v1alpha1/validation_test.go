package v1alpha1

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// validPolicy uses every feature, and passes.
func validPolicy() *RateLimitPolicy {
	return &RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec: RateLimitPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
			StoreRef:    &StoreReference{Name: "main"},
			Rules: []Rule{{
				Name: "per-user",
				Match: &RuleMatch{
					Path:    &PathMatch{Type: PathMatchPrefix, Value: "/api/"},
					Methods: []HTTPMethod{"GET", "POST"},
					Headers: []HeaderMatch{{Name: "X-Tier", Value: "free"}},
				},
				Key:          []KeyPart{{Header: "X-API-Key"}, {ClientIP: &ClientIPKey{}}, {JWTClaim: "sub"}},
				OnMissingKey: OnMissingKeyReject,
				Limit:        Limit{Requests: 100, Per: metav1.Duration{Duration: time.Minute}, Burst: 50, Algorithm: AlgorithmGCRA},
				Cost:         &Cost{FromHeader: "X-Cost", Default: 1, Max: 50},
				FailureMode:  FailureModeClosed,
				Mode:         ModeShadow,
			}, {
				Name:  "items",
				Match: &RuleMatch{Path: &PathMatch{Type: PathMatchRegularExpression, Value: `^/items/[0-9]+$`}},
				Key:   []KeyPart{{Path: &PathKey{}}, {Method: &MethodKey{}}, {Query: "tenant"}},
				Limit: Limit{Requests: 10000, Per: metav1.Duration{Duration: 24 * time.Hour}, Algorithm: AlgorithmSlidingWindow},
				// A threshold that is not advertised.
				ResponseHeaders: ResponseHeadersNone,
			}},
			TrustedProxies: &TrustedProxies{CIDRs: []CIDR{"10.0.0.0/8", "fd00::/8"}, Hops: 1},
			JWT:            &JWT{HMACSecretRef: &KeyReference{Name: "jwt", Key: "hmac"}, Issuer: "https://auth.example.com"},
		},
	}
}

func TestValidateSemanticsAcceptsValid(t *testing.T) {
	t.Parallel()
	if errs := validPolicy().ValidateSemantics(); len(errs) != 0 {
		t.Fatalf("ValidateSemantics() = %v, want no errors", errs.ToAggregate())
	}
	// Fields left to the API server's defaults are valid too.
	p := validPolicy()
	p.Spec.Rules[0].OnMissingKey, p.Spec.Rules[0].FailureMode, p.Spec.Rules[0].Mode = "", "", ""
	p.Spec.Rules[0].Limit.Algorithm = ""
	p.Spec.Rules[0].Match.Path.Type = ""
	if errs := p.ValidateSemantics(); len(errs) != 0 {
		t.Fatalf("ValidateSemantics() with defaults left empty = %v, want no errors", errs.ToAggregate())
	}
}

func TestValidateSemanticsRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(p *RateLimitPolicy)
		field  string // the field path the error must name
		detail string // a substring of the error
	}{
		{"regex does not compile", func(p *RateLimitPolicy) { p.Spec.Rules[1].Match.Path.Value = "^/items/(" },
			"spec.rules[1].match.path.value", "not a valid RE2 regular expression"},
		{"pattern in a Prefix path", func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.Path.Value = "/api/*" },
			"spec.rules[0].match.path.value", "literal absolute path"},
		{"relative Exact path", func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Match.Path = &PathMatch{Type: PathMatchExact, Value: "login"}
		}, "spec.rules[0].match.path.value", "literal absolute path"},
		{"unknown path type", func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.Path.Type = "Glob" },
			"spec.rules[0].match.path.type", "Unsupported value"},
		{"In selector without values", func(p *RateLimitPolicy) {
			p.Spec.PodSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn}}
		}, "spec.podSelector.matchExpressions[0].values", "must be specified"},
		{"bad selector label value", func(p *RateLimitPolicy) { p.Spec.PodSelector.MatchLabels["app"] = "no spaces" },
			"spec.podSelector.matchLabels", "Invalid value"},
		{"duplicate rule names", func(p *RateLimitPolicy) { p.Spec.Rules[1].Name = "per-user" },
			"spec.rules[1].name", "Duplicate value"},
		{"no rules", func(p *RateLimitPolicy) { p.Spec.Rules = nil }, "spec.rules", "at least one rule"},
		{"key and keys", func(p *RateLimitPolicy) { p.Spec.Rules[0].Keys = [][]KeyPart{{{Header: "X"}}} }, "spec.rules[0].keys", "not both"},
		{"empty keys", func(p *RateLimitPolicy) { p.Spec.Rules[1].Key, p.Spec.Rules[1].Keys = nil, [][]KeyPart{} }, "spec.rules[1].keys", "at least one alternative"},
		{"too many alternatives", func(p *RateLimitPolicy) {
			p.Spec.Rules[1].Key = nil
			for range 9 {
				p.Spec.Rules[1].Keys = append(p.Spec.Rules[1].Keys, []KeyPart{{Header: "X"}})
			}
		}, "spec.rules[1].keys", "must have at most 8"},
		{"an empty alternative before others", func(p *RateLimitPolicy) {
			p.Spec.Rules[1].Key, p.Spec.Rules[1].Keys = nil, [][]KeyPart{{}, {{Header: "X"}}}
		}, "spec.rules[1].keys[0]", "may only be the last"},
		{"bad part in an alternative", func(p *RateLimitPolicy) {
			p.Spec.Rules[1].Key, p.Spec.Rules[1].Keys = nil, [][]KeyPart{{{Header: "X"}}, {{}}}
		}, "spec.rules[1].keys[1][0]", "exactly one of"},
		{"ipv6 prefix", func(p *RateLimitPolicy) { p.Spec.Rules[0].Key[1].ClientIP.IPv6PrefixLength = 129 },
			"spec.rules[0].key[1].clientIP.ipv6PrefixLength", "between 1 and 128"},
		{"bad onInvalidToken", func(p *RateLimitPolicy) { p.Spec.JWT.OnInvalidToken = "Skip" }, "spec.jwt.onInvalidToken", "Unsupported value"},
		{"jwtClaim in an alternative without jwt", func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Key = []KeyPart{{Header: "X"}}
			p.Spec.Rules[1].Key, p.Spec.Rules[1].Keys = nil, [][]KeyPart{{{JWTClaim: "sub"}}, {{Header: "X"}}}
			p.Spec.JWT = nil
		}, "spec.jwt", "jwt must be set"},
		{"two fields in a key part", func(p *RateLimitPolicy) { p.Spec.Rules[0].Key[0].Query = "k" },
			"spec.rules[0].key[0]", "exactly one of"},
		{"empty key part", func(p *RateLimitPolicy) { p.Spec.Rules[0].Key[0] = KeyPart{} },
			"spec.rules[0].key[0]", "exactly one of"},
		{"zero requests", func(p *RateLimitPolicy) { p.Spec.Rules[0].Limit.Requests = 0 },
			"spec.rules[0].limit.requests", "between 1 and"},
		{"negative burst", func(p *RateLimitPolicy) { p.Spec.Rules[0].Limit.Burst = -1 },
			"spec.rules[0].limit.burst", "between 0 and"},
		{"period too short", func(p *RateLimitPolicy) { p.Spec.Rules[0].Limit.Per.Duration = 500 * time.Millisecond },
			"spec.rules[0].limit.per", "must be between 1s and 8784h0m0s"},
		{"period too long", func(p *RateLimitPolicy) { p.Spec.Rules[0].Limit.Per.Duration = 367 * 24 * time.Hour },
			"spec.rules[0].limit.per", "must be between 1s and 8784h0m0s"},
		{"period not whole microseconds", func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Limit.Per.Duration = time.Second + time.Nanosecond
		}, "spec.rules[0].limit.per", "whole number of microseconds"},
		{"burst with a window algorithm", func(p *RateLimitPolicy) { p.Spec.Rules[1].Limit.Burst = 5 },
			"spec.rules[1].limit.burst", "only TokenBucket and GCRA take a burst"},
		{"a bucket that takes too long to refill", func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Limit = Limit{Requests: 1, Per: metav1.Duration{Duration: 8784 * time.Hour}, Burst: 1000}
		}, "spec.rules[0].limit.burst", "takes longer than"},
		{"unknown algorithm", func(p *RateLimitPolicy) { p.Spec.Rules[0].Limit.Algorithm = "LeakyBucket" },
			"spec.rules[0].limit.algorithm", "Unsupported value"},
		{"unknown lease mode", func(p *RateLimitPolicy) { p.Spec.Rules[0].Limit.Lease = "Always" },
			"spec.rules[0].limit.lease", "Unsupported value"},
		{"split beyond the bound", func(p *RateLimitPolicy) { p.Spec.Rules[0].Limit.Split = 17 },
			"spec.rules[0].limit.split", "between 1 and 16"},
		{"split beyond requests", func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Limit = Limit{Requests: 2, Per: metav1.Duration{Duration: time.Second}, Split: 3}
		}, "spec.rules[0].limit.split", "need at least 3 requests per period"},
		{"cost beyond one sub-counter", func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Limit = Limit{Requests: 10, Per: metav1.Duration{Duration: time.Second}, Split: 3}
			p.Spec.Rules[0].Cost = &Cost{Default: 4}
		}, "spec.rules[0].cost.default", "divided by limit.split"},
		{"huge sliding log", func(p *RateLimitPolicy) {
			p.Spec.Rules[1].Limit.Algorithm = AlgorithmSlidingLog
			p.Spec.Rules[1].Limit.Requests = 100_001
		}, "spec.rules[1].limit.requests", "SlidingLog keeps one entry per admitted request, so it takes at most 100000"},
		{"cost default above capacity", func(p *RateLimitPolicy) { p.Spec.Rules[0].Cost.Default = 51 },
			"spec.rules[0].cost.default", "capacity"},
		{"cost max above capacity", func(p *RateLimitPolicy) { p.Spec.Rules[0].Cost.Max = 51 },
			"spec.rules[0].cost.max", "capacity"},
		{"cost max without header", func(p *RateLimitPolicy) { p.Spec.Rules[0].Cost.FromHeader = "" },
			"spec.rules[0].cost.max", "needs fromHeader"},
		{"cost default above max", func(p *RateLimitPolicy) { p.Spec.Rules[0].Cost.Default = 20; p.Spec.Rules[0].Cost.Max = 10 },
			"spec.rules[0].cost.default", "must not exceed max"},
		{"bad cost header", func(p *RateLimitPolicy) { p.Spec.Rules[0].Cost.FromHeader = "X Cost" },
			"spec.rules[0].cost.fromHeader", "HTTP header name"},
		{"unknown failure mode", func(p *RateLimitPolicy) { p.Spec.Rules[0].FailureMode = "Maybe" },
			"spec.rules[0].failureMode", "Unsupported value"},
		{"unknown mode", func(p *RateLimitPolicy) { p.Spec.Rules[0].Mode = "Audit" },
			"spec.rules[0].mode", "Unsupported value"},
		{"unknown responseHeaders", func(p *RateLimitPolicy) { p.Spec.Rules[0].ResponseHeaders = "Limit" },
			"spec.rules[0].responseHeaders", "Unsupported value"},
		{"responseHeaders on a concurrency rule", func(p *RateLimitPolicy) {
			p.Spec.Rules[0].Limit, p.Spec.Rules[0].Cost = Limit{}, nil
			p.Spec.Rules[0].Concurrency = &Concurrency{Max: 10}
			p.Spec.Rules[0].ResponseHeaders = ResponseHeadersNone
		}, "spec.rules[0].responseHeaders", "rate limits only"},
		{"unknown onMissingKey", func(p *RateLimitPolicy) { p.Spec.Rules[0].OnMissingKey = "Drop" },
			"spec.rules[0].onMissingKey", "Unsupported value"},
		{"unknown method", func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.Methods = []HTTPMethod{"FETCH"} },
			"spec.rules[0].match.methods[0]", "Unsupported value"},
		{"bad header match name", func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.Headers[0].Name = "X:Tier" },
			"spec.rules[0].match.headers[0].name", "HTTP header name"},
		{"CIDR with host bits", func(p *RateLimitPolicy) { p.Spec.TrustedProxies.CIDRs[0] = "10.1.2.3/8" },
			"spec.trustedProxies.cidrs[0]", "no host bits"},
		{"not a CIDR", func(p *RateLimitPolicy) { p.Spec.TrustedProxies.CIDRs[0] = "10.0.0.0" },
			"spec.trustedProxies.cidrs[0]", "CIDR"},
		{"empty trusted proxies", func(p *RateLimitPolicy) { p.Spec.TrustedProxies = &TrustedProxies{} },
			"spec.trustedProxies.cidrs", "cidrs is required"},
		{"hops without cidrs", func(p *RateLimitPolicy) { p.Spec.TrustedProxies = &TrustedProxies{Hops: 1} },
			"spec.trustedProxies.cidrs", "hops alone is not enough"},
		{"header with hops", func(p *RateLimitPolicy) { p.Spec.TrustedProxies.Header = "X-Real-IP" },
			"spec.trustedProxies.header", "excludes hops"},
		{"too many hops", func(p *RateLimitPolicy) { p.Spec.TrustedProxies.Hops = 33 },
			"spec.trustedProxies.hops", "between 0 and 32"},
		{"too many rules", func(p *RateLimitPolicy) {
			for i := len(p.Spec.Rules); i <= 64; i++ {
				r := p.Spec.Rules[1]
				r.Name = fmt.Sprintf("r%d", i)
				p.Spec.Rules = append(p.Spec.Rules, r)
			}
		}, "spec.rules", "must have at most 64 items"},
		{"too many key parts", func(p *RateLimitPolicy) {
			for len(p.Spec.Rules[1].Key) <= 8 {
				p.Spec.Rules[1].Key = append(p.Spec.Rules[1].Key, KeyPart{Query: "q"})
			}
		}, "spec.rules[1].key", "must have at most 8 items"},
		{"too many header matches", func(p *RateLimitPolicy) {
			for len(p.Spec.Rules[0].Match.Headers) <= 16 {
				p.Spec.Rules[0].Match.Headers = append(p.Spec.Rules[0].Match.Headers, HeaderMatch{Name: "X-H"})
			}
		}, "spec.rules[0].match.headers", "must have at most 16 items"},
		{"path too long", func(p *RateLimitPolicy) { p.Spec.Rules[0].Match.Path.Value = "/" + strings.Repeat("a", 1024) },
			"spec.rules[0].match.path.value", "may not be more than 1024 bytes"},
		{"jwt claim without jwt", func(p *RateLimitPolicy) { p.Spec.JWT = nil },
			"spec.jwt", "jwt must be set"},
		{"jwt with two key sources", func(p *RateLimitPolicy) {
			p.Spec.JWT.JWKSConfigMapRef = &KeyReference{Name: "jwks", Key: "jwks.json"}
		}, "spec.jwt", "exactly one of"},
		{"jwt without a key source", func(p *RateLimitPolicy) { p.Spec.JWT.HMACSecretRef = nil },
			"spec.jwt", "exactly one of"},
		{"bad secret name", func(p *RateLimitPolicy) { p.Spec.JWT.HMACSecretRef.Name = "Not_A_Name" },
			"spec.jwt.hmacSecretRef.name", "RFC 1123"},
		{"bad store name", func(p *RateLimitPolicy) { p.Spec.StoreRef.Name = "Main" },
			"spec.storeRef.name", "RFC 1123"},
		{"bad rule name", func(p *RateLimitPolicy) { p.Spec.Rules[0].Name = "Per_User" },
			"spec.rules[0].name", "RFC 1123"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := validPolicy()
			tc.mutate(p)
			errs := p.ValidateSemantics()
			for _, e := range errs {
				if e.Field == tc.field && strings.Contains(e.Error(), tc.detail) {
					return
				}
			}
			t.Errorf("ValidateSemantics() = %v, want an error on %s containing %q", errs.ToAggregate(), tc.field, tc.detail)
		})
	}
}

// TestValidateSemanticsReportsAll shows that every problem is reported at
// once, not only the first.
func TestValidateSemanticsReportsAll(t *testing.T) {
	t.Parallel()
	p := validPolicy()
	p.Spec.Rules[0].Limit.Requests = 0
	p.Spec.Rules[1].Match.Path.Value = "("
	p.Spec.TrustedProxies.CIDRs[1] = "nope"
	errs := p.ValidateSemantics()
	want := []string{"spec.rules[0].limit.requests", "spec.rules[1].match.path.value", "spec.trustedProxies.cidrs[1]"}
	for _, f := range want {
		found := false
		for _, e := range errs {
			found = found || e.Field == f
		}
		if !found {
			t.Errorf("no error on %s in %v", f, errs.ToAggregate())
		}
	}
}

// The largest values the bounds allow pass: the API takes every limit and
// trusted-proxies setting that a sidecar loads.
func TestValidateSemanticsAcceptsTheBounds(t *testing.T) {
	t.Parallel()
	p := validPolicy()
	p.Spec.TrustedProxies.Hops = 32
	p.Spec.Rules[1].Limit = Limit{Requests: 100_000, Per: metav1.Duration{Duration: 8784 * time.Hour}, Algorithm: AlgorithmSlidingLog}
	p.Spec.Rules[0].Limit = Limit{Requests: 1_000_000_000, Per: metav1.Duration{Duration: time.Second}, Burst: 1_000_000_000, Algorithm: AlgorithmGCRA}
	if errs := p.ValidateSemantics(); len(errs) != 0 {
		t.Errorf("ValidateSemantics() = %v, want no errors", errs.ToAggregate())
	}
}

func TestStoreNameDefaults(t *testing.T) {
	t.Parallel()
	p := validPolicy()
	if got, want := p.StoreName(), "main"; got != want {
		t.Errorf("StoreName() = %q, want %q", got, want)
	}
	p.Spec.StoreRef = nil
	if got, want := p.StoreName(), DefaultCounterStoreName; got != want {
		t.Errorf("StoreName() without storeRef = %q, want %q", got, want)
	}
}

func TestCapacity(t *testing.T) {
	t.Parallel()
	if got, want := (Limit{Requests: 100}).Capacity(), int64(100); got != want {
		t.Errorf("Capacity() = %d, want %d", got, want)
	}
	if got, want := (Limit{Requests: 100, Burst: 7}).Capacity(), int64(7); got != want {
		t.Errorf("Capacity() with burst = %d, want %d", got, want)
	}
}
