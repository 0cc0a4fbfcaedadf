package harness

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestReadResponseFraming(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, raw  string
		status     int
		keep       bool
		rest       string // what must be left unread: the next response
		wantErrMal bool
	}{
		{name: "content-length", raw: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\nNEXT", status: 200, keep: true, rest: "NEXT"},
		{name: "header case", raw: "HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\nRetry-After: 1\r\n\r\n{}NEXT", status: 429, keep: true, rest: "NEXT"},
		{name: "chunked with trailer", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-T: 1\r\n\r\nNEXT", status: 200, keep: true, rest: "NEXT"},
		{name: "no body", raw: "HTTP/1.1 204 No Content\r\n\r\nNEXT", status: 204, keep: true, rest: "NEXT"},
		{name: "connection close", raw: "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", status: 503, keep: false},
		{name: "http/1.0", raw: "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", status: 200, keep: false},
		{name: "until close", raw: "HTTP/1.1 200 OK\r\n\r\nall of it", status: 200, keep: false},
		{name: "bad status line", raw: "HTTX/1.1 200 OK\r\n\r\n", wantErrMal: true},
		{name: "bad length", raw: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", wantErrMal: true},
		{name: "bad chunk", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", wantErrMal: true},
		{name: "header without colon", raw: "HTTP/1.1 200 OK\r\nnonsense\r\n\r\n", wantErrMal: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			br := bufio.NewReaderSize(strings.NewReader(tc.raw), 64)
			status, keep, err := readResponse(br)
			if tc.wantErrMal {
				if !errors.Is(err, errMalformed) {
					t.Fatalf("readResponse = %d, %v, %v; want a malformed-response error", status, keep, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, want := status, tc.status; got != want {
				t.Errorf("status = %d, want %d", got, want)
			}
			if got, want := keep, tc.keep; got != want {
				t.Errorf("keep = %v, want %v", got, want)
			}
			if tc.keep {
				var rest strings.Builder
				_, _ = br.WriteTo(&rest)
				if got, want := rest.String(), tc.rest; got != want {
					t.Errorf("left unread %q, want %q", got, want)
				}
			}
		})
	}
}

func TestClientReusesConnectionsAndSendsHeaders(t *testing.T) {
	t.Parallel()
	var conns, requests atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if got, want := r.Header.Get("X-Key"), "k7"; got != want {
			t.Errorf("X-Key = %q, want %q", got, want)
		}
		if got, want := r.URL.RequestURI(), "/p?q=1"; got != want {
			t.Errorf("request URI = %q, want %q", got, want)
		}
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(strings.Repeat("x", 10000))) // chunked: no length set before the first write
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := NewClient()
	ct, err := compile(Target{URLs: []string{srv.URL + "/p?q=1"}, Header: keyed("k", 10)})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	for range 5 {
		if _, ok := do(context.Background(), c, ct, 7, rec); !ok {
			t.Fatalf("request failed: %d errors", rec.errors.Load())
		}
	}
	if got, want := rec.limited.Load(), int64(5); got != want {
		t.Errorf("429s = %d, want %d", got, want)
	}
	if got, want := c.Conns(), 1; got != want {
		t.Errorf("client dialled %d connections for 5 sequential requests, want %d", got, want)
	}
	c.CloseIdle()
	srv.Close()
	if conns.Load() != 1 || requests.Load() != 5 {
		t.Errorf("server saw %d connections and %d requests, want 1 and 5", conns.Load(), requests.Load())
	}
}

func TestCompileRejectsBadTargets(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"https://127.0.0.1/", "127.0.0.1:80", "http:///x", "http://[::1"} {
		if _, err := compile(Target{URLs: []string{u}}); err == nil {
			t.Errorf("compile(%q) accepted", u)
		}
	}
	if _, err := compile(Target{}); err == nil {
		t.Error("a target with no URLs was accepted")
	}
}

func TestPacerSleepsAtLeastTheDuration(t *testing.T) {
	t.Parallel()
	p, err := NewPacer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	for _, d := range []time.Duration{0, -time.Millisecond, 300 * time.Microsecond, 3 * time.Millisecond} {
		t0 := time.Now()
		p.Sleep(d)
		if got := time.Since(t0); got < d {
			t.Errorf("sleep(%v) returned after %v", d, got)
		}
	}
}

// The floors answer and proxy well-formed HTTP/1.1 that the load
// generator reads back, on several connections at once.
func TestFloorsServe(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }))
	t.Cleanup(backend.Close)
	addrs := map[string]func(addr string) error{
		"goroutines": func(a string) error { return ServeFloorAnswer(ctx, a, false) },
		"epoll":      func(a string) error { return ServeFloorAnswer(ctx, a, true) },
		"proxy":      func(a string) error { return ServeFloorProxy(ctx, a, strings.TrimPrefix(backend.URL, "http://")) },
	}
	const conns, each = 4, 5
	for name, serve := range addrs {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + port
		served := make(chan error, 1)
		go func() { served <- serve(addr) }()
		if err := WaitHTTP(ctx, "http://"+addr+"/", 0); err != nil {
			select {
			case serr := <-served:
				t.Fatalf("%s: %v (the floor: %v)", name, err, serr)
			default:
				t.Fatalf("%s: %v", name, err)
			}
		}
		// A fixed number of requests, not a stretch of time: every one
		// must be answered, on conns connections at once.
		c := NewClient()
		ct, err := compile(Target{URLs: []string{"http://" + addr + "/x"}})
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{}
		var wg sync.WaitGroup
		for w := range conns {
			wg.Go(func() {
				for i := range each {
					do(ctx, c, ct, int64(w*each+i), rec)
				}
			})
		}
		wg.Wait()
		c.CloseIdle()
		got := rec.limited.Load()
		if name == "proxy" {
			got = rec.ok.Load()
		}
		if got != conns*each || rec.errors.Load() != 0 {
			t.Errorf("%s: %d ok, %d limited, %d errors; want all %d answered %s", name,
				rec.ok.Load(), rec.limited.Load(), rec.errors.Load(), conns*each, map[bool]string{true: "200", false: "429"}[name == "proxy"])
		}
	}
}
