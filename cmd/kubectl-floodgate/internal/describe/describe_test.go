package describe

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

func per(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }

func TestRuleSummaries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		replicas int32
		rule     config.Rule
		summary  string
		applies  string
		cost     string
		missing  string
	}{{
		name:     "the issue's example",
		replicas: 5,
		rule: config.Rule{Name: "r", Key: []config.KeyPart{{Header: "X-API-Key"}},
			Limit: config.Limit{Requests: 5, Per: per(10 * time.Second), Burst: 5}},
		summary: "each X-API-Key: 5 requests per 10 s, burst 5, TokenBucket; fails open to 1 request per 10 s per replica on 5 replicas",
		applies: "all requests",
		cost:    "1 per request",
		// onMissingKey unset is Shared.
		missing: "requests without X-API-Key share one counter",
	}, {
		name:     "key alternatives that opt into Skip, and a limit below the replica count",
		replicas: 10,
		rule: config.Rule{Name: "login", OnMissingKey: config.OnMissingKeySkip,
			Keys:  [][]config.KeyPart{{{JWTClaim: "sub"}}, {{Header: "X-API-Key"}}, {{ClientIP: &config.ClientIPKey{IPv6PrefixLength: 56}}}},
			Limit: config.Limit{Requests: 3, Per: per(time.Minute)}},
		summary: "each JWT claim sub, else each X-API-Key, else each client IP (IPv6 by /56): 3 requests per minute, burst 3, TokenBucket; " +
			"fails open to every 10th of the limit's tokens per replica on 10 replicas: 3 requests per minute across them",
		applies: "all requests",
		cost:    "1 per request",
		// The client IP is always there: no request lacks every alternative.
		missing: "",
	}, {
		name:     "a rule that delays and keeps its numbers out of its answers",
		replicas: 1,
		rule: config.Rule{Name: "smooth", Key: []config.KeyPart{{Header: "X-API-Key"}}, ResponseHeaders: config.ResponseHeadersNone,
			Limit: config.Limit{Requests: 100, Per: per(time.Second), OnExceed: "Delay", MaxDelay: per(2 * time.Second), DelayAfter: 10}},
		summary: "each X-API-Key: 100 requests per second, 10 at once, then delayed up to 2s, GCRA; fails open to 100 requests per second per replica on 1 replica (burst 10); answers show no rate-limit fields",
		applies: "all requests",
		cost:    "1 per request",
		missing: "requests without X-API-Key share one counter",
	}, {
		name:     "a burst that divides into a different share",
		replicas: 4,
		rule: config.Rule{Name: "r", Key: []config.KeyPart{{JWTClaim: "sub"}}, OnMissingKey: config.OnMissingKeyReject,
			Match: config.Match{Path: &config.PathMatch{Type: config.PathPrefix, Value: "/api/"}, Methods: []string{"GET", "POST"},
				Headers: []config.HeaderMatch{{Name: "X-Tier", Value: "free"}, {Name: "X-Trial"}}},
			Limit: config.Limit{Requests: 100, Per: per(time.Minute), Burst: 40, Algorithm: "GCRA"}},
		summary: "each JWT claim sub: 100 requests per minute, burst 40, GCRA; fails open to 25 requests per minute per replica on 4 replicas (burst 10)",
		applies: "GET and POST and HEAD requests to paths under /api/ with header X-Tier: free and a X-Trial header",
		cost:    "1 per request",
		missing: "requests without JWT claim sub are answered 400",
	}, {
		name:     "a window algorithm that fails closed",
		replicas: 1,
		rule: config.Rule{Name: "r", Key: []config.KeyPart{{ClientIP: &config.ClientIPKey{}}, {Method: &struct{}{}}}, FailureMode: config.FailureClosed,
			Match: config.Match{Path: &config.PathMatch{Type: config.PathExact, Value: "/login"}},
			Limit: config.Limit{Requests: 3, Per: per(90 * time.Second), Algorithm: "SlidingWindow"}},
		summary: "each client IP and method: 3 requests per 90 s, SlidingWindow; fails closed: 503 while the store is unreachable",
		applies: "requests to /login",
		cost:    "1 per request",
	}, {
		name:     "one shared counter, a cost header, shadow mode",
		replicas: 2,
		rule: config.Rule{Name: "r", Mode: config.ModeShadow,
			Match: config.Match{Path: &config.PathMatch{Type: config.PathRegularExpression, Value: "/v[12]/.*"}},
			Cost:  config.Cost{FromHeader: "X-Cost", Default: 2},
			Limit: config.Limit{Requests: 1000, Per: per(24 * time.Hour), Algorithm: "FixedWindow"}},
		summary: "all of them together (one counter): 1000 requests per day, FixedWindow; fails open to 500 requests per day per replica on 2 replicas; shadow: counted and reported, never denies",
		applies: "requests to paths matching /v[12]/.*",
		cost:    "the X-Cost header's value (1 to 1000; other values are answered 400), 2 without it",
	}, {
		name:     "a concurrency cap that fails open to each replica's share",
		replicas: 4,
		rule: config.Rule{Name: "r", Key: []config.KeyPart{{Header: "X-Tenant"}}, Priority: config.PrioritySheddable,
			Concurrency: &config.Concurrency{Max: 10, LeaseTTL: per(30 * time.Second)}},
		summary: "each X-Tenant: at most 10 requests in flight at once across replicas (a crashed sidecar's slots come back after 30 s); fails open to 2 in flight per replica on 4 replicas; marks its requests Sheddable for the load shedder",
		applies: "all requests",
		missing: "requests without X-Tenant share one counter",
	}, {
		name:     "a concurrency cap that fails closed, its lease TTL defaulted",
		replicas: 2,
		rule: config.Rule{Name: "r", Key: []config.KeyPart{{ClientIP: &config.ClientIPKey{}}}, FailureMode: config.FailureClosed,
			Concurrency: &config.Concurrency{Max: 1}},
		summary: "each client IP: at most 1 request in flight at once across replicas (a crashed sidecar's slots come back after 10 s); fails closed: 503 while the store is unreachable",
		applies: "all requests",
	}, {
		name:     "a rule that only sets a priority",
		replicas: 3,
		rule: config.Rule{Name: "r", Priority: config.PriorityCritical,
			Match: config.Match{Path: &config.PathMatch{Type: config.PathPrefix, Value: "/pay"}}},
		summary: "no limit: marks the requests it matches Critical for the load shedder",
		applies: "requests to paths under /pay",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := &config.Config{APIVersion: config.APIVersion, Policies: []config.Policy{{Name: "p", UID: "u", Replicas: tt.replicas, Rules: []config.Rule{tt.rule}}}}
			ps, err := Config(c)
			if err != nil {
				t.Fatal(err)
			}
			r := ps[0].Rules[0]
			for _, f := range []struct{ name, got, want string }{
				{"Summary", r.Summary, tt.summary}, {"Applies", r.Applies, tt.applies}, {"Cost", r.Cost, tt.cost}, {"MissingKey", r.MissingKey, tt.missing},
			} {
				if f.got != f.want {
					t.Errorf("%s = %q, want %q", f.name, f.got, f.want)
				}
			}
		})
	}
}

