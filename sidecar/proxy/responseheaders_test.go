package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
)

// responseHeadersDoc has a rule of each responseHeaders mode, and a path
// two rules match: wide, which shows its numbers, and guard, a tighter one
// that hides them. Rule and policy names hold no digit, so that a digit in
// an answer can only be a number.
const responseHeadersDoc = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: shop
  uid: uid-shop
  rules:
  - name: full
    match: {path: {type: Prefix, value: /fast/full}}
    key: []
    limit: {requests: 1, per: 1m}
  - name: retry
    match: {path: {type: Prefix, value: /fast/retry}}
    key: []
    limit: {requests: 1, per: 1m}
    responseHeaders: RetryAfter
  - name: quiet
    match: {path: {type: Prefix, value: /fast/none}}
    key: []
    limit: {requests: 3, per: 1m}
    responseHeaders: None
  - name: wide
    match: {path: {type: Prefix, value: /fast/mix}}
    key: []
    limit: {requests: 8, per: 1m}
  - name: guard
    match: {path: {type: Prefix, value: /fast/mix}}
    key: []
    limit: {requests: 3, per: 1m}
    responseHeaders: None
`

// rateFields returns the rate-limit fields of an answer.
func rateFields(h http.Header) map[string]string {
	out := map[string]string{}
	for _, name := range ratelimitheaders.Names {
		if v, ok := h[http.CanonicalHeaderKey(name)]; ok {
			out[name] = strings.Join(v, ",")
		}
	}
	return out
}

func TestResponseHeadersFullOnBothFronts(t *testing.T) {
	t.Parallel()
	for _, f := range frontsFor(t, newBackend(t), responseHeadersDoc) {
		r := do(t, f.url, "/fast/full")
		if got, want := r.status, http.StatusOK; got != want {
			t.Fatalf("%s: status %d, want %d", f.name, got, want)
		}
		if got, want := len(rateFields(r.header)), int(ratelimitheaders.RetryAfter); got != want {
			t.Errorf("%s: admitted: fields %v, want %d of them", f.name, rateFields(r.header), want)
		}
		r = do(t, f.url, "/fast/full")
		if got, want := r.status, http.StatusTooManyRequests; got != want {
			t.Fatalf("%s: status %d, want %d", f.name, got, want)
		}
		if got, want := len(rateFields(r.header)), int(ratelimitheaders.NumFields); got != want {
			t.Errorf("%s: denied: fields %v, want %d of them", f.name, rateFields(r.header), want)
		}
		if !strings.Contains(r.body, "rule full exceeded") || !strings.Contains(r.body, `"retryAfter":`) {
			t.Errorf("%s: body %s, want the rule named and retryAfter", f.name, r.body)
		}
	}
}

// RetryAfter: nothing on an admitted answer; Retry-After alone on a 429,
// whose body names no rule but keeps retryAfter.
func TestResponseHeadersRetryAfterOnBothFronts(t *testing.T) {
	t.Parallel()
	for _, f := range frontsFor(t, newBackend(t), responseHeadersDoc) {
		r := do(t, f.url, "/fast/retry")
		if got, want := r.status, http.StatusOK; got != want {
			t.Fatalf("%s: status %d, want %d", f.name, got, want)
		}
		if got := rateFields(r.header); len(got) != 0 {
			t.Errorf("%s: admitted: fields %v, want none", f.name, got)
		}
		for range 2 {
			r = do(t, f.url, "/fast/retry")
			if got, want := r.status, http.StatusTooManyRequests; got != want {
				t.Fatalf("%s: status %d, want %d", f.name, got, want)
			}
			got := rateFields(r.header)
			if len(got) != 1 || got["Retry-After"] == "" || got["Retry-After"] == "0" {
				t.Errorf("%s: denied: fields %v, want Retry-After alone", f.name, got)
			}
			if strings.Contains(r.body, "rule ") || !strings.Contains(r.body, `"retryAfter":`+got["Retry-After"]) {
				t.Errorf("%s: body %s, want no rule named and retryAfter %s", f.name, r.body, got["Retry-After"])
			}
		}
	}
}

// The attacker's view of a None rule: a client that probes it learns
// nothing of the limit, what remains or the window, from the fields or
// the body, before the threshold or past it.
func TestResponseHeadersNoneTellsAProbeNothing(t *testing.T) {
	t.Parallel()
	for _, f := range frontsFor(t, newBackend(t), responseHeadersDoc) {
		for _, path := range []string{"/fast/none", "/fast/mix"} {
			// 3 per minute: the digits 3, 0 (remaining 0, and the window
			// 60) and 6 must not appear.
			for i := range 5 {
				r := do(t, f.url, path)
				want := http.StatusOK
				if i >= 3 {
					want = http.StatusTooManyRequests
				}
				if r.status != want {
					t.Fatalf("%s %s: request %d: status %d, want %d", f.name, path, i, r.status, want)
				}
				fields := rateFields(r.header)
				if path == "/fast/mix" && r.status == http.StatusOK {
					// wide shows its own numbers, never guard's.
					if got, want := fields["X-RateLimit-Limit"], "8"; got != want {
						t.Errorf("%s %s: request %d: X-RateLimit-Limit %q, want wide's %q", f.name, path, i, got, want)
					}
					if got, want := fields["RateLimit-Policy"], `"shop.wide";q=8;w=60`; got != want {
						t.Errorf("%s %s: request %d: RateLimit-Policy %q, want %q", f.name, path, i, got, want)
					}
					continue
				}
				if len(fields) != 0 {
					t.Errorf("%s %s: request %d: fields %v, want none", f.name, path, i, fields)
				}
				if r.status == http.StatusOK {
					continue
				}
				if strings.ContainsAny(r.body, "036") {
					t.Errorf("%s %s: request %d: body %s states a number of the rule", f.name, path, i, r.body)
				}
				if strings.Contains(r.body, "retryAfter") || strings.Contains(r.body, "quiet") || strings.Contains(r.body, "guard") {
					t.Errorf("%s %s: request %d: body %s names the rule or a wait", f.name, path, i, r.body)
				}
			}
		}
	}
}

// One connection's refusals by rules of different modes, one after
// another: the lean front's prebuilt deny answer is built again for each,
// never served for a rule of another mode.
func TestResponseHeadersDenyAnswersDoNotMix(t *testing.T) {
	t.Parallel()
	for _, f := range frontsFor(t, newBackend(t), responseHeadersDoc) {
		for _, path := range []string{"/fast/full", "/fast/retry", "/fast/none", "/fast/none", "/fast/none"} {
			do(t, f.url, path) // spend them
		}
		nc, br := send(t, f.url, "/fast/full")
		want := map[string]int{"/fast/full": int(ratelimitheaders.NumFields), "/fast/retry": 1, "/fast/none": 0}
		paths := []string{"/fast/full", "/fast/full", "/fast/retry", "/fast/retry", "/fast/none", "/fast/full", "/fast/none", "/fast/retry"}
		for i, path := range paths {
			if i > 0 {
				if _, err := nc.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: test\r\n\r\n")); err != nil {
					t.Fatal(err)
				}
			}
			r := readReply(t, br)
			if got, want := r.status, http.StatusTooManyRequests; got != want {
				t.Fatalf("%s: %s: status %d, want %d", f.name, path, got, want)
			}
			fields := rateFields(r.header)
			if got, want := len(fields), want[path]; got != want {
				t.Errorf("%s: request %d, %s: fields %v, want %d of them", f.name, i, path, fields, want)
			}
			if named := strings.Contains(r.body, "rule "); named != (path == "/fast/full") {
				t.Errorf("%s: request %d, %s: body %s", f.name, i, path, r.body)
			}
		}
	}
}
