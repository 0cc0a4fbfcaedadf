package runner

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// uncheckedPolicy spends each of its rules with one request: what comes
// after must be refused, or reach the application as a request the rules
// decided.
const uncheckedPolicy = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  rules:
  - {name: once, match: {path: {type: Exact, value: /once}, methods: [GET]}, limit: {requests: 1, per: 1h}}
  - {name: login, match: {path: {type: Exact, value: /login}, methods: [POST]}, limit: {requests: 1, per: 1h}}
  - {name: admin, match: {path: {type: Exact, value: /admin}}, limit: {requests: 1, per: 1h}}
  - {name: keyed, match: {path: {type: Exact, value: /keyed}}, key: [{header: X-Api-Key}], limit: {requests: 1, per: 1h}}
  - {name: deep, match: {path: {type: Prefix, value: /deep/}}, limit: {requests: 1, per: 1h}}
`

// TestNothingReachesTheAppUnchecked sends, over real sockets to both of
// the sidecar's fronts in front of real application servers (Go's
// net/http with the 1.22 mux, Node's http), requests that the
// application would read otherwise than the rules that decided them,
// once each rule is spent: every one is refused, and the application
// never sees a request of a spent rule again.
func TestNothingReachesTheAppUnchecked(t *testing.T) {
	t.Parallel()
	smuggled := "GET /once HTTP/1.1\r\nHost: x\r\nX-Smuggled: 1\r\n\r\n"
	cases := []struct {
		name string
		raw  string
		want int
	}{
		// The body is a request of its own: an application that is not
		// told its length reads it as one.
		{"Connection names Content-Length", "POST /x HTTP/1.1\r\nHost: x\r\nConnection: Content-Length\r\nContent-Length: " +
			strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled, http.StatusBadRequest},
		{"Connection names Host", "GET /x HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Host\r\n\r\n", http.StatusBadRequest},
		// Servers that upper-case the method serve it as POST.
		{"lower-case method", "post /login HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", http.StatusBadRequest},
		{"mixed-case method", "Post /login HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", http.StatusBadRequest},
		// Go's mux and Node serve HEAD from the GET route.
		{"HEAD on a rule for GET", "HEAD /once HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusTooManyRequests},
		// Servers that cut the fragment off route /admin.
		{"fragment in the target", "GET /admin#x HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest},
		// Java servers drop a segment's parameters, some servers read a
		// backslash as a separator or drop trailing whitespace: the rule
		// on /admin holds them all. A control character is refused.
		{"segment parameters", "GET /admin;x=1 HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusTooManyRequests},
		{"trailing space", "GET /admin%20 HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusTooManyRequests},
		{"trailing tab", "GET /admin%09 HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest},
		{"encoded NUL", "GET /admin%00 HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest},
		{"encoded backslash", "GET /admin%5C HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusTooManyRequests},
		{"backslash", "GET /admin\\ HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusTooManyRequests},
		// Go's Header.Get reads the first, a fresh counter would take
		// the pair.
		{"repeated key header", "GET /keyed HTTP/1.1\r\nHost: x\r\nX-Api-Key: alice\r\nX-Api-Key: junk1\r\n\r\n", http.StatusBadRequest},
		{"repeated key header in another case", "GET /keyed HTTP/1.1\r\nHost: x\r\nX-Api-Key: alice\r\nx-api-key: junk2\r\n\r\n", http.StatusBadRequest},
	}
	behindEachApp(t, func(t *testing.T, app appServer, sc *sidecar, addr string) {
		// Spend every rule.
		for _, spend := range []string{
			"GET /once HTTP/1.1\r\nHost: x\r\n\r\n",
			"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
			"GET /admin HTTP/1.1\r\nHost: x\r\n\r\n",
			"GET /keyed HTTP/1.1\r\nHost: x\r\nX-Api-Key: alice\r\n\r\n",
			"GET /deep/x HTTP/1.1\r\nHost: x\r\n\r\n",
		} {
			if got := exchange(t, addr, spend); len(got) != 1 || got[0] != http.StatusOK {
				t.Fatalf("spending %q: answers %v, want one 200", firstLine(spend), got)
			}
		}
		before := len(app.seen(t))
		for _, tc := range cases {
			got := exchange(t, addr, tc.raw)
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("%s: answers %v, want one %d", tc.name, got, tc.want)
			}
		}
		// A denied request's path is logged clipped: a client
		// cannot write its 32 KB path to the log per request.
		logged := len(sc.logs.String())
		long := "GET /deep/" + strings.Repeat("a", 32<<10) + " HTTP/1.1\r\nHost: x\r\n\r\n"
		if got := exchange(t, addr, long); len(got) != 1 || got[0] != http.StatusTooManyRequests {
			t.Errorf("a long path under a spent rule: answers %v, want one 429", got)
		}
		waitFor(t, 10*time.Second, "the deny event of the long path to be logged", func() bool {
			return strings.Contains(sc.logs.String()[logged:], `"/deep/aaa`)
		})
		if grew := len(sc.logs.String()) - logged; grew > 2<<10 {
			t.Errorf("the log grew by %d bytes for one denied request with a 32 KB path, want at most 2 KB", grew)
		}
		for _, p := range app.seen(t)[before:] {
			t.Errorf("the application parsed %s %s (headers %v, %d body bytes) after every rule was spent", p.Method, p.Target, p.Headers, p.Body)
		}
	})
}

