package runner

import (
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/proxy"
)

// fronts are the sidecar's two HTTP fronts, by the flags that choose them.
var fronts = []struct {
	name string
	args []string
}{{"lean", nil}, {"net-http", []string{"--lean-http1=false"}}}

// wantAtCapacity checks a 503 answer at capacity, with the connection
// closed after it.
func wantAtCapacity(t *testing.T, what string, res *http.Response, body string) {
	t.Helper()
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	_ = json.Unmarshal([]byte(body), &p)
	if res.StatusCode != http.StatusServiceUnavailable || p.Type != proxy.ProblemAtCapacity || !res.Close || res.Header.Get("Retry-After") != "1" {
		t.Errorf("%s: %s, Connection close %v, Retry-After %q, body %s; want 503 %s, Retry-After 1, and the connection closed",
			what, res.Status, res.Close, res.Header.Get("Retry-After"), body, proxy.ProblemAtCapacity)
	}
}

// TestMaxConnections: on both fronts, a connection past --max-connections
// is answered 503 and closed, while the connections already open are
// served, the admin port answers, and a connection is taken again once
// one has closed.
func TestMaxConnections(t *testing.T) {
	t.Parallel()
	for _, front := range fronts {
		t.Run(front.name, func(t *testing.T) {
			t.Parallel()
			be := newBackend(t, nil)
			sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 1000, per: 1h}`), true,
				append([]string{"--max-connections", "3", "--read-header-timeout", "1m"}, front.args...)...)
			const get = "GET /x HTTP/1.1\r\nHost: x\r\n\r\n"

			// None of the three waits for a request, so none may make
			// room (TestIdleConnectionMakesRoomAtTheCap): each holds a
			// partial head.
			const head = "GET /x HTTP/1.1\r\nHost: x\r\n"
			kept := dialRaw(t, sc)
			kept.send(get)
			if res, _ := kept.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Fatalf("the first connection: %s, want 200", res.Status)
			}
			kept.send(head)
			partial := dialRaw(t, sc)
			partial.send(head)
			third := dialRaw(t, sc)
			third.send(head)
			waitFor(t, 10*time.Second, "3 connections open", func() bool {
				return sc.metric(t, "floodgate_sidecar_connections_open") == 3
			})

			over := dialRaw(t, sc)
			res, body := over.read(http.MethodGet)
			wantAtCapacity(t, "the connection past the cap", res, body)
			if !over.closed() {
				t.Errorf("the connection past the cap is still open")
			}
			if got := sc.metric(t, `floodgate_sidecar_connections_refused_total{reason="max_connections"}`); got != 1 {
				t.Errorf("connections refused at the cap: %v, want 1", got)
			}
			hits := be.hits.Load()

			// The connections already open are served.
			kept.send("\r\n")
			if res, _ := kept.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Errorf("the kept-alive connection at the cap: %s, want 200", res.Status)
			}
			partial.send("\r\n")
			if res, _ := partial.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Errorf("the connection with a partial head at the cap: %s, want 200", res.Status)
			}
			if got := be.hits.Load() - hits; got != 2 {
				t.Errorf("the application saw %d requests at the cap, want the 2 of the open connections", got)
			}
			if res, err := http.Get(sc.admin + "/healthz"); err != nil || res.StatusCode != http.StatusOK {
				t.Errorf("the admin port at the cap: %v %v, want 200", res, err)
			}

			// A closed connection makes room.
			_ = third.nc.Close()
			waitFor(t, 10*time.Second, "2 connections open", func() bool {
				return sc.metric(t, "floodgate_sidecar_connections_open") == 2
			})
			next := dialRaw(t, sc)
			next.send(get)
			if res, _ := next.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Errorf("a connection after one closed: %s, want 200", res.Status)
			}
		})
	}
}

// TestIdleConnectionMakesRoomAtTheCap fills the cap with a connection
// that waits for its next request and one with a partial head: a new
// connection is refused until the waiting one has waited
// proxy.IdleEvictAfter, then takes its place; the one with a partial head
// is never closed for it.
func TestIdleConnectionMakesRoomAtTheCap(t *testing.T) {
	t.Parallel()
	for _, front := range fronts {
		t.Run(front.name, func(t *testing.T) {
			t.Parallel()
			be := newBackend(t, nil)
			sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 1000, per: 1h}`), true,
				append([]string{"--max-connections", "2", "--read-header-timeout", "1m"}, front.args...)...)
			const get = "GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
			waiting := dialRaw(t, sc)
			waiting.send(get)
			if res, _ := waiting.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Fatalf("the first connection: %s, want 200", res.Status)
			}
			// It waits from before its answer arrived; idle is measured
			// from after, so it is no longer than the server's.
			idle := time.Now()
			partial := dialRaw(t, sc)
			partial.send("GET /x HTTP/1.1\r\nHost: x\r\n")
			waitFor(t, 10*time.Second, "2 connections open", func() bool {
				return sc.metric(t, "floodgate_sidecar_connections_open") == 2
			})

			var next *rawConn
			refused := 0
			for deadline := time.Now().Add(20 * time.Second); next == nil; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no new connection was admitted within 20s of the first one going idle (%d refused)", refused)
				}
				c := dialRaw(t, sc)
				c.send(get)
				res, body := c.read(http.MethodGet)
				if res.StatusCode == http.StatusOK {
					next = c
					break
				}
				wantAtCapacity(t, "a connection past the cap", res, body)
				refused++
			}
			// The server saw the first connection wait at least
			// IdleEvictAfter; the client's clock started later, by at
			// most the answer's delivery.
			if waited := time.Since(idle); waited < proxy.IdleEvictAfter/2 {
				t.Errorf("a new connection took the place of one that had waited %v, want at least %v", waited, proxy.IdleEvictAfter)
			}
			if !waiting.closed() {
				t.Errorf("the waiting connection is still open after a new one took its place")
			}
			if got := sc.metric(t, "floodgate_sidecar_connections_evicted_total"); got != 1 {
				t.Errorf("connections evicted: %v, want 1", got)
			}
			partial.send("\r\n")
			if res, _ := partial.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Errorf("the connection with a partial head: %s, want 200", res.Status)
			}
			next.send(get)
			if res, _ := next.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Errorf("the admitted connection's second request: %s, want 200", res.Status)
			}
			t.Logf("%d connections refused before the waiting one made room", refused)
		})
	}
}

