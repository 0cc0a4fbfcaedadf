package config

import (
	"errors"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/internal/message"
)

func TestConcurrencyAndSheddingLoad(t *testing.T) {
	t.Parallel()
	c, err := Load([]byte(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: u
  replicas: 4
  loadShedding: {reserved: {critical: 0}, maxLimit: 50}
  rules:
  - {name: exports, key: [{header: X-Tenant}], concurrency: {max: 10}}
  - {name: streams, key: [{clientIP: {}}], concurrency: {max: 3, leaseTTL: 30s}, mode: Shadow, failureMode: Closed}
  - {name: global, key: [], concurrency: {max: 100}}
  - {name: pay, match: {path: {type: Prefix, value: /pay}}, priority: Critical}
  - {name: rate, key: [{header: X-User}], limit: {requests: 5, per: 1s}, priority: Sheddable}
`))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	r := c.Policies[0].Rules
	if got, want := r[0].Concurrency.TTL(), DefaultLeaseTTL; got != want {
		t.Errorf("default lease TTL = %v, want %v", got, want)
	}
	if got, want := r[1].Concurrency.TTL(), 30*time.Second; got != want {
		t.Errorf("lease TTL = %v, want %v", got, want)
	}
	if r[0].IsRate() || r[3].IsRate() || !r[4].IsRate() {
		t.Errorf("IsRate: concurrency %v, priority-only %v, rate %v; want false, false, true", r[0].IsRate(), r[3].IsRate(), r[4].IsRate())
	}
	ls := c.Policies[0].LoadShedding
	crit, deflt := ls.Reserved.Shares()
	lo, hi := ls.Limits()
	if crit != 0 || deflt != DefaultDefaultReserve || lo != DefaultSheddingMinLimit || hi != 50 {
		t.Errorf("shares %d,%d limits %d,%d; want 0,%d and %d,50", crit, deflt, lo, hi, DefaultDefaultReserve, DefaultSheddingMinLimit)
	}
}

func TestConcurrencyAndSheddingValidate(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: u
  loadShedding: {mode: Off, reserved: {critical: 95, default: -1}, minLimit: 10, maxLimit: 5}
  rules:
  - {name: both, key: [], limit: {requests: 1, per: 1s}, concurrency: {max: 1}}
  - {name: zero, key: [], concurrency: {max: 0, leaseTTL: 100ms}}
  - {name: big, key: [], concurrency: {max: 100001, leaseTTL: 1h}, cost: {default: 2}}
  - {name: nothing, key: []}
  - {name: urgent, priority: Urgent}
  - {name: free, priority: Critical, cost: {default: 1}}
  - {name: desc, match: {descriptors: {domain: d, entries: [{key: k}]}}, limit: {requests: 1, per: 1s}, concurrency: {max: 1}, priority: Critical}
- name: q
  uid: v
  loadShedding: {reserved: {critical: 50, default: 41}}
  rules:
  - {name: r, priority: Sheddable}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	err = c.Validate()
	if err == nil {
		t.Fatal("Validate succeeded, want errors")
	}
	want := []string{
		"policies[0].loadShedding.mode",
		"policies[0].loadShedding.reserved.critical",
		"policies[0].loadShedding.reserved.default",
		"policies[0].loadShedding.minLimit",
		"policies[0].rules[0]",
		"policies[0].rules[1].concurrency.max",
		"policies[0].rules[1].concurrency.leaseTTL",
		"policies[0].rules[2].concurrency.max",
		"policies[0].rules[2].concurrency.leaseTTL",
		"policies[0].rules[2].cost",
		"policies[0].rules[3]",
		"policies[0].rules[4].priority",
		"policies[0].rules[5].cost",
		"policies[0].rules[6].concurrency",
		"policies[0].rules[6].priority",
		"policies[1].loadShedding.reserved",
	}
	got := map[string]bool{}
	for _, e := range message.Unjoin(err) {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Errorf("error %q is not a *FieldError", e)
			continue
		}
		got[fe.Path] = true
	}
	for _, p := range want {
		if !got[p] {
			t.Errorf("no error reported at %s; errors:\n%v", p, err)
		}
	}
	// A limit the rule does not use is never checked as one: the rules
	// that are not rates report no limit problem.
	for _, p := range []string{"policies[0].rules[1].limit.requests", "policies[0].rules[3].limit.requests", "policies[0].rules[4].limit.per"} {
		if got[p] {
			t.Errorf("error reported at %s, which the rule does not have", p)
		}
	}
}
