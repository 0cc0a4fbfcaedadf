package runner

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

var algorithms = []string{"TokenBucket", "GCRA", "SlidingWindow", "FixedWindow", "SlidingLog"}

func TestExactAllowedCountsMemory(t *testing.T) {
	t.Parallel()
	for _, alg := range algorithms {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			be := newBackend(t, nil)
			// On a clock that stands still: no window ends and no bucket
			// refills between the requests.
			sc := startSidecarOn(t, frozen, be.URL, policyDoc("r1", fmt.Sprintf(`key: [{header: X-User}]
limit: {requests: 7, per: 1h, algorithm: %s}`, alg)), true)
			c := &http.Client{}
			counts := map[int]int{}
			for range 20 {
				res, _ := get(t, c, sc.url+"/x", "X-User", "alice")
				counts[res.StatusCode]++
			}
			if counts[200] != 7 || counts[429] != 13 {
				t.Errorf("statuses %v, want 7x200 and 13x429", counts)
			}
			if got := be.hits.Load(); got != 7 {
				t.Errorf("backend saw %d requests, want 7: a denied request must never reach it", got)
			}
			// Another key has its own counter.
			if res, _ := get(t, c, sc.url+"/x", "X-User", "bob"); res.StatusCode != 200 {
				t.Errorf("bob: %d, want 200", res.StatusCode)
			}
		})
	}
}

var problemFields = []string{"type", "title", "status", "detail", "retryAfter"}

func TestResponseFields(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	// On a clock that stands still 30s into a minute: the window does not
	// end between the requests.
	sc := startSidecarOn(t, frozen, be.URL, policyDoc("r1", `key: [{header: X-User}]
limit: {requests: 2, per: 1m, algorithm: FixedWindow}`), true)
	c := &http.Client{}
	res, body := get(t, c, sc.url+"/a", "X-User", "u")
	if res.StatusCode != 200 || body != "hello" {
		t.Fatalf("first request: %d %q", res.StatusCode, body)
	}
	h := res.Header
	for name, want := range map[string]string{
		"X-RateLimit-Limit":     "2",
		"X-RateLimit-Remaining": "1",
		"RateLimit-Policy":      `"p.r";q=2;w=60`,
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if got := h.Get("X-RateLimit-Reset"); got != "30" {
		t.Errorf("X-RateLimit-Reset = %q, want 30 seconds: the window's end", got)
	}
	if !regexp.MustCompile(`^"p\.r";r=1;t=\d+$`).MatchString(h.Get("RateLimit")) {
		t.Errorf("RateLimit = %q", h.Get("RateLimit"))
	}
	get(t, c, sc.url+"/a", "X-User", "u")
	res, body = get(t, c, sc.url+"/a", "X-User", "u")
	if res.StatusCode != 429 {
		t.Fatalf("third request: %d, want 429", res.StatusCode)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q", ct)
	}
	ra, err := strconv.Atoi(res.Header.Get("Retry-After"))
	if err != nil || ra != 30 {
		t.Errorf("Retry-After = %q, want 30: the window's end", res.Header.Get("Retry-After"))
	}
	if got := res.Header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Errorf("deny: X-RateLimit-Remaining = %q, want 0", got)
	}
	if !regexp.MustCompile(`^"p\.r";r=0;t=\d+$`).MatchString(res.Header.Get("RateLimit")) {
		t.Errorf("deny: RateLimit = %q", res.Header.Get("RateLimit"))
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("429 body is not JSON: %v: %q", err, body)
	}
	for _, f := range problemFields {
		if _, ok := p[f]; !ok {
			t.Errorf("problem body lacks %q: %s", f, body)
		}
	}
	if p["status"] != 429.0 || p["retryAfter"] != float64(ra) {
		t.Errorf("problem body %s disagrees with the response", body)
	}
	// A request without the key is counted, in the one counter that all
	// such requests share (onMissingKey's default, Shared).
	res, _ = get(t, c, sc.url+"/a")
	if res.StatusCode != 200 || !regexp.MustCompile(`^"p\.r";r=1;t=\d+$`).MatchString(res.Header.Get("RateLimit")) {
		t.Errorf("unkeyed request: %d, RateLimit %q, want the shared counter's first request", res.StatusCode, res.Header.Get("RateLimit"))
	}
}