// TestHeadBudget: on both fronts, the connection whose partial head would
// take the heads held past --max-pending-head-bytes is answered 503 and
// closed; a complete request, and the head that holds the budget, are
// served; once that request is answered its charge is given back.
func TestHeadBudget(t *testing.T) {
	t.Parallel()
	for _, front := range fronts {
		t.Run(front.name, func(t *testing.T) {
			t.Parallel()
			be := newBackend(t, nil)
			sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 1000, per: 1h}`), true,
				append([]string{"--max-header-bytes", "16384", "--max-pending-head-bytes", "16384", "--read-header-timeout", "1m"}, front.args...)...)
			const pending = "floodgate_sidecar_pending_head_bytes"
			head := func(path string, pad int) string {
				return "GET " + path + " HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", pad)
			}

			// A holds a 12 KB partial head: each front charges at least
			// what it holds beyond the first 4 KiB.
			a := dialRaw(t, sc)
			first := head("/a", 12000)
			a.send(first)
			waitFor(t, 10*time.Second, "the first head to be charged", func() bool {
				return sc.metric(t, pending) >= float64(len(first)-proxy.HeadAllowance)
			})

			// B's 15 KB head does not fit beside it.
			b := dialRaw(t, sc)
			b.send(head("/b", 15000))
			res, body := b.read(http.MethodGet)
			wantAtCapacity(t, "the head past the budget", res, body)
			if got := sc.metric(t, `floodgate_sidecar_connections_refused_total{reason="head_budget"}`); got != 1 {
				t.Errorf("connections refused for the head budget: %v, want 1", got)
			}

			// Complete requests are served, A's too.
			c := dialRaw(t, sc)
			c.send("GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
			if res, _ := c.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Errorf("a complete request while the budget is spent: %s, want 200", res.Status)
			}
			a.send("\r\n\r\n")
			if res, _ := a.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Errorf("the head that holds the budget, completed: %s, want 200", res.Status)
			}

			// Once A's request is over (and, on the lean core, its
			// connection waits for the next one) the budget is free.
			waitFor(t, 30*time.Second, "the heads' charge to be given back", func() bool {
				return sc.metric(t, pending) == 0
			})
			again := dialRaw(t, sc)
			again.send(head("/b", 15000) + "\r\n\r\n")
			if res, _ := again.read(http.MethodGet); res.StatusCode != http.StatusOK {
				t.Errorf("the 15 KB head once the budget is free: %s, want 200", res.Status)
			}
		})
	}
}

// TestBodyMinRate: on both fronts, with --body-min-rate, a body that
// trickles slower than the rate over a window is cut off with 408 once
// the window's time has passed, long before --body-timeout; a body that
// keeps up is delivered whole.
func TestBodyMinRate(t *testing.T) {
	t.Parallel()
	const rate = 32 << 10 // bytes/s: a window of 64 KiB within 2 s
	pace := proxy.NewBodyPace(30*time.Second, rate)
	for _, front := range fronts {
		t.Run(front.name, func(t *testing.T) {
			t.Parallel()
			var read atomic.Int64
			be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
				n, _ := io.Copy(io.Discard, r.Body)
				read.Store(n)
				_, _ = io.WriteString(w, "done")
			})
			sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 1000, per: 1h}`), true,
				append([]string{"--body-min-rate", "32768"}, front.args...)...)

			// 1 KiB every 100 ms, a tenth of the rate. The sidecar starts
			// the body's first window once it has the head, after sent.
			slow := dialRaw(t, sc)
			sent := time.Now()
			slow.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
			stop := make(chan struct{})
			t.Cleanup(func() { close(stop) })
			go func() {
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				chunk := strings.Repeat("x", 1024)
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := io.WriteString(slow.nc, chunk); err != nil {
							return
						}
					}
				}
			}()
			res, _ := slow.read(http.MethodPost)
			cut := time.Since(sent)
			if res.StatusCode != http.StatusRequestTimeout || !res.Close {
				t.Fatalf("a body at a tenth of the minimum rate: %s, want 408 and the connection closed", res.Status)
			}
			if cut < pace.Time {
				t.Errorf("a slow body was cut off %v after its head was sent, before its window's %v", cut, pace.Time)
			}
			t.Logf("a slow body was cut off %v after its head was sent (window %d bytes in %v)", cut, pace.Window, pace.Time)

			// A body sent at once keeps up.
			fast := dialRaw(t, sc)
			const size = 200 << 10
			fast.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 204800\r\n\r\n" + strings.Repeat("y", size))
			if res, body := fast.read(http.MethodPost); res.StatusCode != http.StatusOK || body != "done" || read.Load() != size {
				t.Errorf("a body sent at once: %s %q, the application read %d bytes; want 200 and %d", res.Status, body, read.Load(), size)
			}
		})
	}
}

