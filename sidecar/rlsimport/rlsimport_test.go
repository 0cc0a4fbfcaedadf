package rlsimport_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
)

func TestConvertMapping(t *testing.T) {
	t.Parallel()
	c, m, err := rlsimport.Load([]byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5, name: mk}
  - key: to_number
    rate_limit: {unit: Minute, requests_per_unit: 100, replaces: [{name: mk}, {name: nobody}]}
    shadow_mode: true
  - key: ip
    value: 10.0.0.1
  - key: ldap
    rate_limit: {unlimited: true}
  - key: path
    value: "/a b/*"
    rate_limit: {unit: second, requests_per_unit: 0}
---
domain: other
descriptors:
  - key: k
    rate_limit: {unit: week, requests_per_unit: 1}
`), rlsimport.Options{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(c.Policies), 2; got != want {
		t.Fatalf("%d policies, want %d", got, want)
	}
	p := c.Policies[0]
	if p.Name != "messaging" || p.UID != "envoy.messaging" || p.Replicas != 3 {
		t.Errorf("policy %s uid %s replicas %d", p.Name, p.UID, p.Replicas)
	}
	byName := map[string]config.Rule{}
	for _, r := range p.Rules {
		byName[r.Name] = r
	}
	nested, okN := byName["message_type_marketing.to_number"]
	if !okN || len(nested.Match.Descriptors.Entries) != 2 || nested.Limit.Requests != 5 || nested.Limit.Per.Duration != 24*time.Hour || nested.Limit.Algorithm != "FixedWindow" {
		t.Errorf("nested rule %+v", nested)
	}
	top := byName["to_number"]
	if top.Mode != config.ModeShadow || top.Limit.Per.Duration != time.Minute || len(top.Match.Descriptors.Replaces) != 1 || top.Match.Descriptors.Replaces[0] != "message_type_marketing.to_number" {
		t.Errorf("top rule %+v", top)
	}
	if r := byName["ip_10.0.0.1"]; !r.Limit.Unlimited {
		t.Errorf("whitelisted descriptor became %+v, want an unlimited rule", r)
	}
	if r := byName["ldap"]; !r.Limit.Unlimited {
		t.Errorf("unlimited descriptor became %+v", r)
	}
	var blocked *config.Rule
	for i, r := range p.Rules {
		if strings.HasPrefix(r.Name, "path_-a-b--") {
			blocked = &p.Rules[i]
		}
	}
	if blocked == nil || blocked.Limit.Requests != 0 || blocked.Match.Descriptors.Entries[0].Value != "/a b/*" {
		t.Errorf("blocking wildcard rule missing or wrong: %+v (rules %v)", blocked, byName)
	}
	if got := c.Policies[1].Rules[0].Limit.Per.Duration; got != 7*24*time.Hour {
		t.Errorf("week = %v", got)
	}
	if len(m.Warnings) != 1 || !strings.Contains(m.Warnings[0], `"nobody"`) {
		t.Errorf("warnings %q, want one about replaces nobody", m.Warnings)
	}
	var out bytes.Buffer
	if err := rlsimport.Explain(&out, c, rlsimport.FormatEnvoy, m); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"envoyproxy/ratelimit config", "domains: 2", "requests_per_unit 0: denies every call", "whitelisted", "shadow", "replaces message_type_marketing.to_number"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explanation lacks %q:\n%s", want, out.String())
		}
	}
}

// Explain (floodgate-sidecar --check-config) words a concurrency rule as
// kubectl floodgate explain does, says what a rule that only sets a
// priority does, and counts the rules of each kind; a rule without a limit
// is not a rate rule that denies every call. Matches and key alternatives
// are worded as explain words them (Applies, Counter).
func TestExplainConcurrencyRule(t *testing.T) {
	t.Parallel()
	c, f, m, err := rlsimport.LoadAny([]byte(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: exports
  uid: exports-1
  replicas: 3
  rules:
  - name: per-tenant
    match: {path: {type: Prefix, value: /exports}}
    key: [{header: X-Tenant}]
    concurrency: {max: 10}
  - name: streams
    concurrency: {max: 1, leaseTTL: 2m}
    failureMode: Closed
    mode: Shadow
    priority: Sheddable
  - name: per-key
    match: {methods: [GET, POST], headers: [{name: X-Tier, value: free}]}
    keys: [[{header: X-API-Key}], [{clientIP: {}}]]
    limit: {requests: 100, per: 1m}
  - name: payments
    match: {path: {type: Prefix, value: /pay}}
    priority: Critical
`), rlsimport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := rlsimport.Explain(&out, c, f, m); err != nil {
		t.Fatal(err)
	}
	want := `format: floodgate sidecar config (floodgate.dev/sidecar-config/v1)
policies: 1, rules: 4 (1 rate, 2 concurrency, 1 priority only)

policy exports (uid exports-1, replicas 3)
  rule per-tenant
    match: HTTP requests to paths under /exports; counted by each X-Tenant
    limit: at most 10 requests in flight at once across replicas (a crashed sidecar's slots come back after 10 s); fails open to 3 in flight per replica on 3 replicas
  rule streams
    match: HTTP all requests; counted by all of them together (one counter)
    limit: at most 1 request in flight at once across replicas (a crashed sidecar's slots come back after 2 min); fails closed: 503 while the store is unreachable; shadow: counted and reported, never denies; marks its requests Sheddable for the load shedder
  rule per-key
    match: HTTP all GET and POST and HEAD requests with header X-Tier: free; counted by each X-API-Key, else each client IP
    limit: 100 per 1m0s, TokenBucket; fails open to a local share when the store is unreachable
  rule payments
    match: HTTP requests to paths under /pay
    limit: no limit: marks the requests it matches Critical for the load shedder
`
	if got := out.String(); got != want {
		t.Errorf("Explain:\n%s\nwant\n%s", got, want)
	}
}

