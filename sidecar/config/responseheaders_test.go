package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/internal/message"
)

func TestValidateResponseHeaders(t *testing.T) {
	t.Parallel()
	doc := func(rule string) string {
		return `
apiVersion: floodgate.dev/sidecar-config/v1
store: {type: memory}
policies:
- name: p
  uid: u1
  rules:
  - ` + rule + "\n"
	}
	for _, tc := range []struct {
		name, rule string
		want       string // the error's text, or "" for none
	}{
		{"unset", `{name: r, key: [], limit: {requests: 5, per: 1s}}`, ""},
		{"Full", `{name: r, key: [], limit: {requests: 5, per: 1s}, responseHeaders: Full}`, ""},
		{"RetryAfter", `{name: r, key: [], limit: {requests: 5, per: 1s}, responseHeaders: RetryAfter}`, ""},
		{"None", `{name: r, key: [], limit: {requests: 5, per: 1s}, responseHeaders: None}`, ""},
		{"a descriptor rule", `{name: r, key: [], match: {descriptors: {domain: d, entries: [{key: k}]}}, limit: {requests: 5, per: 1s}, responseHeaders: None}`, ""},
		{"unknown", `{name: r, key: [], limit: {requests: 5, per: 1s}, responseHeaders: Limit}`,
			`policies[0].rules[0].responseHeaders: must be Full, RetryAfter or None, got "Limit"`},
		{"lower case", `{name: r, key: [], limit: {requests: 5, per: 1s}, responseHeaders: none}`,
			`policies[0].rules[0].responseHeaders: must be Full, RetryAfter or None, got "none"`},
		{"a concurrency rule", `{name: r, key: [], concurrency: {max: 3}, responseHeaders: None}`,
			"policies[0].rules[0].responseHeaders: applies to rate limits only"},
		{"a priority rule", `{name: r, key: [], priority: Critical, responseHeaders: RetryAfter}`,
			"policies[0].rules[0].responseHeaders: applies to rate limits only"},
	} {
		c, err := Parse([]byte(doc(tc.rule)))
		if err != nil {
			t.Fatalf("%s: Parse: %v", tc.name, err)
		}
		err = c.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: Validate() = %v, want nil", tc.name, err)
			}
			continue
		}
		found := false
		for _, e := range message.Unjoin(err) {
			var fe *FieldError
			if errors.As(e, &fe) && strings.Contains(e.Error(), tc.want) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: Validate() = %v, want an error %q", tc.name, err, tc.want)
		}
	}
}
