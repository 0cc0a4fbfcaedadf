package lean

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/proxy"
)

// serveLean runs a lean Server on loopback in front of an application
// that answers "ok", and returns its address.
func serveLean(t *testing.T, o Options) (*Server, string) {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(app.Close)
	p := newProxy(t, slog.LevelWarn)
	o.Upstream = app.Listener.Addr().String()
	o.Proxy = func() *proxy.Proxy { return p }
	s := New(o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s, ln.Addr().String()
}

// roundTrip sends raw on nc and reads one answer.
func roundTrip(t *testing.T, nc net.Conn, br *bufio.Reader, raw string) *http.Response {
	t.Helper()
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second)) // a hang bound
	if _, err := io.WriteString(nc, raw); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		t.Fatal(err)
	}
	return res
}

// waitFor polls cond until it holds, failing the test after bound.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(bound); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", bound, what)
		}
	}
}

// TestBufferShrinksWhenIdle: a large head grows the connection's request
// buffer, charged to the head budget; once the connection waits for its
// next request, the buffer is back at its first size, the charge is
// given back, and the connection still serves.
func TestBufferShrinksWhenIdle(t *testing.T) {
	t.Parallel()
	budget := proxy.NewBudget(proxy.BudgetOptions{MaxPendingHeadBytes: 1 << 20})
	s, addr := serveLean(t, Options{Budget: budget})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	br := bufio.NewReader(nc)

	big := "GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", 20000) + "\r\n\r\n"
	if res := roundTrip(t, nc, br, big); res.StatusCode != http.StatusOK {
		t.Fatalf("a 20 KB head: %s, want 200", res.Status)
	}
	// The charge is given back when the buffer shrinks, after the
	// buffer is replaced: seeing it at 0 orders the read of the buffer
	// below after the write.
	waitFor(t, 30*time.Second, "the head budget's charge to be given back", func() bool { return budget.PendingHeadBytes() == 0 })
	s.mu.Lock()
	var sizes []int
	for c := range s.conns {
		sizes = append(sizes, len(c.buf))
	}
	s.mu.Unlock()
	if len(sizes) != 1 || sizes[0] != bufSize {
		t.Errorf("request buffers of the open connections: %v bytes, want one of %d", sizes, bufSize)
	}
	if res := roundTrip(t, nc, br, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n"); res.StatusCode != http.StatusOK {
		t.Errorf("the next request on the connection: %s, want 200", res.Status)
	}
}