func TestClientIPFromUntrustedPeer(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	doc := func(cidr string) string {
		return fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  trustedProxies: {cidrs: [%s]}
  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 3, per: 1h}
`, cidr)
	}
	untrusted := startSidecar(t, be.URL, doc("10.0.0.0/8"), true)
	trusted := startSidecar(t, be.URL, doc("127.0.0.0/8"), true)
	c := &http.Client{}
	ok := 0
	for i := range 10 {
		res, _ := get(t, c, untrusted.url+"/", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
		if res.StatusCode == 200 {
			ok++
		}
	}
	if ok != 3 {
		t.Errorf("rotating X-Forwarded-For from an untrusted peer: %d allowed, want 3 (the peer's bucket)", ok)
	}
	ok = 0
	for i := range 10 {
		res, _ := get(t, c, trusted.url+"/", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
		if res.StatusCode == 200 {
			ok++
		}
	}
	if ok != 10 {
		t.Errorf("distinct clients behind a trusted proxy: %d allowed, want 10", ok)
	}
	// The application sees the chain with the peer appended, and the Host
	// the client asked for.
	res, _ := get(t, c, trusted.url+"/", "X-Forwarded-For", "198.51.100.200")
	if got := res.Header.Get("X-Seen-XFF"); got != "198.51.100.200, 127.0.0.1" {
		t.Errorf("upstream X-Forwarded-For = %q", got)
	}
	if got, want := res.Header.Get("X-Seen-Host"), strings.TrimPrefix(trusted.url, "http://"); got != want {
		t.Errorf("upstream Host = %q, want %q", got, want)
	}
}

func TestForgedJWTsAreNotTrusted(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	dir := t.TempDir()
	secret := []byte("an-hmac-secret-of-at-least-32-bytes!!")
	sf := filepath.Join(dir, "secret")
	if err := os.WriteFile(sf, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	sc := startSidecar(t, be.URL, fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  jwt: {hmacSecretFile: %s}
  rules:
  - name: per-user
    key: [{jwtClaim: sub}]
    onMissingKey: Shared
    limit: {requests: 2, per: 1h}
`, sf), true)
	tok := func(m jwt.SigningMethod, key any, sub string) string {
		s, err := jwt.NewWithClaims(m, jwt.MapClaims{"sub": sub}).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	c := &http.Client{}
	status := func(token string) int {
		res, _ := get(t, c, sc.url+"/", "Authorization", "Bearer "+token)
		return res.StatusCode
	}
	// Forged tokens naming alice, each with a different sub or signature,
	// are answered 401 and counted nowhere: never in alice's counter.
	forged := []string{
		tok(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "alice"),
		tok(jwt.SigningMethodHS256, []byte("not-the-secret-not-the-secret-xx"), "alice"),
		tok(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "mallory-1"),
		tok(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "mallory-2"),
	}
	var got []int
	for _, f := range forged {
		got = append(got, status(f))
	}
	if fmt.Sprint(got) != "[401 401 401 401]" {
		t.Errorf("forged tokens: %v, want [401 401 401 401]", got)
	}
	// alice's real counter was not touched by the forgeries.
	real := tok(jwt.SigningMethodHS256, secret, "alice")
	got = []int{status(real), status(real), status(real)}
	if fmt.Sprint(got) != "[200 200 429]" {
		t.Errorf("alice's verified token: %v, want [200 200 429]", got)
	}
}

func TestShadowModeNeverBlocks(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	sc := startSidecar(t, be.URL, policyDoc("r1", `key: [{header: X-User}]
mode: Shadow
limit: {requests: 1, per: 1h}`), true)
	c := &http.Client{}
	for i := range 5 {
		res, _ := get(t, c, sc.url+"/", "X-User", "u")
		if res.StatusCode != 200 {
			t.Fatalf("request %d: %d, want 200 in shadow mode", i, res.StatusCode)
		}
		if res.Header.Get("RateLimit") != "" {
			t.Errorf("shadow rule exposed headers")
		}
	}
	if got := be.hits.Load(); got != 5 {
		t.Errorf("backend saw %d, want 5", got)
	}
	if got := sc.metric(t, `floodgate_sidecar_decisions_total{policy="p",result="shadow_denied",rule="r"}`); got != 4 {
		t.Errorf("shadow_denied = %v, want 4", got)
	}
	// The usage report says the same, for floodgate-manager.
	res, err := http.Get(sc.admin + config.UsagePath)
	if err != nil {
		t.Fatal(err)
	}
	var usage config.Usage
	err = json.NewDecoder(res.Body).Decode(&usage)
	_ = res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := []config.RuleUsage{{Policy: "p", Rule: "r", Allowed: 1, ShadowDenied: 4}}
	if !reflect.DeepEqual(usage.Rules, want) || usage.Started.IsZero() || usage.Started.After(time.Now()) {
		t.Errorf("usage report = %+v, want rules %+v and the start time", usage, want)
	}
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(sc.logs.String(), `"rate limit shadow deny"`) < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	logs := sc.logs.String()
	if n := strings.Count(logs, `"rate limit shadow deny"`); n != 4 {
		t.Errorf("%d shadow deny events logged, want 4", n)
	}
	if strings.Contains(logs, `"u"`) {
		t.Errorf("a raw descriptor value reached the event log")
	}
}

