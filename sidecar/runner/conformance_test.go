package runner

// The HTTP/1.1 conformance suite of the sidecar's proxy path: real
// sockets, a real sidecar (the lean core in front, net/http behind it for
// what the core hands off), and backends that are either net/http servers
// or raw TCP listeners where the test must control the bytes. Responses are
// read with net/http's own parser, an implementation independent of the
// sidecar's.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/test/lateness"
)

// openPolicy admits everything (a rule with a huge limit, so responses
// carry the rate-limit fields) except /deny, which admits one request per
// hour per X-Key.
const openPolicy = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  rules:
  - name: open
    key: [{header: X-Key}]
    onMissingKey: Shared
    limit: {requests: 1000000000, per: 1s}
  - name: deny
    match: {path: {type: Prefix, value: /deny}}
    key: [{header: X-Key}]
    limit: {requests: 1, per: 1h}
`

// rawConn is a client connection that writes exact bytes and reads
// responses with net/http's parser.
type rawConn struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, sc *sidecar) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", strings.TrimPrefix(sc.url, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, nc: nc, br: bufio.NewReader(nc)}
}

func (c *rawConn) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.nc, s); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// read reads one response to a request with the given method and its
// whole body.
func (c *rawConn) read(method string) (*http.Response, string) {
	c.t.Helper()
	res, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		c.t.Fatalf("read response: %v", err)
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		c.t.Fatalf("read body: %v", err)
	}
	_ = res.Body.Close()
	return res, string(b)
}

// closed reports whether the server closed the connection (EOF or reset
// before any byte).
func (c *rawConn) closed() bool {
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.br.ReadByte()
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// echoBackend answers with what it received: method, body digest and
// length, trailers, and the forwarding fields.
func echoBackend(t *testing.T) *backend { return newBackend(t, echo) }

// echo is echoBackend's handler.
func echo(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	sum := sha256.Sum256(body)
	w.Header().Set("X-Seen-Method", r.Method)
	w.Header().Set("X-Seen-Len", strconv.Itoa(len(body)))
	w.Header().Set("X-Seen-Sum", fmt.Sprintf("%x", sum[:8]))
	w.Header().Set("X-Seen-Trailer", r.Trailer.Get("X-Checksum"))
	w.Header().Set("X-Seen-TE", strings.Join(r.TransferEncoding, ","))
	w.Header().Set("X-Seen-Expect", r.Header.Get("Expect"))
	w.Header().Set("X-Seen-Connection", r.Header.Get("Connection")+"|"+r.Header.Get("X-Hop"))
	_, _ = io.WriteString(w, "ok")
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return fmt.Sprintf("%x", sum[:8])
}

func TestConformanceChunkedRequestWithTrailers(t *testing.T) {
	t.Parallel()
	// /pieces reports each piece of its body as it arrives, so that the
	// client can send the next one only once the sidecar has passed the
	// last one on.
	pieces := make(chan string, 16)
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/pieces" {
			echo(w, r)
			return
		}
		var body []byte
		buf := make([]byte, 64)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				body = append(body, buf[:n]...)
				pieces <- string(buf[:n])
			}
			if err != nil {
				break
			}
		}
		w.Header().Set("X-Seen-Sum", digest(body))
		_, _ = io.WriteString(w, "ok")
	})
	sc := startSidecar(t, be.URL, openPolicy, true)
	c := dialRaw(t, sc)
	c.send("POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n" +
		"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: abc\r\n\r\n")
	res, body := c.read("POST")
	if res.StatusCode != 200 || body != "ok" {
		t.Fatalf("chunked POST: %d %q", res.StatusCode, body)
	}
	if got, want := res.Header.Get("X-Seen-Sum"), digest([]byte("hello world")); got != want {
		t.Errorf("backend body digest %s, want %s (len %s)", got, want, res.Header.Get("X-Seen-Len"))
	}
	if got := res.Header.Get("X-Seen-Trailer"); got != "abc" {
		t.Errorf("backend trailer X-Checksum = %q, want abc", got)
	}
	if got := res.Header.Get("X-Seen-TE"); got != "chunked" {
		t.Errorf("backend Transfer-Encoding = %q, want chunked", got)
	}
	// The body arriving in pieces, each sent only once the application
	// has the one before: the sidecar reads it in as many reads.
	c.send("POST /pieces HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc")
	waitPieces(t, pieces, "abc")
	c.send("\r\n2\r\nde\r\n")
	waitPieces(t, pieces, "de")
	c.send("0\r\n\r\n")
	res, _ = c.read("POST")
	if got, want := res.Header.Get("X-Seen-Sum"), digest([]byte("abcde")); res.StatusCode != 200 || got != want {
		t.Errorf("chunked body in pieces: %d, digest %s, want %s", res.StatusCode, got, want)
	}
}

// waitPieces waits until the pieces the application received make want.
func waitPieces(t *testing.T, pieces <-chan string, want string) {
	t.Helper()
	var got string
	for got != want {
		select {
		case p := <-pieces:
			got += p
		case <-time.After(time.Minute):
			t.Fatalf("the application has %q of the body, want %q before the client goes on", got, want)
		}
	}
}

func TestConformanceChunkedResponseWithTrailers(t *testing.T) {
	t.Parallel()
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Digest")
		f := http.NewResponseController(w)
		for i := range 3 {
			_, _ = fmt.Fprintf(w, "part%d;", i)
			_ = f.Flush()
		}
		w.Header().Set("X-Digest", "d1")
	})
	sc := startSidecar(t, be.URL, openPolicy, true)
	c := dialRaw(t, sc)
	for range 2 { // twice on one connection: the chunked end was found
		c.send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
		res, err := http.ReadResponse(c.br, &http.Request{Method: "GET"})
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		if string(body) != "part0;part1;part2;" || !slicesEqual(res.TransferEncoding, []string{"chunked"}) {
			t.Errorf("body %q, transfer encoding %v", body, res.TransferEncoding)
		}
		if got := res.Trailer.Get("X-Digest"); got != "d1" {
			t.Errorf("trailer X-Digest = %q, want d1", got)
		}
		if res.Header.Get("X-Ratelimit-Limit") == "" {
			t.Errorf("no rate-limit fields on a chunked response: %v", res.Header)
		}
	}
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

func TestConformanceExpectContinue(t *testing.T) {
	t.Parallel()
	be := echoBackend(t)
	sc := startSidecar(t, be.URL, openPolicy, true)
	c := dialRaw(t, sc)
	c.send("POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	// The client waits for 100 Continue before it sends the body.
	line, err := c.br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("interim response %q %v, want 100 Continue", line, err)
	}
	if blank, _ := c.br.ReadString('\n'); blank != "\r\n" {
		t.Fatalf("after 100: %q", blank)
	}
	c.send("hello")
	res, _ := c.read("POST")
	if res.StatusCode != 200 || res.Header.Get("X-Seen-Sum") != digest([]byte("hello")) {
		t.Errorf("after 100-continue: %d, digest %s", res.StatusCode, res.Header.Get("X-Seen-Sum"))
	}
	// A denied request is answered at once, without 100 and without the
	// body ever being read; the connection then closes, since the body
	// may still come.
	d := dialRaw(t, sc)
	d.send("POST /deny HTTP/1.1\r\nHost: x\r\nX-Key: e\r\nContent-Length: 3\r\n\r\nabc")
	if res, _ := d.read("POST"); res.StatusCode != 200 {
		t.Fatalf("first /deny: %d", res.StatusCode)
	}
	d.send("POST /deny HTTP/1.1\r\nHost: x\r\nX-Key: e\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n")
	res, body := d.read("POST")
	if res.StatusCode != 429 || !strings.Contains(body, "rate-limited") {
		t.Errorf("denied with Expect: %d %q, want 429 without 100", res.StatusCode, body)
	}
	if !res.Close || !d.closed() {
		t.Errorf("denied request with a body still to come: connection left open")
	}
}

func TestConformanceHEADAndBodylessStatuses(t *testing.T) {
	t.Parallel()
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/204":
			w.WriteHeader(204)
		case "/304":
			w.Header().Set("ETag", `"v1"`)
			w.WriteHeader(304)
		default:
			w.Header().Set("Content-Length", "11")
			if r.Method != "HEAD" {
				_, _ = io.WriteString(w, "hello world")
			}
		}
	})
	sc := startSidecar(t, be.URL, openPolicy, true)
	c := dialRaw(t, sc)
	c.send("HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n")
	res, body := c.read("HEAD")
	if res.StatusCode != 200 || body != "" || res.Header.Get("Content-Length") != "11" {
		t.Errorf("HEAD: %d, body %q, Content-Length %q", res.StatusCode, body, res.Header.Get("Content-Length"))
	}
	for _, p := range []string{"/204", "/304", "/x"} {
		c.send("GET " + p + " HTTP/1.1\r\nHost: x\r\n\r\n")
		res, body := c.read("GET")
		want := map[string]int{"/204": 204, "/304": 304, "/x": 200}[p]
		if res.StatusCode != want || (p != "/x" && body != "") {
			t.Errorf("GET %s: %d %q, want %d", p, res.StatusCode, body, want)
		}
	}
	if body != "" {
		t.Errorf("HEAD body %q", body)
	}
}

func TestConformanceConnectionClose(t *testing.T) {
	t.Parallel()
	be := echoBackend(t)
	sc := startSidecar(t, be.URL, openPolicy, true)
	c := dialRaw(t, sc)
	c.send("GET /a HTTP/1.1\r\nHost: x\r\nConnection: close, X-Hop\r\nX-Hop: secret\r\n\r\n")
	res, _ := c.read("GET")
	if res.StatusCode != 200 || !res.Close {
		t.Errorf("Connection: close: %d, close %v", res.StatusCode, res.Close)
	}
	if got := res.Header.Get("X-Seen-Connection"); got != "|" {
		t.Errorf("hop-by-hop fields reached the application: %q", got)
	}
	if !c.closed() {
		t.Error("the sidecar kept the connection after Connection: close")
	}
	// An application that closes its connections does not close the
	// client's.
	closing := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, "bye")
	})
	sc2 := startSidecar(t, closing.URL, openPolicy, true)
	d := dialRaw(t, sc2)
	for i := range 3 {
		d.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
		res, body := d.read("GET")
		if res.StatusCode != 200 || body != "bye" || res.Close {
			t.Errorf("request %d to a closing application: %d %q close=%v", i, res.StatusCode, body, res.Close)
		}
	}
}

func TestConformancePipelining(t *testing.T) {
	t.Parallel()
	be := echoBackend(t)
	sc := startSidecar(t, be.URL, openPolicy, true)
	c := dialRaw(t, sc)
	c.send("GET /1 HTTP/1.1\r\nHost: x\r\n\r\n" +
		"POST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody" +
		"POST /3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n" +
		"GET /deny HTTP/1.1\r\nHost: x\r\nX-Key: pipe\r\n\r\n" +
		"GET /deny HTTP/1.1\r\nHost: x\r\nX-Key: pipe\r\n\r\n" +
		"GET /6 HTTP/1.1\r\nHost: x\r\n\r\n")
	want := []struct {
		method string
		status int
		sum    string
	}{
		{"GET", 200, digest(nil)}, {"POST", 200, digest([]byte("body"))}, {"POST", 200, digest([]byte("hi"))},
		{"GET", 200, digest(nil)}, {"GET", 429, ""}, {"GET", 200, digest(nil)},
	}
	for i, w := range want {
		res, _ := c.read(w.method)
		if res.StatusCode != w.status || res.Header.Get("X-Seen-Sum") != w.sum {
			t.Errorf("pipelined response %d: %d digest %q, want %d %q", i+1, res.StatusCode, res.Header.Get("X-Seen-Sum"), w.status, w.sum)
		}
	}
}

func TestConformanceSmugglingDefences(t *testing.T) {
	t.Parallel()
	be := echoBackend(t)
	sc := startSidecar(t, be.URL, openPolicy, true)
	for name, tc := range map[string]struct {
		req    string
		status int
	}{
		"CL and TE":               {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		"TE and CL":               {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", 400},
		"duplicate CL":            {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde", 400},
		"CL list":                 {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4, 5\r\n\r\nabcde", 400},
		"signed CL":               {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +4\r\n\r\nabcd", 400},
		"obs-fold":                {"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 400},
		"space before colon":      {"GET / HTTP/1.1\r\nHost: x\r\nContent-Length : 0\r\n\r\n", 400},
		"TE gzip":                 {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501},
		"TE twice":                {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501},
		"bad chunk size":          {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400},
		"chunk size LF only":      {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", 400},
		"chunk data too long":     {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n", 400},
		"bare CR in value":        {"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", 400},
		"NUL in value":            {"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", 400},
		"two Hosts":               {"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400},
		"HTTP/1.2":                {"GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505},
		"chunk size overflow":     {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n", 400},
		"space in request target": {"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", 400},
	} {
		c := dialRaw(t, sc)
		c.send(tc.req)
		res, _ := c.read("POST")
		if res.StatusCode != tc.status {
			t.Errorf("%s: %d, want %d", name, res.StatusCode, tc.status)
		}
		if !c.closed() {
			t.Errorf("%s: the connection stayed open after a malformed request", name)
		}
	}
	if n := be.hits.Load(); n != 0 {
		t.Errorf("%d malformed requests reached the application", n)
	}
}

func TestConformanceOversizedHeadExactBound(t *testing.T) {
	t.Parallel()
	be := echoBackend(t)
	const limit = 4096
	sc := startSidecar(t, be.URL, openPolicy, true, "--max-header-bytes", strconv.Itoa(limit))
	head := func(size int) string {
		const start, end = "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ", "\r\n\r\n"
		return start + strings.Repeat("a", size-len(start)-len(end)) + end
	}
	for _, tc := range []struct {
		size, status int
	}{{limit, 200}, {limit + 1, 431}, {4 * limit, 431}} {
		c := dialRaw(t, sc)
		h := head(tc.size)
		if len(h) != tc.size {
			t.Fatalf("built a head of %d bytes, want %d", len(h), tc.size)
		}
		c.send(h)
		res, _ := c.read("GET")
		if res.StatusCode != tc.status {
			t.Errorf("head of %d bytes (bound %d): %d, want %d", tc.size, limit, res.StatusCode, tc.status)
		}
	}
}

func TestConformanceSlowlorisTimesOut(t *testing.T) {
	t.Parallel()
	be := echoBackend(t)
	const timeout = 300 * time.Millisecond
	sc := startSidecar(t, be.URL, openPolicy, true, "--read-header-timeout", timeout.String())
	c := dialRaw(t, sc)
	// The timeout runs from the head's first byte, which the sidecar
	// reads after start: the answer cannot come before start + timeout.
	// It comes just after, plus what the machine is measured to have
	// held the sidecar up by (test/lateness: its timer late, its
	// goroutines waiting for a CPU).
	probe := lateness.Start(lateness.Options{Sleep: timeout})
	defer probe.End()
	start := time.Now()
	c.send("GET / HTTP/1.1\r\nHost: x\r\n")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// One header byte every 50ms: the head never completes in time.
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				if _, err := io.WriteString(c.nc, "X"); err != nil {
					return
				}
			}
		}
	})
	res, err := http.ReadResponse(c.br, &http.Request{Method: "GET"})
	el := time.Since(start)
	close(stop)
	wg.Wait()
	probe.End()
	if err != nil {
		t.Fatalf("no 408: %v", err)
	}
	if res.StatusCode != 408 {
		t.Errorf("slow head: %d, want 408", res.StatusCode)
	}
	_, _ = io.ReadAll(res.Body)
	// few is what the sidecar takes to write the 408 once its deadline
	// has passed, on an idle machine.
	const few = 20 * time.Millisecond
	late := probe.Excuse(start, el)
	if el < timeout || el > timeout+few+late {
		t.Errorf("answered after %v, want just after the %v bound: within %v, plus the %v the machine held the sidecar up", el, timeout, few, late)
	}
	t.Logf("answered after %v (the machine held the sidecar up to %v)", el, late)
	if !c.closed() {
		t.Error("the connection stayed open after the timeout")
	}
}

// rawBackend serves each connection with handle, over a raw listener.
func rawBackend(t *testing.T, handle func(n int, c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				handle(int(n.Add(1)), c, bufio.NewReader(c))
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// readHead reads a request head from br.
func readHead(br *bufio.Reader) (*http.Request, error) {
	return http.ReadRequest(br)
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func TestConformanceUpstreamResets(t *testing.T) {
	t.Parallel()
	// headRead is closed once the client has the head of /reset-during's
	// answer: the application resets the connection only then, in the
	// middle of the body, whatever the machine's pace.
	headRead := make(chan struct{})
	up := rawBackend(t, func(n int, c net.Conn, br *bufio.Reader) {
		req, err := readHead(br)
		if err != nil {
			return
		}
		switch req.URL.Path {
		case "/reset-before":
			reset(c)
		case "/reset-during":
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
			select {
			case <-headRead:
			case <-time.After(time.Minute):
			}
			reset(c)
		default:
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	sc := startSidecar(t, up, openPolicy, true)
	c := dialRaw(t, sc)
	c.send("GET /reset-before HTTP/1.1\r\nHost: x\r\n\r\n")
	res, body := c.read("GET")
	if res.StatusCode != 502 || !strings.Contains(body, "upstream-unreachable") {
		t.Errorf("application reset before answering: %d %q, want 502", res.StatusCode, body)
	}
	d := dialRaw(t, sc)
	d.send("GET /reset-during HTTP/1.1\r\nHost: x\r\n\r\n")
	res, err := http.ReadResponse(d.br, &http.Request{Method: "GET"})
	close(headRead)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(res.Body); err == nil || len(b) >= 100 {
		t.Errorf("a body cut by a reset was passed on as complete: %d bytes, %v", len(b), err)
	}
	// Still serving.
	e := dialRaw(t, sc)
	e.send("GET /fine HTTP/1.1\r\nHost: x\r\n\r\n")
	if res, body := e.read("GET"); res.StatusCode != 200 || body != "ok" {
		t.Errorf("after resets: %d %q", res.StatusCode, body)
	}
	if got := sc.metric(t, `floodgate_sidecar_requests_total{outcome="upstream_error"}`); got < 1 {
		t.Errorf("upstream_error = %v, want at least 1", got)
	}
}

// An application that closes a kept connection between requests (without
// saying so) costs the client nothing: an idempotent request is sent
// again on a new connection.
func TestConformanceStaleUpstreamConnectionRetried(t *testing.T) {
	t.Parallel()
	var conns atomic.Int64
	closed := make(chan struct{}, 16)
	up := rawBackend(t, func(n int, c net.Conn, br *bufio.Reader) {
		conns.Add(1)
		if _, err := readHead(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		// Then close, as an idle timeout would.
		_ = c.Close()
		closed <- struct{}{}
	})
	sc := startSidecar(t, up, openPolicy, true)
	c := dialRaw(t, sc)
	for i := range 4 {
		c.send("GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
		if res, body := c.read("GET"); res.StatusCode != 200 || body != "ok" {
			t.Errorf("request %d after the application closed its connection: %d %q", i, res.StatusCode, body)
		}
		// The next request goes once the application has closed the
		// connection this one was answered on.
		select {
		case <-closed:
		case <-time.After(time.Minute):
			t.Fatalf("the application did not close the connection of request %d", i)
		}
	}
	if got := conns.Load(); got < 4 {
		t.Errorf("%d upstream connections for 4 requests that each closed theirs", got)
	}
}

// Large bodies cross in both directions intact (spliced between sockets).
func TestConformanceLargeBodies(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen-Sum", digest(b))
		w.Header().Set("Content-Length", strconv.Itoa(len(big)))
		_, _ = w.Write(big)
	})
	sc := startSidecar(t, be.URL, openPolicy, true)
	c := dialRaw(t, sc)
	for range 2 {
		c.send("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n")
		if _, err := c.nc.Write(big); err != nil {
			t.Fatal(err)
		}
		res, body := c.read("POST")
		if res.StatusCode != 200 || res.Header.Get("X-Seen-Sum") != digest(big) || digest([]byte(body)) != digest(big) {
			t.Errorf("1 MiB both ways: %d, upstream saw %s, client got %d bytes", res.StatusCode, res.Header.Get("X-Seen-Sum"), len(body))
		}
	}
}

// A keep-alive connection that turns into a WebSocket after ordinary
// requests is handed to net/http at that request; HTTP/1.0 and an
// absolute-form target go the same way.
func TestConformanceHandoffMidConnection(t *testing.T) {
	t.Parallel()
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			_, _ = io.WriteString(w, "plain")
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = rw.Flush()
		line, _ := rw.ReadString('\n')
		_, _ = rw.WriteString("echo:" + line)
		_ = rw.Flush()
	})
	sc := startSidecar(t, be.URL, openPolicy, true)
	c := dialRaw(t, sc)
	for range 2 {
		c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
		if res, body := c.read("GET"); res.StatusCode != 200 || body != "plain" {
			t.Fatalf("plain request: %d %q", res.StatusCode, body)
		}
	}
	c.send("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	res, err := http.ReadResponse(c.br, &http.Request{Method: "GET"})
	if err != nil || res.StatusCode != 101 {
		t.Fatalf("upgrade after plain requests: %v %v", res, err)
	}
	c.send("ping\n")
	if line, _ := c.br.ReadString('\n'); line != "echo:ping\n" {
		t.Errorf("through the upgraded connection: %q", line)
	}
	for _, req := range []string{
		"GET /a HTTP/1.0\r\nHost: x\r\n\r\n",
		"GET http://x/a HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		d := dialRaw(t, sc)
		d.send(req)
		if res, body := d.read("GET"); res.StatusCode != 200 || body != "plain" || res.Header.Get("X-Ratelimit-Limit") == "" {
			t.Errorf("%q: %d %q fields %v", req, res.StatusCode, body, res.Header)
		}
	}
}

// An application answer with both Content-Length and chunked framing
// reaches the client chunked only.
func TestConformanceResponseCLAndTE(t *testing.T) {
	t.Parallel()
	up := rawBackend(t, func(n int, c net.Conn, br *bufio.Reader) {
		for {
			if _, err := readHead(br); err != nil {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
		}
	})
	sc := startSidecar(t, up, openPolicy, true)
	c := dialRaw(t, sc)
	for range 2 {
		c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		var head []string
		for {
			line, err := c.br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if line == "\r\n" {
				break
			}
			head = append(head, strings.TrimSpace(line))
		}
		joined := strings.Join(head, "\n")
		if !strings.Contains(joined, "Transfer-Encoding: chunked") || strings.Contains(strings.ToLower(joined), "content-length") {
			t.Errorf("answer head:\n%s\nwant chunked framing only", joined)
		}
		for _, want := range []string{"3\r\n", "abc\r\n", "0\r\n", "\r\n"} {
			if line, err := c.br.ReadString('\n'); err != nil || line != want {
				t.Fatalf("chunked body line %q %v, want %q", line, err, want)
			}
		}
	}
}