func TestDescriptorRules(t *testing.T) {
	t.Parallel()
	d := func(entries []config.DescriptorEntry, l config.Limit) config.Rule {
		return config.Rule{Name: "r", Match: config.Match{Descriptors: &config.DescriptorMatch{Domain: "edge", Entries: entries}}, Limit: l}
	}
	for _, tt := range []struct {
		rule    config.Rule
		summary string
	}{
		{d([]config.DescriptorEntry{{Key: "remote_address"}}, config.Limit{Requests: 10, Per: per(time.Hour), Algorithm: "FixedWindow"}),
			"each distinct descriptor value: 10 requests per hour, FixedWindow; fails open to 10 requests per hour per replica on 1 replica"},
		{d([]config.DescriptorEntry{{Key: "remote_address", Value: "50.0.0.5"}}, config.Limit{Per: per(time.Second)}),
			"the descriptor: every call denied (requests_per_unit 0)"},
		{d([]config.DescriptorEntry{{Key: "k", Value: "internal*"}}, config.Limit{Unlimited: true}),
			"each distinct descriptor value: unlimited (matches and answers OK without counting)"},
	} {
		c := &config.Config{APIVersion: config.APIVersion, Policies: []config.Policy{{Name: "p", UID: "u", Rules: []config.Rule{tt.rule}}}}
		ps, err := Config(c)
		if err != nil {
			t.Fatal(err)
		}
		if got := ps[0].Rules[0].Summary; got != tt.summary {
			t.Errorf("Summary = %q, want %q", got, tt.summary)
		}
	}
}

