package proxy

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

const doc = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  rules:
  - name: deny
    match: {path: {type: Prefix, value: /deny}}
    key: [{header: X-Key}]
    limit: {requests: 1, per: 1h}
  - name: unicode
    match: {path: {type: Prefix, value: /u}}
    key: [{header: X-Key}]
    onMissingKey: Reject
    limit: {requests: 1, per: 1h}
  - name: cost
    match: {path: {type: Prefix, value: /cost}}
    key: [{header: X-Key}]
    onMissingKey: Shared
    cost: {fromHeader: X-Cost}
    limit: {requests: 10, per: 1h}
`

func newProxy(tb testing.TB, upstream string) *Proxy {
	tb.Helper()
	c, err := config.Load([]byte(doc))
	if err != nil {
		tb.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	set, err := ruleset.Compile(c, labels.Set{}, m)
	if err != nil {
		tb.Fatal(err)
	}
	st, err := memstore.New()
	if err != nil {
		tb.Fatal(err)
	}
	e, err := engine.New(engine.Options{Store: st, Fallback: st, Metrics: m})
	if err != nil {
		tb.Fatal(err)
	}
	u, err := url.Parse(upstream)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := New(Options{Upstream: u, Engine: e, Metrics: m, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	p.SetRules(set)
	return p
}

func TestNewRejectsMissingDependencies(t *testing.T) {
	t.Parallel()
	if _, err := New(Options{}); err == nil {
		t.Error("New without dependencies succeeded")
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	st, _ := memstore.New()
	e, _ := engine.New(engine.Options{Store: st, Fallback: st, Metrics: m})
	if _, err := New(Options{Upstream: &url.URL{Scheme: "ftp", Host: "x"}, Engine: e, Metrics: m}); err == nil {
		t.Error("an ftp upstream was accepted")
	}
}

func TestProblemBodiesAreValidJSON(t *testing.T) {
	t.Parallel()
	p := newProxy(t, "http://127.0.0.1:1")
	for range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/deny", nil)
		req.Header.Set("X-Key", "\"quote\\ \x01 ünïcode")
		p.ServeHTTP(rec, req)
		if rec.Code == http.StatusTooManyRequests {
			var v map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
				t.Fatalf("429 body %q: %v", rec.Body, err)
			}
			return
		}
	}
	t.Fatal("no 429")
}

func TestNoConfigIs503(t *testing.T) {
	t.Parallel()
	m := metrics.NewMetrics(prometheus.NewRegistry())
	st, _ := memstore.New()
	e, _ := engine.New(engine.Options{Store: st, Fallback: st, Metrics: m})
	p, err := New(Options{Upstream: &url.URL{Scheme: "http", Host: "127.0.0.1:1"}, Engine: e, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "1" {
		t.Errorf("no config: %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
}

// appendJSONString writes any string as JSON that encoding/json reads back
// as encoding/json would have written it: valid UTF-8 as it is, each byte
// of invalid UTF-8 as U+FFFD. Non-ASCII text is written raw, not as
// escapes of its bytes.
func TestAppendJSONString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want string // the encoding, "" when only its decoding is checked
	}{
		{"", `""`},
		{"plain", `"plain"`},
		{`q"b\`, `"q\"b\\"`},
		{"tab\tnl\ncr\r", `"tab\tnl\ncr\r"`},
		{"\x00\x1f\x7f", `"\u0000\u001f` + "\x7f" + `"`},
		{"ü€😀", `"ü€😀"`},
		{"Grüße, 世界: rule ü exceeded", `"Grüße, 世界: rule ü exceeded"`},
		{"line\u2028para\u2029", `"line\u2028para\u2029"`},
		{"bad \xff byte", `"bad \ufffd byte"`},
		{"cut \xe2\x82", `"cut \ufffd\ufffd"`},
		{"\xed\xa0\x80 surrogate", ""},
		{"overlong \xc0\xaf", ""},
		{"\x80\xbf\xfe\xff", ""},
		{"mixed ü\xffé\x00\"", ""},
	} {
		out := appendJSONString([]byte("x"), tc.in)
		if out[0] != 'x' {
			t.Fatalf("%q: the prefix was overwritten: %q", tc.in, out)
		}
		out = out[1:]
		if tc.want != "" && string(out) != tc.want {
			t.Errorf("appendJSONString(%q) = %s, want %s", tc.in, out, tc.want)
		}
		if !utf8.Valid(out) {
			t.Errorf("appendJSONString(%q) = %q: not valid UTF-8", tc.in, out)
		}
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Errorf("appendJSONString(%q) = %s: %v", tc.in, out, err)
			continue
		}
		ref, err := json.Marshal(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		var want string
		if err := json.Unmarshal(ref, &want); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("appendJSONString(%q) decodes to %q, want %q", tc.in, got, want)
		}
		if utf8.ValidString(tc.in) && got != tc.in {
			t.Errorf("appendJSONString(%q) decodes to %q, want the input", tc.in, got)
		}
	}
}

// A client's non-ASCII value reaches the problem body's detail intact.
func TestProblemDetailKeepsNonASCII(t *testing.T) {
	t.Parallel()
	p := newProxy(t, "http://127.0.0.1:1")
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/cost", nil)
	req.Header.Set("X-Cost", "zwölf")
	p.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", rec.Code)
	}
	var body struct{ Detail string }
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if !strings.Contains(body.Detail, `"zwölf"`) {
		t.Errorf("detail %q does not quote the cost as sent", body.Detail)
	}
}

// BenchmarkServeHTTPDenied is the sidecar's request path for a hot denied
// key, without the network: match, key, decide (local deny) and the 429.
func BenchmarkServeHTTPDenied(b *testing.B) {
	p := newProxy(b, "http://127.0.0.1:1")
	req := httptest.NewRequest("GET", "/deny/x", nil).WithContext(context.Background())
	req.Header.Set("X-Key", "abuser")
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
	}
}

// Conditions, hosts, key expressions and exemptions over real sockets: the
// app sees every request the rule leaves alone, and the rule limits only
// the POSTs to api.example.com, per organisation.
func TestConditionsOverSockets(t *testing.T) {
	t.Parallel()
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(backend.Close)
	c, err := config.Load([]byte(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  exempt: {sourceCIDRs: ["203.0.113.0/24"]}
  trustedProxies: {cidrs: [127.0.0.0/8]}
  rules:
  - name: orders
    match: {hosts: [api.example.com], when: ["request.method == 'POST'"]}
    key: [{expression: "request.headers['x-org']"}]
    limit: {requests: 2, per: 1h}
    exempt: {when: ["request.headers['x-probe'] == 'health'"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	set, err := ruleset.Compile(c, labels.Set{}, m)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := memstore.New()
	e, _ := engine.New(engine.Options{Store: st, Fallback: st, Metrics: m})
	u, _ := url.Parse(backend.URL)
	p, err := New(Options{Upstream: u, Engine: e, Metrics: m, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p.SetRules(set)
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)

	send := func(method, host string, h map[string]string) int {
		t.Helper()
		req, err := http.NewRequest(method, front.URL+"/orders", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := front.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	acme := map[string]string{"X-Org": "acme"}
	for i, want := range []int{200, 200, 429, 429} {
		if got := send("POST", "API.example.com:443", acme); got != want {
			t.Errorf("POST %d of acme: %d, want %d", i, got, want)
		}
	}
	for _, tc := range []struct {
		what, method, host string
		h                  map[string]string
	}{
		{"another organisation", "POST", "api.example.com", map[string]string{"X-Org": "globex"}},
		{"a GET", "GET", "api.example.com", acme},
		{"another host", "POST", "www.example.com", acme},
		{"a health probe", "POST", "api.example.com", map[string]string{"X-Org": "acme", "X-Probe": "health"}},
		{"an exempt network", "POST", "api.example.com", map[string]string{"X-Org": "acme", "X-Forwarded-For": "203.0.113.9"}},
		{"no organisation: the key part is missing", "POST", "api.example.com", nil},
	} {
		if got := send(tc.method, tc.host, tc.h); got != http.StatusOK {
			t.Errorf("%s: %d, want 200", tc.what, got)
		}
	}
}