func TestHotReload(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	sc := startSidecar(t, be.URL, policyDoc("v1", `key: [{header: X-User}]
limit: {requests: 1, per: 1h}`), true)
	c := &http.Client{}
	codes := func(n int) string {
		var out []string
		for range n {
			res, _ := get(t, c, sc.url+"/", "X-User", "u")
			out = append(out, strconv.Itoa(res.StatusCode))
		}
		return strings.Join(out, ",")
	}
	if got := codes(2); got != "200,429" {
		t.Fatalf("v1: %s", got)
	}
	if got := sc.metric(t, `floodgate_sidecar_config_info{revision="v1"}`); got != 1 {
		t.Errorf("config_info v1 = %v", got)
	}
	// Raise the limit: the counter survives (one token already spent).
	writeAtomic(t, sc.policy, policyDoc("v2", `key: [{header: X-User}]
limit: {requests: 3, per: 1h}`))
	sc.waitRevision(t, "v2")
	if got := codes(3); got != "200,200,429" {
		t.Errorf("v2: %s, want 200,200,429 (3 per hour, 1 already spent)", got)
	}
	// An invalid file keeps v2 and is reported.
	writeAtomic(t, sc.policy, policyDoc("v3", `key: [{header: X-User}]
limit: {requests: 0, per: 1h}`))
	sc.waitError(t, "policies[0].rules[0].limit.requests")
	if got := sc.Status().Revision; got != "v2" {
		t.Errorf("revision after an invalid file = %q, want v2", got)
	}
	res, err := http.Get(sc.admin + "/debug/config")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if !strings.Contains(string(body), "limit.requests") || !strings.Contains(string(body), `"revision": "v2"`) {
		t.Errorf("/debug/config does not show the error and the config in force:\n%s", body)
	}
	if got := sc.metric(t, "floodgate_sidecar_config_errors_total"); got != 1 {
		t.Errorf("config_errors_total = %v, want 1", got)
	}
	if got := sc.metric(t, "floodgate_sidecar_config_valid"); got != 0 {
		t.Errorf("config_valid = %v, want 0", got)
	}
	if got := codes(1); got != "429" {
		t.Errorf("limits after an invalid file: %s, want the v2 limit still in force", got)
	}
	// A file that does not parse at all is rejected the same way.
	writeAtomic(t, sc.policy, "apiVersion: [")
	sc.waitError(t, "yaml")
	// Fixing it applies.
	writeAtomic(t, sc.policy, policyDoc("v4", `key: [{header: X-User}]
limit: {requests: 10, per: 1h}`))
	sc.waitRevision(t, "v4")
	if got := sc.metric(t, "floodgate_sidecar_config_valid"); got != 1 {
		t.Errorf("config_valid = %v, want 1", got)
	}
	if sc.Status().LastError != "" {
		t.Errorf("error still reported after a good file: %q", sc.Status().LastError)
	}
}

func TestNotReadyUntilConfigLoaded(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	sc := startSidecar(t, be.URL, "apiVersion: nope\n", false)
	sc.waitError(t, "apiVersion")
	res, err := http.Get(sc.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != 503 {
		t.Errorf("/readyz without a config: %d, want 503", res.StatusCode)
	}
	if res, err := http.Get(sc.admin + "/healthz"); err != nil || res.StatusCode != 200 {
		t.Errorf("/healthz: %v %v", res, err)
	}
	if res, body := get(t, &http.Client{}, sc.url+"/"); res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" || !strings.Contains(body, "no configuration") {
		t.Errorf("proxy without a config: %d %q, want 503 with Retry-After", res.StatusCode, body)
	}
	if be.hits.Load() != 0 {
		t.Errorf("a request reached the application without a config")
	}
	writeAtomic(t, sc.policy, policyDoc("ok", `limit: {requests: 5, per: 1s}`))
	sc.waitReady(t)
	if res, _ := get(t, &http.Client{}, sc.url+"/"); res.StatusCode != 200 {
		t.Errorf("after the first good config: %d", res.StatusCode)
	}
}

