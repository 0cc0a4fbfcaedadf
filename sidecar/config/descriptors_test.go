package config_test

import (
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

func TestDescriptorRulesValidate(t *testing.T) {
	t.Parallel()
	good := `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: u
  rules:
  - name: per-user
    match: {descriptors: {domain: d, entries: [{key: user}], replaces: [vip]}}
    limit: {requests: 10, per: 1s, algorithm: FixedWindow}
  - name: vip
    match: {descriptors: {domain: d, entries: [{key: user, value: "alice"}]}}
    limit: {unlimited: true}
  - name: blocked
    match: {descriptors: {domain: d, entries: [{key: ip, value: "10.*"}]}}
    limit: {requests: 0, per: 1m}
`
	if _, err := config.Load([]byte(good)); err != nil {
		t.Fatalf("valid descriptor rules rejected: %v", err)
	}
	bad := `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: u
  rules:
  - name: a
    match: {path: {type: Prefix, value: /x}, descriptors: {domain: "", entries: []}}
    key: [{header: X}]
    cost: {default: 2}
    limit: {requests: 10, per: 1s}
  - name: b
    match: {descriptors: {domain: d, entries: [{key: ""}], replaces: [b, nope, c]}}
    limit: {unlimited: true, requests: 3}
  - name: c
    limit: {unlimited: true}
  - name: e
    match: {descriptors: {domain: d, entries: [{key: k}]}}
    limit: {requests: 0, per: 0s}
`
	_, err := config.Load([]byte(bad))
	if err == nil {
		t.Fatal("invalid descriptor rules accepted")
	}
	for _, want := range []string{
		"policies[0].rules[0].match: a descriptor rule matches Envoy rate-limit descriptors only",
		"policies[0].rules[0].match.descriptors.domain: must be 1-256",
		"policies[0].rules[0].match.descriptors.entries: must have 1-16 entries",
		"policies[0].rules[0].key: a descriptor rule is keyed by the descriptor's values",
		"policies[0].rules[0].cost: a descriptor rule is charged the call's hits_addend",
		"policies[0].rules[1].match.descriptors.entries[0].key: must be 1-256",
		"policies[0].rules[1].limit: an unlimited rule takes no requests",
		"policies[0].rules[1].match.descriptors.replaces[0]: a rule cannot replace itself",
		`policies[0].rules[1].match.descriptors.replaces[1]: no rule named "nope"`,
		`policies[0].rules[1].match.descriptors.replaces[2]: rule "c" is not a descriptor rule of domain "d"`,
		"policies[0].rules[2].limit.unlimited: only a descriptor rule",
		"policies[0].rules[3].limit.per: must be between 1s",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
