package config

import (
	"strings"
	"testing"
)

func TestValidHostPattern(t *testing.T) {
	t.Parallel()
	for h, want := range map[string]bool{
		"api.example.com": true, "*.example.com": true, "localhost": true, "a-b.c0": true,
		"": false, "*.": false, "*": false, "API.example.com": false, "a..b": false, "-a.b": false,
		"a-.b": false, "a.*.b": false, "**.b": false, "a_b.c": false, "a.b:80": false,
	} {
		if got := ValidHostPattern(h); got != want {
			t.Errorf("ValidHostPattern(%q) = %v, want %v", h, got, want)
		}
	}
}

func TestMatchHostsAreValidated(t *testing.T) {
	t.Parallel()
	_, err := Load([]byte(`
apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: p
  rules:
  - name: r
    match: {hosts: [ok.example.com, "Bad.Example.com"]}
    limit: {requests: 1, per: 1s}
  - name: d
    match: {hosts: [ok.example.com], descriptors: {domain: x, entries: [{key: k}]}}
    limit: {requests: 1, per: 1s}
`))
	if err == nil {
		t.Fatal("Load accepted an upper-case host and hosts on a descriptor rule")
	}
	for _, want := range []string{"rules[0].match.hosts[1]", "rules[1].match", "hosts must be empty"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