func TestBadRequestsGet4xxNeverPanic(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	sc := startSidecar(t, be.URL, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  rules:
  - name: costly
    match: {path: {type: Prefix, value: /cost}}
    key: [{header: X-User}]
    limit: {requests: 10, per: 1h}
    cost: {fromHeader: X-Cost, max: 5}
  - name: needs-key
    match: {path: {type: Prefix, value: /strict}}
    key: [{header: X-Api-Key}]
    onMissingKey: Reject
    limit: {requests: 10, per: 1h}
`, true, "--max-header-bytes", "65536")
	addr := strings.TrimPrefix(sc.url, "http://")
	raw := func(req string) string {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		go func() { _, _ = io.WriteString(conn, req) }()
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return "error: " + err.Error()
		}
		return strings.TrimSpace(line)
	}
	for name, req := range map[string]string{
		"garbage":          "GARBAGE GARBAGE GARBAGE GARBAGE\r\n\r\n",
		"bad request line": "GET /\r\nHost: x\r\nX-Pad: padding-padding\r\n\r\n",
		"no host":          "GET / HTTP/1.1\r\n\r\n",
		"bad header":       "GET / HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",
		"bad content len":  "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n",
		"1 MiB header":     "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 1<<20) + "\r\n\r\n",
		"bad cost":         "GET /cost HTTP/1.1\r\nHost: x\r\nX-User: u\r\nX-Cost: lots\r\n\r\n",
		"cost above max":   "GET /cost HTTP/1.1\r\nHost: x\r\nX-User: u\r\nX-Cost: 6\r\n\r\n",
		"negative cost":    "GET /cost HTTP/1.1\r\nHost: x\r\nX-User: u\r\nX-Cost: -1\r\n\r\n",
		"zero cost":        "GET /cost HTTP/1.1\r\nHost: x\r\nX-User: u\r\nX-Cost: 0\r\n\r\n",
		"missing key part": "GET /strict HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		line := raw(req)
		m := regexp.MustCompile(`^HTTP/1\.1 (4\d\d) `).FindStringSubmatch(line)
		if m == nil {
			t.Errorf("%s: got %q, want a 4xx", name, line)
		}
		if name == "1 MiB header" && m != nil && m[1] != "431" {
			t.Errorf("1 MiB header: %s, want 431", m[1])
		}
	}
	if be.hits.Load() != 0 {
		t.Errorf("a bad request reached the backend")
	}
	// Still serving.
	if res, _ := get(t, &http.Client{}, sc.url+"/cost", "X-User", "u", "X-Cost", "5"); res.StatusCode != 200 {
		t.Errorf("valid request after bad ones: %d", res.StatusCode)
	}
}

func TestWebSocketUpgradePassesThrough(t *testing.T) {
	t.Parallel()
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want upgrade", 400)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = rw.Flush()
		// Echo one line.
		line, err := rw.ReadString('\n')
		if err != nil {
			return
		}
		_, _ = rw.WriteString("echo:" + line)
		_ = rw.Flush()
	})
	sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 1, per: 1h}`), true)
	dial := func() (string, string) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(sc.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 101 {
			return strconv.Itoa(res.StatusCode), ""
		}
		_, _ = io.WriteString(conn, "ping\n")
		line, _ := br.ReadString('\n')
		return "101", line
	}
	if code, line := dial(); code != "101" || line != "echo:ping\n" {
		t.Errorf("upgrade: %s %q", code, line)
	}
	if code, _ := dial(); code != "429" {
		t.Errorf("second upgrade: %s, want 429 (the upgrade request is rate limited)", code)
	}
}

