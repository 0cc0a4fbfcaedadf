package ruleset

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/shedder"
)

func TestCompileConcurrencyAndShedding(t *testing.T) {
	t.Parallel()
	c, err := config.Load([]byte(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: a
  uid: ua
  replicas: 4
  loadShedding: {mode: Shadow, reserved: {critical: 30, default: 5}, maxLimit: 300}
  rules:
  - {name: exports, match: {path: {type: Prefix, value: /exports}}, key: [{header: X-Tenant}], concurrency: {max: 10}}
  - {name: pay-admin, match: {path: {type: Prefix, value: /pay/admin}}, priority: Sheddable}
  - {name: pay, match: {path: {type: Prefix, value: /pay}}, priority: Critical}
  - {name: rate, key: [{header: X-User}], limit: {requests: 5, per: 1s}, priority: Default}
  - {name: batch, match: {headers: [{name: X-Batch}]}, priority: Sheddable}
- name: b
  uid: ub
  loadShedding: {reserved: {critical: 0}}
  rules:
  - {name: all, key: [], concurrency: {max: 100, leaseTTL: 30s}, failureMode: Closed, mode: Shadow}
- name: other
  uid: uo
  podSelector: {matchLabels: {app: db}}
  loadShedding: {}
  rules:
  - {name: r, key: [], concurrency: {max: 1}}
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Compile(c, labels.Set{"app": "web"}, metrics.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Rules) != 1 || s.Rules[0].PolicyName != "a.rate" {
		t.Errorf("rate rules %d (first %q), want only a.rate", len(s.Rules), s.Rules[0].PolicyName)
	}
	if len(s.Concurrency) != 2 || s.ConcurrencyMatcher.Len() != 2 {
		t.Fatalf("%d concurrency rules, want 2", len(s.Concurrency))
	}
	ex, all := s.Concurrency[0], s.Concurrency[1]
	if ex.PolicyName != "a.exports" || ex.Engine.Max != 10 || ex.Engine.Fallback != 2 || ex.Engine.LeaseTTL != config.DefaultLeaseTTL {
		t.Errorf("a.exports = %+v", *ex.Engine)
	}
	if all.Engine.LeaseTTL.Seconds() != 30 || !all.Engine.FailClosed || !all.Engine.Shadow || all.Engine.Fallback != 100 {
		t.Errorf("b.all = %+v", *all.Engine)
	}
	sh := s.Shedding
	if sh == nil || sh.Policy != "a" {
		t.Fatalf("shedding %+v, want the first selecting policy's, a", sh)
	}
	if want := (shedder.Config{Shadow: true, CriticalReserve: 30, DefaultReserve: 5, MinLimit: config.DefaultSheddingMinLimit, MaxLimit: 300}); sh.Config != want {
		t.Errorf("shedder config %+v, want %+v", sh.Config, want)
	}
	for _, tc := range []struct {
		path string
		h    http.Header
		want shedder.Priority
	}{
		{"/pay/admin/x", nil, shedder.Sheddable}, // the first matching rule decides
		{"/pay/card", nil, shedder.Critical},
		{"/pay/card", http.Header{"X-Batch": {"1"}}, shedder.Critical},
		{"/reports", http.Header{"X-Batch": {"1"}}, shedder.Default}, // a.rate matches everything first
	} {
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		req.Header = tc.h
		var dr descriptor.Request
		dr.Reset(req, match.CleanPath(tc.path), s.Policies)
		if got, _ := sh.Classify(&dr, nil); got != tc.want {
			t.Errorf("Classify(%s, %v) = %v, want %v", tc.path, tc.h, got, tc.want)
		}
	}

	// A pod no policy with loadShedding selects has no shedder, even
	// with priorities.
	c.Policies[0].LoadShedding, c.Policies[1].LoadShedding = nil, nil
	s, err = Compile(c, labels.Set{"app": "web"}, metrics.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if s.Shedding != nil {
		t.Errorf("shedding %+v without a loadShedding section, want nil", s.Shedding)
	}
}

// Concurrency rules and priorities match as rate rules do: by host, CEL
// condition and key alternatives, with the policy's and the rule's
// exemptions; a policy that fails to compile takes its concurrency rules
// and priorities with it and leaves the others in force.
func TestConcurrencyRulesMatchHostsConditionsAndExemptions(t *testing.T) {
	t.Parallel()
	s, _ := compileDoc(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: a
  uid: ua
  exempt: {sourceCIDRs: [10.0.0.0/8]}
  loadShedding: {}
  rules:
  - name: exports
    match: {hosts: ["*.example.com"], when: ["request.path.startsWith('/exports')"]}
    keys: [[{header: X-Tenant}], []]
    concurrency: {max: 2}
    exempt: {when: ["request.headers['x-probe'] == 'health'"]}
  - name: vip
    match: {when: ["request.headers['x-plan'] == 'gold'"]}
    priority: Critical
- name: broken
  uid: ub
  jwt: {jwksFile: /nonexistent/jwks.json}
  rules:
  - name: held
    key: [{jwtClaim: sub}]
    concurrency: {max: 1}
    priority: Sheddable
`, labels.Set{})
	if len(s.Failed) != 1 || s.Failed[0].Name != "broken" {
		t.Fatalf("failed policies %v, want broken alone", s.Failed)
	}
	if len(s.Concurrency) != 1 || s.Concurrency[0].PolicyName != "a.exports" {
		t.Fatalf("concurrency rules %d, want a.exports alone", len(s.Concurrency))
	}
	rule := &s.Concurrency[0]
	for _, tc := range []struct {
		host, path, from string
		h                map[string]string
		match, exempt    bool
		prio             shedder.Priority
	}{
		{host: "api.example.com", path: "/exports/1", from: "192.0.2.1", match: true, prio: shedder.Default},
		{host: "example.org", path: "/exports/1", from: "192.0.2.1", prio: shedder.Default},
		{host: "api.example.com", path: "/reports", from: "192.0.2.1", h: map[string]string{"X-Plan": "gold"}, prio: shedder.Critical},
		{host: "api.example.com", path: "/exports/1", from: "10.1.2.3", match: true, exempt: true, prio: shedder.Default},
		{host: "api.example.com", path: "/exports/1", from: "192.0.2.1", h: map[string]string{"X-Probe": "health"}, match: true, exempt: true, prio: shedder.Default},
	} {
		req := httptest.NewRequest(http.MethodGet, "http://"+tc.host+tc.path, nil)
		req.RemoteAddr = tc.from + ":1234"
		for k, v := range tc.h {
			req.Header.Set(k, v)
		}
		var dr descriptor.Request
		dr.Reset(req, match.CleanPath(tc.path), s.Policies)
		idx := s.ConcurrencyMatcher.Match(&dr, nil)
		if got := len(idx) == 1; got != tc.match {
			t.Errorf("%s%s: matched %v, want %v", tc.host, tc.path, got, tc.match)
			continue
		}
		if tc.match {
			if got := rule.Exempt.Holds(&dr); got != tc.exempt {
				t.Errorf("%s%s from %s: exempt %v, want %v", tc.host, tc.path, tc.from, got, tc.exempt)
			}
			if _, ok, err := rule.Extract.Key(&dr); err != nil || !ok {
				t.Errorf("%s%s: no key (%v): the empty last alternative keys every request", tc.host, tc.path, err)
			}
		}
		if got, _ := s.Shedding.Classify(&dr, nil); got != tc.prio {
			t.Errorf("%s%s %v: priority %v, want %v", tc.host, tc.path, tc.h, got, tc.prio)
		}
	}
}