// exchange sends raw on a connection of its own and returns the statuses
// of the answers that come back: it reads until the connection closes,
// or no further answer starts within a moment of the last one (a
// smuggled request's answer follows its carrier's at once).
func exchange(t *testing.T, addr, raw string) []int {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = nc.Close() }()
	if _, err := io.WriteString(nc, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	var got []int
	for {
		wait := 30 * time.Second // the first answer: a hang bound
		if len(got) > 0 {
			wait = 300 * time.Millisecond
		}
		_ = nc.SetReadDeadline(time.Now().Add(wait))
		res, err := http.ReadResponse(br, &http.Request{Method: strings.SplitN(raw, " ", 2)[0]})
		if err != nil {
			if len(got) == 0 {
				t.Logf("no answer to %q: %v", firstLine(raw), err)
			}
			return got
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		got = append(got, res.StatusCode)
		if res.Close {
			return got
		}
	}
}

func firstLine(raw string) string {
	line, _, _ := strings.Cut(raw, "\r\n")
	if len(line) > 80 {
		line = line[:80] + "..."
	}
	return line
}

// waitFor polls cond until it holds, failing the test after bound.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(bound); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", bound, what)
		}
	}
}

// TestOnlyWebSocketUpgradesReachTheApp: after a 101 the connection is a
// tunnel the sidecar no longer reads, so only an upgrade to WebSocket,
// whose messages belong to the request that opened it, reaches the
// application; an upgrade to h2c or anything else goes on as a plain
// request, one the rules decided.
func TestOnlyWebSocketUpgradesReachTheApp(t *testing.T) {
	t.Parallel()
	behindEachApp(t, func(t *testing.T, app appServer, sc *sidecar, addr string) {
		for _, up := range []string{"h2c", "foo", "websocket, h2c", "TLS/1.2"} {
			raw := "GET /plain HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: " + up +
				"\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nX-Asked: " + up + "\r\n\r\n"
			if got := exchange(t, addr, raw); len(got) != 1 || got[0] != http.StatusOK {
				t.Errorf("Upgrade: %s: answers %v, want one 200 (served as a plain request)", up, got)
			}
		}
		if got := exchange(t, addr, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Asked: websocket\r\n\r\n"); len(got) != 1 {
			t.Errorf("Upgrade: websocket: answers %v, want one", got)
		}
		asked := 0
		for _, p := range app.seen(t) {
			want := ""
			if a := p.Headers["x-asked"]; len(a) == 1 && a[0] == "websocket" {
				want = "websocket"
			}
			if got := strings.Join(p.Headers["upgrade"], ","); got != want {
				t.Errorf("the application got %s %s with Upgrade %q (asked %v), want %q", p.Method, p.Target, got, p.Headers["x-asked"], want)
			}
			asked++
		}
		if asked != 5 {
			t.Errorf("the application saw %d requests, want the 5 sent", asked)
		}
	})
}

// behindEachApp runs check, in parallel, for each real application server
// behind a sidecar of its own on each front, on uncheckedPolicy and a
// clock that stands still (an hour's window never ends under the test):
// what the application parsed is that sidecar's doing.
func behindEachApp(t *testing.T, check func(t *testing.T, app appServer, sc *sidecar, addr string)) {
	for _, server := range []struct {
		name  string
		start func(*testing.T) appServer
	}{{"go-net-http", goApp}, {"node-http", nodeApp}} {
		for _, front := range []struct {
			name string
			args []string
		}{{"lean", nil}, {"net-http", []string{"--lean-http1=false"}}} {
			t.Run(server.name+"/"+front.name, func(t *testing.T) {
				t.Parallel()
				app := server.start(t)
				sc := startSidecarOn(t, frozen, app.url, uncheckedPolicy, true, front.args...)
				check(t, app, sc, strings.TrimPrefix(sc.url, "http://"))
			})
		}
	}
}
