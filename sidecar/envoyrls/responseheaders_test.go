package envoyrls_test

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// A rule's responseHeaders: RetryAfter sends Retry-After alone on a deny,
// None nothing at all; a hidden rule's descriptor status carries the code
// alone, so that Envoy's own X-RateLimit fields (enable_x_ratelimit_headers)
// cannot state its numbers either; and on a descriptor two rules limit,
// the one that shows its numbers describes it.
func TestResponseHeadersModes(t *testing.T) {
	t.Parallel()
	r := newRLS(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: shop
  uid: hdrmodes
  rules:
  - name: retry
    match: {descriptors: {domain: d, entries: [{key: retry}]}}
    limit: {requests: 1, per: 1m, algorithm: FixedWindow}
    responseHeaders: RetryAfter
  - name: quiet
    match: {descriptors: {domain: d, entries: [{key: quiet}]}}
    limit: {requests: 1, per: 1m, algorithm: FixedWindow}
    responseHeaders: None
  - name: wide
    match: {descriptors: {domain: d, entries: [{key: mix}]}}
    limit: {requests: 8, per: 1m, algorithm: FixedWindow}
  - name: guard
    match: {descriptors: {domain: d, entries: [{key: mix}]}}
    limit: {requests: 3, per: 1m, algorithm: FixedWindow}
    responseHeaders: None
`, setup{headers: true})
	headers := func(out *rlsv3.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, h := range out.ResponseHeadersToAdd {
			m[h.Key] = h.Value
		}
		return m
	}
	hidden := func(name string, out *rlsv3.RateLimitResponse) {
		t.Helper()
		for _, s := range out.Statuses {
			if s.CurrentLimit != nil || s.LimitRemaining != 0 || s.DurationUntilReset != nil {
				t.Errorf("%s: status %v states a number", name, s)
			}
		}
	}

	out := r.call(t, req("d", d("retry=a")))
	if h := headers(out); len(h) != 0 {
		t.Errorf("retry, allowed: headers %v, want none", h)
	}
	hidden("retry, allowed", out)
	out = r.call(t, req("d", d("retry=a")))
	if h := headers(out); out.OverallCode != over || len(h) != 1 || h["Retry-After"] == "" {
		t.Errorf("retry, denied: %v headers %v, want Retry-After alone", out.OverallCode, h)
	}
	hidden("retry, denied", out)

	for i := range 2 {
		out = r.call(t, req("d", d("quiet=a")))
		if h := headers(out); len(h) != 0 {
			t.Errorf("quiet, call %d: headers %v, want none", i, h)
		}
		hidden("quiet", out)
	}
	if out.OverallCode != over {
		t.Errorf("quiet: the second call is %v, want OVER_LIMIT", out.OverallCode)
	}

	for i := range 4 {
		out = r.call(t, req("d", d("mix=a")))
		h := headers(out)
		if i < 3 {
			if h["X-RateLimit-Limit"] != "8" || h["RateLimit-Policy"] != `"shop.wide";q=8;w=60` {
				t.Errorf("mix, call %d: headers %v, want wide's", i, h)
			}
			if s := out.Statuses[0]; s.CurrentLimit == nil || s.CurrentLimit.RequestsPerUnit != 8 {
				t.Errorf("mix, call %d: status %v, want wide's", i, s)
			}
			continue
		}
		if out.OverallCode != over || len(h) != 0 {
			t.Errorf("mix, denied by guard: %v headers %v, want none", out.OverallCode, h)
		}
		hidden("mix, denied by guard", out)
	}
}