func TestHTTPRules(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		rate, concurrency int
		want              string
	}{{0, 0, "0 HTTP rules"}, {2, 0, "2 HTTP rules"}, {0, 1, "1 HTTP rules (0 rate, 1 concurrency)"}, {2, 1, "3 HTTP rules (2 rate, 1 concurrency)"}} {
		if got := rlsimport.HTTPRules(tt.rate, tt.concurrency); got != tt.want {
			t.Errorf("HTTPRules(%d, %d) = %q, want %q", tt.rate, tt.concurrency, got, tt.want)
		}
	}
}

func TestPeriod(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		time.Second: "second", 10 * time.Second: "10 s", 1500 * time.Millisecond: "1.5 s", time.Minute: "minute",
		90 * time.Second: "90 s", 2 * time.Minute: "2 min", time.Hour: "hour", 36 * time.Hour: "36 h", 24 * time.Hour: "day", 7 * 24 * time.Hour: "7 d",
	} {
		if got := rlsimport.Period(d); got != want {
			t.Errorf("Period(%v) = %q, want %q", d, got, want)
		}
	}
}

// Bad configs are rejected as envoyproxy/ratelimit rejects them, every
// problem at once.
func TestConvertErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ doc, want string }{
		"unknown key":        {"domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: second}\n", "ratelimit"},
		"empty domain":       {"descriptors:\n  - key: k\n", "domain must not be empty"},
		"empty key":          {"domain: d\ndescriptors:\n  - value: v\n", "empty key"},
		"duplicate key":      {"domain: d\ndescriptors:\n  - key: k\n  - key: k\n", "duplicate descriptor composite key \"d.k\""},
		"bad unit":           {"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "invalid rate limit unit"},
		"unit and unlimited": {"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unlimited: true}\n", "should not specify rate limit unit when unlimited"},
		"empty replaces":     {"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}\n", "empty replaces entry"},
		"self replaces":      {"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n", "name of same descriptor"},
		"duplicate domain":   {"domain: d\ndescriptors: [{key: k}]\n---\ndomain: d\ndescriptors: [{key: j}]\n", "duplicate domain"},
		"share_threshold":    {"domain: d\ndescriptors:\n  - key: k\n    value: a*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "share_threshold"},
		"negative":           {"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "line 4: cannot unmarshal !!int `-1` into uint32"},
		"too large":          {"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n", "requests: must be between 1 and 1000000000"},
		"not yaml":           {"domain: [\n", "parse envoy ratelimit config"},
	}
	for name, tc := range cases {
		_, _, err := rlsimport.Load([]byte(tc.doc), rlsimport.Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
	// Two problems in one document are both reported.
	_, _, err := rlsimport.Load([]byte("domain: d\ndescriptors:\n  - key: ''\n  - key: k\n    rate_limit: {unit: eon, requests_per_unit: 1}\n"), rlsimport.Options{})
	if err == nil || !strings.Contains(err.Error(), "empty key") || !strings.Contains(err.Error(), "eon") {
		t.Errorf("error %v, want both problems", err)
	}
}

func TestDetect(t *testing.T) {
	t.Parallel()
	cases := []struct {
		doc  string
		want rlsimport.Format
		err  string
	}{
		{"apiVersion: floodgate.dev/sidecar-config/v1\npolicies: []\n", rlsimport.FormatFloodgate, ""},
		{`{"apiVersion": "floodgate.dev/sidecar-config/v1", "policies": []}`, rlsimport.FormatFloodgate, ""},
		{"# comment\n---\ndomain: d\ndescriptors: []\n", rlsimport.FormatEnvoy, ""},
		{"descriptors: []\n", rlsimport.FormatEnvoy, ""},
		{"", 0, "empty document"},
		{"kind: ConfigMap\n", 0, "unknown format: top-level keys [kind]"},
		{"- a\n", 0, "not YAML"},
	}
	for _, tc := range cases {
		got, err := rlsimport.Detect([]byte(tc.doc))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Detect(%q) error %v, want %q", tc.doc, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Detect(%q) = %v, %v, want %v", tc.doc, got, err, tc.want)
		}
	}
}

func FuzzLoadAny(f *testing.F) {
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	f.Add([]byte("apiVersion: floodgate.dev/sidecar-config/v1\npolicies: []\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, _, _, err := rlsimport.LoadAny(data, rlsimport.Options{})
		if err == nil && c.Validate() != nil {
			t.Fatalf("LoadAny accepted a config that does not validate")
		}
	})
}