// TestBudgetFlags: the budgets' flags are validated together.
func TestBudgetFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string // in the error; "" for none
	}{
		{nil, ""},
		{[]string{"--max-connections", "0", "--max-pending-head-bytes", "0"}, ""},
		{[]string{"--body-min-rate", "2185"}, ""},
		{[]string{"--body-min-rate", "2184"}, "--body-min-rate (FLOODGATE_BODY_MIN_RATE): must be 0 (off) or at least 2185 bytes/s"},
		{[]string{"--body-min-rate", "-1"}, "--body-min-rate"},
		{[]string{"--max-connections", "-1"}, "--max-connections"},
		{[]string{"--max-pending-head-bytes", "65535"}, "--max-pending-head-bytes (FLOODGATE_MAX_PENDING_HEAD_BYTES): must be 0 (no cap) or at least --max-header-bytes (65536)"},
	} {
		var cfg Config
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		args := append([]string{"--policy-file", "p.yaml"}, tc.args...)
		if err := cfg.Parse(fs, args, func(string) (string, bool) { return "", false }); err != nil {
			t.Fatal(err)
		}
		err := cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v, want no error", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
	var cfg Config
	if err := cfg.Parse(flag.NewFlagSet("test", flag.ContinueOnError), nil, func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	if cfg.MaxConnections != DefaultMaxConnections || cfg.MaxPendingHeadBytes != DefaultMaxPendingHeadBytes || cfg.BodyMinRate != 0 {
		t.Errorf("defaults: --max-connections %d, --max-pending-head-bytes %d, --body-min-rate %d", cfg.MaxConnections, cfg.MaxPendingHeadBytes, cfg.BodyMinRate)
	}
}

// TestMaxConnectionsHTTP2: on both fronts, an h2c connection counts as
// proxy.H2ConnWeight connections and each of its requests in progress as
// one more; a request past the cap is answered 503 on a connection that
// stays open, and so is an HTTP/1.1 connection past it.
func TestMaxConnectionsHTTP2(t *testing.T) {
	t.Parallel()
	for _, front := range fronts {
		t.Run(front.name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/hold" {
					<-release
				}
				_, _ = io.WriteString(w, "ok")
			})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 1000, per: 1h}`), true,
				append([]string{"--max-connections", "4", "--read-header-timeout", "1m"}, front.args...)...)
			var ps http.Protocols
			ps.SetUnencryptedHTTP2(true)
			tr := &http.Transport{Protocols: &ps}
			t.Cleanup(tr.CloseIdleConnections)
			h2 := &http.Client{Transport: tr, Timeout: time.Minute}
			open := func() float64 { return sc.metric(t, "floodgate_sidecar_connections_open") }

			if res, _ := get(t, h2, sc.url+"/x"); res.StatusCode != http.StatusOK || res.ProtoMajor != 2 {
				t.Fatalf("an h2c request: %s %s, want 200 over HTTP/2", res.Proto, res.Status)
			}
			waitFor(t, 10*time.Second, "the h2c connection to count twice", func() bool { return open() == proxy.H2ConnWeight })

			held := make(chan int, 1)
			go func() {
				res, err := h2.Get(sc.url + "/hold")
				if err != nil {
					held <- 0
					return
				}
				_ = res.Body.Close()
				held <- res.StatusCode
			}()
			waitFor(t, 10*time.Second, "the request in progress to count", func() bool { return open() == proxy.H2ConnWeight+1 })
			dialRaw(t, sc)
			waitFor(t, 10*time.Second, "the HTTP/1.1 connection to count", func() bool { return open() == 4 })

			res, body := get(t, h2, sc.url+"/x")
			wantProblem := func(what string, status int, body string) {
				t.Helper()
				if status != http.StatusServiceUnavailable || !strings.Contains(body, proxy.ProblemAtCapacity) {
					t.Errorf("%s: %d %s, want 503 %s", what, status, body, proxy.ProblemAtCapacity)
				}
			}
			wantProblem("an h2c request past the cap", res.StatusCode, body)
			over := dialRaw(t, sc)
			res, body = over.read(http.MethodGet)
			wantAtCapacity(t, "an HTTP/1.1 connection past the cap", res, body)

			free()
			if got := <-held; got != http.StatusOK {
				t.Errorf("the request held at the cap: %d, want 200", got)
			}
			waitFor(t, 10*time.Second, "the request's count to be given back", func() bool { return open() == 3 })
			if res, _ := get(t, h2, sc.url+"/x"); res.StatusCode != http.StatusOK {
				t.Errorf("an h2c request under the cap again: %s, want 200", res.Status)
			}
			if got := sc.metric(t, `floodgate_sidecar_connections_refused_total{reason="max_connections"}`); got != 2 {
				t.Errorf("refused at the cap: %v, want 2", got)
			}
		})
	}
}

// TestSilentConnection: on both fronts, a new connection that sends
// nothing is closed once --read-header-timeout has passed since it was
// accepted, not after the idle timeout, so that silent connections hold
// no place under --max-connections for long.
func TestSilentConnection(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	for _, front := range fronts {
		t.Run(front.name, func(t *testing.T) {
			t.Parallel()
			be := newBackend(t, nil)
			sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 1000, per: 1h}`), true,
				append([]string{"--read-header-timeout", timeout.String()}, front.args...)...)
			// The sidecar accepts the connection after dialled.
			dialled := time.Now()
			c := dialRaw(t, sc)
			_ = c.nc.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang bound
			n, err := c.br.Read(make([]byte, 1))
			took := time.Since(dialled)
			if n != 0 || err == nil || isTimeout(err) {
				t.Fatalf("a silent connection: read %d bytes, %v; want it closed without an answer", n, err)
			}
			if took < timeout {
				t.Errorf("a silent connection was closed %v after it was dialled, before the %v timeout", took, timeout)
			}
			t.Logf("a silent connection was closed %v after it was dialled (timeout %v)", took, timeout)
		})
	}
}
