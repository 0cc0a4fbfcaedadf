package runner

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestBodyTimeout: on both fronts, a body that stalls is cut off once
// --body-timeout has passed since its last window began, never before;
// a body that keeps arriving is delivered whole; and an application that
// answers long after the body has ended is not cut off by the body's
// deadline.
func TestBodyTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 5 * time.Second // 50 times the pause between two parts of a live body
	for _, front := range []struct {
		name string
		args []string
	}{{"lean", nil}, {"net-http", []string{"--lean-http1=false"}}} {
		t.Run(front.name, func(t *testing.T) {
			t.Parallel()
			var read atomic.Int64
			be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
				n, _ := io.Copy(io.Discard, r.Body)
				read.Store(n)
				if r.URL.Path == "/slow-answer" {
					time.Sleep(timeout + timeout/2)
				}
				_, _ = io.WriteString(w, "done")
			})
			args := append([]string{"--body-timeout", timeout.String()}, front.args...)
			sc := startSidecar(t, be.URL, policyDoc("r1", `limit: {requests: 1000, per: 1h}`), true, args...)
			addr := strings.TrimPrefix(sc.url, "http://")
			dial := func() (net.Conn, *bufio.Reader) {
				nc, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = nc.Close() })
				return nc, bufio.NewReader(nc)
			}

			// A stalled body: 1 byte of 1,000,000. The sidecar starts
			// its deadline once it has the head, after sent.
			nc, br := dial()
			sent := time.Now()
			if _, err := io.WriteString(nc, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nx"); err != nil {
				t.Fatal(err)
			}
			_ = nc.SetReadDeadline(time.Now().Add(time.Minute)) // a hang bound
			res, err := http.ReadResponse(br, nil)
			cut := time.Since(sent)
			if err != nil || res.StatusCode != http.StatusRequestTimeout || !res.Close {
				t.Fatalf("a stalled body: %v %v, want 408 and the connection closed", res, err)
			}
			if cut < timeout {
				t.Errorf("a stalled body was cut off %v after it was sent, before the %v timeout", cut, timeout)
			}
			t.Logf("a stalled body was cut off %v after it was sent (timeout %v)", cut, timeout)

			// A body that keeps arriving, in two parts with a pause far
			// shorter than the timeout, is delivered whole.
			nc, br = dial()
			if _, err := io.WriteString(nc, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			if _, err := io.WriteString(nc, "67890"); err != nil {
				t.Fatal(err)
			}
			if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != http.StatusOK || read.Load() != 10 {
				t.Errorf("a body in two parts: %v %v, the application read %d bytes, want 200 and 10", res, err, read.Load())
			}

			// The application answers after longer than the timeout: the
			// body's deadline was lifted when the body ended.
			nc, br = dial()
			if _, err := io.WriteString(nc, "POST /slow-answer HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody"); err != nil {
				t.Fatal(err)
			}
			res, err = http.ReadResponse(br, nil)
			if err != nil || res.StatusCode != http.StatusOK {
				t.Fatalf("an answer slower than the body timeout: %v %v, want 200", res, err)
			}
			if body, _ := io.ReadAll(res.Body); string(body) != "done" {
				t.Errorf("an answer slower than the body timeout: body %q, want done", body)
			}
		})
	}
}
