package proxy

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// fuzzSecret signs the one token the fuzz target treats as genuine.
var fuzzSecret = []byte("fuzz-secret-fuzz-secret-fuzz-secret")

const fuzzDoc = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  trustedProxies: {cidrs: [10.0.0.0/8], hops: 1}
  jwt: {hmacSecretFile: %s}
  rules:
  - name: login
    match: {path: {type: Exact, value: /login}}
    keys: [[{jwtClaim: sub}], [{header: X-API-Key}], [{clientIP: {}}]]
    limit: {requests: 1000000, per: 1h}
  - name: api
    match: {path: {type: Prefix, value: /api/v1}}
    key: [{header: X-API-Key}, {path: {}}]
    limit: {requests: 1000000, per: 1h}
  - name: reset
    match: {path: {type: RegularExpression, value: '/reset/[a-z0-9]+'}}
    key: [{clientIP: {ipv6PrefixLength: 56}}]
    limit: {requests: 1000000, per: 1h}
- name: q
  uid: uid-q
  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 1000000, per: 1h}
`

// okTransport answers every proxied request 200 without a network.
type okTransport struct{}

func (okTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
}

// swapCase changes the case of every ASCII letter.
func swapCase(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		case 'A' <= c && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
	}
	return string(b)
}

// FuzzRequestHeaders sends requests whose path, X-Forwarded-For,
// Authorization, X-API-Key and peer address come from the fuzzer through
// the proxy, and holds it to what no input may break:
//   - it never panics, and answers 200, 400 or 401 (the limits are never
//     reached);
//   - the rules a path matches do not change with ASCII case or a
//     trailing slash;
//   - a request reaches the genuine token's counter only with that token;
//   - X-Forwarded-For is believed only from a trusted peer;
//   - a counter key never embeds a client string.
func FuzzRequestHeaders(f *testing.F) {
	dir := f.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, fuzzSecret, 0o600); err != nil {
		f.Fatal(err)
	}
	c, err := config.Load([]byte(strings.Replace(fuzzDoc, "%s", secret, 1)))
	if err != nil {
		f.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	set, err := ruleset.Compile(c, labels.Set{}, m)
	if err != nil || len(set.Failed) > 0 {
		f.Fatalf("compile: %v %v", err, set.Failed)
	}
	st, err := memstore.New(memstore.WithMaxKeys(1 << 16))
	if err != nil {
		f.Fatal(err)
	}
	e, err := engine.New(engine.Options{Store: st, Fallback: st, Metrics: m})
	if err != nil {
		f.Fatal(err)
	}
	p, err := New(Options{Upstream: &url.URL{Scheme: "http", Host: "app.invalid"}, Transport: okTransport{}, Engine: e,
		Metrics: m, Log: slog.New(slog.DiscardHandler), MaxHeaderBytes: 1 << 20})
	if err != nil {
		f.Fatal(err)
	}
	p.SetRules(set)
	genuine, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "victim"}).SignedString(fuzzSecret)
	if err != nil {
		f.Fatal(err)
	}
	victimKey := func() string {
		r := httptest.NewRequest("GET", "/login", nil)
		r.Header.Set("Authorization", "Bearer "+genuine)
		var dr descriptor.Request
		dr.Reset(r, "/login", set.Policies)
		k, ok, err := set.Rules[0].Extract.Key(&dr)
		if !ok || err != nil {
			f.Fatalf("the genuine token: %v %v", ok, err)
		}
		return k
	}()
	forged, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "victim"}).SignedString(jwt.UnsafeAllowNoneSignatureType)

	f.Add("/login", "203.0.113.9", "Bearer "+genuine, "", "10.0.0.1:1234")
	f.Add("/LOGIN/", "1.2.3.4, 10.0.0.2", "Bearer "+forged, "k", "10.1.2.3:80")
	f.Add("/a/../login", "", "bearer  "+genuine+" ", "", "[2001:db8::1]:443")
	f.Add("/api/v1/../v1/x", "2001:db8::1", "Basic dXNlcjpwYXNz", "key-1", "203.0.113.7:5")
	f.Add("/reset/ABC/", "garbage, ,", "Bearer a.b.c", "", "@")
	f.Add("//api//V1/", "[::ffff:10.0.0.1]:1", "", "\x00\xff", "10.0.0.1:1")
	f.Fuzz(func(t *testing.T, path, xff, authz, apiKey, peer string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.URL = &url.URL{Path: path}
		r.RequestURI = ""
		r.RemoteAddr = peer
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		if authz != "" {
			r.Header.Set("Authorization", authz)
		}
		if apiKey != "" {
			r.Header.Set("X-API-Key", apiKey)
		}
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		switch w.Code {
		case 200, 400, 401:
		default:
			t.Fatalf("status %d for path %q: %s", w.Code, path, w.Body)
		}

		clean := match.CleanPath(path)
		matchPath := func(p string) []int {
			var dr descriptor.Request
			dr.Reset(r, match.CleanPath(p), set.Policies)
			return set.Matcher.Match(&dr, nil)
		}
		base := matchPath(path)
		if got := matchPath(swapCase(path)); !slices.Equal(got, base) {
			t.Fatalf("path %q matches %v, its case swapped %v", path, base, got)
		}
		if !strings.HasSuffix(clean, "/") {
			if got := matchPath(path + "/"); !slices.Equal(got, base) {
				t.Fatalf("path %q matches %v, with a trailing slash %v", path, base, got)
			}
		}

		var dr descriptor.Request
		dr.Reset(r, clean, set.Policies)
		key, ok, err := set.Rules[0].Extract.Key(&dr)
		if ok && key == victimKey && !strings.Contains(authz, genuine) {
			t.Fatalf("Authorization %q reached the genuine token's counter", authz)
		}
		if err == nil && !ok {
			t.Fatalf("the login rule skipped a request (Authorization %q)", authz)
		}
		if ok && (len(key) != len("uid-p:login:")+descriptor.HashLen || (apiKey != "" && len(apiKey) > 3 && strings.Contains(key, apiKey))) {
			t.Fatalf("key %q embeds a client string or has the wrong shape", key)
		}

		peerAddr, perr := netip.ParseAddrPort(peer)
		trusted := perr == nil && netip.MustParsePrefix("10.0.0.0/8").Contains(peerAddr.Addr().Unmap())
		res, _ := descriptor.NewIPResolver(c.Policies[0].TrustedProxies)
		got := res.ClientIP(peer, r.Header)
		if !trusted && perr == nil && got != peerAddr.Addr().Unmap() {
			t.Fatalf("peer %q is not trusted, yet the client is %v (X-Forwarded-For %q)", peer, got, xff)
		}
		if bytes.Contains(w.Body.Bytes(), []byte(genuine)) {
			t.Fatalf("an answer echoes the token")
		}
	})
}