func TestH2CAndStreaming(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		_ = http.NewResponseController(w).Flush()
		<-release
		_, _ = io.WriteString(w, "second\n")
	})
	sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 100, per: 1h}`), true)
	var ps http.Protocols
	ps.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: &http.Transport{Protocols: &ps, TLSClientConfig: &tls.Config{}}}
	res, err := c.Get(sc.url + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	if res.ProtoMajor != 2 {
		t.Errorf("proto %s, want HTTP/2 (h2c)", res.Proto)
	}
	br := bufio.NewReader(res.Body)
	// The first chunk arrives while the backend still holds the response.
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk: %q %v", line, err)
	}
	close(release)
	if rest, _ := io.ReadAll(br); string(rest) != "second\n" {
		t.Errorf("rest = %q", rest)
	}
	if res.Header.Get("X-RateLimit-Remaining") != "99" {
		t.Errorf("h2c response fields: %v", res.Header)
	}
}

func TestGracefulShutdownDrainsInFlight(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "done")
	})
	// A drain timeout no busy machine reaches before the request is let
	// go: what ends the drain here is the request, never the timeout.
	sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 100, per: 1h}`), true, "--drain-timeout", "1m")
	type result struct {
		code int
		body string
		err  error
	}
	out := make(chan result, 1)
	go func() {
		res, err := http.Get(sc.url + "/slow")
		if err != nil {
			out <- result{err: err}
			return
		}
		b, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		out <- result{res.StatusCode, string(b), err}
	}()
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- sc.stop(t) }()
	// Shutdown waits for the in-flight request.
	deadline := time.Now().Add(time.Minute)
	for sc.Ready() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if sc.Ready() {
		t.Error("still ready while shutting down")
	}
	// A shutdown that did not wait would be done by now, or soon: give it
	// a moment to show it.
	select {
	case err := <-stopped:
		t.Fatalf("shutdown finished before the in-flight request (stop returned %v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	r := <-out
	if r.err != nil || r.code != 200 || r.body != "done" {
		t.Errorf("in-flight request: %d %q %v, want 200 done", r.code, r.body, r.err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Run: %v", err)
	}
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(sc.url, "http://"), time.Second); err == nil {
		t.Errorf("proxy still accepts connections after shutdown")
	}
}

func TestTightestRuleWinsOverHTTP(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	// On a clock that stands still: the hour's window does not end
	// between the requests.
	sc := startSidecarOn(t, frozen, be.URL, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  rules:
  - name: wide
    key: [{header: X-User}]
    limit: {requests: 100, per: 1h, algorithm: FixedWindow}
  - name: tight
    match: {path: {type: Exact, value: /login}, methods: [POST]}
    key: [{header: X-User}]
    limit: {requests: 2, per: 1h, algorithm: FixedWindow}
`, true)
	c := &http.Client{}
	post := func() *http.Response {
		req, _ := http.NewRequest("POST", sc.url+"/login", nil)
		req.Header.Set("X-User", "u")
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		return res
	}
	for i := range 2 {
		res := post()
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("RateLimit"), `"p.tight";r=`+strconv.Itoa(1-i)) {
			t.Errorf("POST %d: %d, RateLimit %q; want the tight rule described", i, res.StatusCode, res.Header.Get("RateLimit"))
		}
	}
	if res := post(); res.StatusCode != 429 || res.Header.Get("RateLimit-Policy") != `"p.tight";q=2;w=3600` {
		t.Errorf("third POST: %d, policy %q", res.StatusCode, res.Header.Get("RateLimit-Policy"))
	}
	// The denied POST took nothing from the wide rule: 2 of 100 spent.
	res, _ := get(t, c, sc.url+"/other", "X-User", "u")
	if got := res.Header.Get("RateLimit"); !strings.HasPrefix(got, `"p.wide";r=97;`) {
		t.Errorf("wide rule after a denied request: %q, want r=97 (3 spent by allowed requests only)", got)
	}
}

func TestPodSelector(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	doc := `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: checkout-only
  uid: uid-c
  podSelector: {matchLabels: {app: checkout}}
  rules:
  - name: r
    limit: {requests: 1, per: 1h}
`
	other := startSidecar(t, be.URL, doc, true, "--pod-labels", "app=search")
	mine := startSidecar(t, be.URL, doc, true, "--pod-labels", "app=checkout,tier=web")
	c := &http.Client{}
	for range 3 {
		if res, _ := get(t, c, other.url+"/"); res.StatusCode != 200 {
			t.Errorf("a policy for other pods was enforced")
		}
	}
	if got := other.Status().IgnoredPolicies; fmt.Sprint(got) != "[checkout-only]" {
		t.Errorf("ignored policies %v", got)
	}
	get(t, c, mine.url+"/")
	if res, _ := get(t, c, mine.url+"/"); res.StatusCode != 429 {
		t.Errorf("the selected pod did not enforce its policy: %d", res.StatusCode)
	}
}

func TestAdminPprofOnlyWhenEnabled(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	doc := policyDoc("r1", `key: [{header: X-User}]
limit: {requests: 7, per: 1h}`)
	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, http.StatusNotFound},
		{[]string{"--admin-pprof"}, http.StatusOK},
	} {
		sc := startSidecar(t, be.URL, doc, true, tc.args...)
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1"} {
			res, err := http.Get(sc.admin + path)
			if err != nil {
				t.Fatal(err)
			}
			_ = res.Body.Close()
			if got := res.StatusCode; got != tc.want {
				t.Errorf("args %q: GET %s = %d, want %d", tc.args, path, got, tc.want)
			}
		}
	}
}