// The matching fields, key expressions, exemptions and a replaced cluster
// default are all said in words; none is left out of what a rule applies to.
func TestConditionsAndExemptions(t *testing.T) {
	t.Parallel()
	c := &config.Config{APIVersion: config.APIVersion, Policies: []config.Policy{{
		Name: "cluster.floor", UID: "c-u", Exempt: &config.Exempt{SourceCIDRs: []string{"10.0.0.0/8"}},
		Rules: []config.Rule{{
			Name: "orders", ReplacedBy: []string{"t-u"},
			Match: config.Match{
				Methods: []string{"POST"}, Hosts: []string{"api.example.com", "*.example.org"},
				Headers:     []config.HeaderMatch{{Name: "X-Tier", Regex: "free|trial"}, {Name: "X-Internal", Absent: true}, {Name: "X-Env", Value: "prod", Invert: true}},
				Query:       []config.QueryMatch{{Name: "dry-run", Absent: true}, {Name: "page"}},
				SourceCIDRs: []string{"192.0.2.0/24"},
				When:        []string{"request.path.startsWith('/orders')", "request.headers['x-org'] != 'acme'"},
			},
			Key:    []config.KeyPart{{Expression: "request.headers['x-org']"}},
			Exempt: &config.Exempt{When: []string{"request.headers['x-probe'] == 'health'"}},
			Limit:  config.Limit{Requests: 10, Per: per(time.Minute)},
		}, {
			Name: "plain", Key: []config.KeyPart{{ClientIP: &config.ClientIPKey{}}}, Limit: config.Limit{Requests: 10, Per: per(time.Minute)},
		}},
	}, {Name: "team", UID: "t-u", Rules: []config.Rule{{Name: "orders", Key: []config.KeyPart{{ClientIP: &config.ClientIPKey{}}}, Limit: config.Limit{Requests: 5, Per: per(time.Minute)}}}}}}
	ps, err := Config(c)
	if err != nil {
		t.Fatal(err)
	}
	r := ps[0].Rules[0]
	for _, f := range []struct{ name, got, want string }{
		{"Applies", r.Applies, "POST requests for api.example.com or *.example.org with header X-Tier matching free|trial and no X-Internal header and header X-Env other than prod" +
			" and no dry-run query parameter and a page query parameter from 192.0.2.0/24" +
			" when request.path.startsWith('/orders') and request.headers['x-org'] != 'acme'"},
		{"Counter", r.Counter, "each value of request.headers['x-org']"},
		{"MissingKey", r.MissingKey, "requests without value of request.headers['x-org'] share one counter"},
		{"Exempt", r.Exempt, "requests from 10.0.0.0/8, or requests when request.headers['x-probe'] == 'health': never limited, counted as exempt"},
		{"ReplacedBy", strings.Join(r.ReplacedBy, ","), "team"},
		{"plain Exempt", ps[0].Rules[1].Exempt, "requests from 10.0.0.0/8: never limited, counted as exempt"},
		{"plain Applies", ps[0].Rules[1].Applies, "all requests"},
		{"team Exempt", ps[1].Rules[0].Exempt, ""},
	} {
		if f.got != f.want {
			t.Errorf("%s = %q, want %q", f.name, f.got, f.want)
		}
	}
	if got := c.Policies[0].Rules[0].ReplacedBy[0]; got != "t-u" {
		t.Errorf("the config's ReplacedBy became %q: Config must not change its input", got)
	}
}
