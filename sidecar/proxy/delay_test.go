package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

const delayDoc = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  rules:
  - name: smooth
    match: {path: {type: Prefix, value: /fast/x}}
    key: [{header: X-Tenant}]
    limit: {requests: 60, per: 1m, algorithm: GCRA, onExceed: Delay, maxDelay: 2500ms, delayAfter: 1}
  - name: queued
    match: {path: {type: Prefix, value: /fast/q}}
    key: [{header: X-Tenant}]
    limit: {requests: 1, per: 1m, algorithm: GCRA, onExceed: Delay, maxDelay: 1m, delayAfter: 1}
  - name: echo
    match: {path: {type: Prefix, value: /echo}}
    key: [{header: X-Tenant}]
    limit: {requests: 30, per: 1m, algorithm: GCRA, onExceed: Delay, maxDelay: 5s, delayAfter: 1}
  - name: qconc
    match: {path: {type: Prefix, value: /fast/q}}
    key: [{header: X-Tenant}]
    concurrency: {max: 1}
`

// A delaying rule of one a second (one at once, up to 2.5s of wait) on
// both fronts: of four requests sent at once, the application gets three,
// each no earlier than its slot, a second apart from the first decision
// on, and the fourth, whose slot is 3s away, is refused with 429 (it
// would be let in only if decided 0.5s after the first, far more than a
// busy machine takes to decide four requests); a request that
// waits holds no concurrency slot, and one whose client goes away while
// it waits never reaches the application and gives its slot back.
func TestDelayedRequestsReachTheAppAtTheRate(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	for _, f := range frontsFor(t, b, delayDoc) {
		t.Run(f.name, func(t *testing.T) {
			tenant := "t-" + f.name
			b.mu.Lock()
			before := len(b.arrivals)
			b.mu.Unlock()
			start := time.Now()
			replies := make(chan reply, 4)
			for range 4 {
				_, br := send(t, f.url, "/fast/x", "X-Tenant", tenant)
				go func() { replies <- readReplyNoFail(br) }()
			}
			statuses := map[int]int{}
			for range 4 {
				r := <-replies
				statuses[r.status]++
				if r.status == http.StatusTooManyRequests && r.header.Get("Retry-After") == "" {
					t.Errorf("a refused request without Retry-After: %v", r.header)
				}
			}
			if statuses[http.StatusOK] != 3 || statuses[http.StatusTooManyRequests] != 1 {
				t.Fatalf("statuses %v, want 3 OK (one at once, two delayed) and one 429 (past maxDelay)", statuses)
			}
			b.mu.Lock()
			got := append([]time.Time(nil), b.arrivals[before:]...)
			b.mu.Unlock()
			if len(got) != 3 {
				t.Fatalf("the application got %d requests, want 3", len(got))
			}
			for k, at := range got {
				if min := time.Duration(k) * time.Second; at.Sub(start) < min {
					t.Errorf("request %d reached the application %v after the first was sent, before its slot at %v", k, at.Sub(start), min)
				}
			}

			// A request that waits a minute and whose client leaves,
			// behind one that went at once.
			if r := do(t, f.url, "/fast/q", "X-Tenant", tenant); r.status != http.StatusOK {
				t.Fatalf("first request of the queued rule: %d", r.status)
			}
			// Its concurrency slot comes back once its response is done,
			// which may be just after the client has it.
			f.waitInFlight(t, "qconc", 0)
			abandoned := func() float64 {
				return testutil.ToFloat64(f.m.DelayedTotal.WithLabelValues("p", "queued", metrics.DelayAbandoned))
			}
			was := abandoned()
			b.mu.Lock()
			seen := len(b.arrivals)
			b.mu.Unlock()
			nc, _ := send(t, f.url, "/fast/q", "X-Tenant", tenant)
			waitUntil(t, "the request never waited", func() bool { return f.waiting("queued") >= 1 })
			// Waiting is not in flight: the concurrency rule's slot is
			// free while the request waits.
			if got := f.inFlight(t, "qconc"); got != 0 {
				t.Errorf("a waiting request holds %v concurrency slots, want 0", got)
			}
			_ = nc.Close()
			waitUntil(t, "the request whose client left was never counted abandoned", func() bool { return abandoned() != was })
			b.mu.Lock()
			after := len(b.arrivals)
			b.mu.Unlock()
			if after != seen {
				t.Errorf("the application got %d requests after their client left, want 0", after-seen)
			}
			// Its slot came back: the next request waits for that same
			// slot, about a minute away, not two.
			nc2, _ := send(t, f.url, "/fast/q", "X-Tenant", tenant)
			defer func() { _ = nc2.Close() }()
			waitUntil(t, "the next request never waited: the abandoned slot was not given back", func() bool { return f.waiting("queued") >= 1 })
		})
	}
}

// A delayed request whose body, and a pipelined request after it, arrive
// while it waits: on both fronts the application gets the whole body with
// its request and the pipelined request as a request of its own, never
// the body's bytes read as a request.
func TestDelayedRequestKeepsItsBodyAndThePipelinedOne(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	for _, f := range frontsFor(t, b, delayDoc) {
		t.Run(f.name, func(t *testing.T) {
			tenant := "body-" + f.name
			if r := do(t, f.url, "/echo/first", "X-Tenant", tenant); r.status != http.StatusOK {
				t.Fatalf("first request: %d", r.status)
			}
			u, _ := url.Parse(f.url)
			conn, err := net.Dial("tcp", u.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			if err := conn.SetDeadline(time.Now().Add(time.Minute)); err != nil {
				t.Fatal(err)
			}
			body := strings.Repeat("b", 3000) + "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
			req := fmt.Sprintf("POST /echo/second HTTP/1.1\r\nHost: test\r\nX-Tenant: %s\r\nContent-Length: %d\r\n\r\n", tenant, len(body))
			// The pipelined request is another tenant's: it goes at once.
			next := "GET /echo/third HTTP/1.1\r\nHost: test\r\nX-Tenant: other-" + tenant + "\r\nContent-Length: 5\r\n\r\nthird"
			// The head first: the request starts waiting for its slot
			// (2s away: the test sees it waiting on any machine); then
			// its body and the pipelined request.
			if _, err := io.WriteString(conn, req); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the POST never waited", func() bool { return f.waiting("echo") >= 1 })
			if _, err := io.WriteString(conn, body+next); err != nil {
				t.Fatal(err)
			}
			rd := bufio.NewReader(conn)
			for _, want := range []string{body, "third"} {
				r := readReply(t, rd)
				if r.status != http.StatusOK || r.body != want {
					t.Fatalf("answer %d %q (%d bytes), want 200 with the request's own body (%d bytes)", r.status, clip(r.body), len(r.body), len(want))
				}
			}
		})
	}
}

func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// waiting is the requests of rule that wait for a delayed slot.
func (f *front) waiting(rule string) float64 {
	return testutil.ToFloat64(f.m.DelayedWaiting.WithLabelValues("p", rule))
}

// waitUntil polls cond until it holds, and fails the test with what
// after 10s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(time.Millisecond)
	}
}
