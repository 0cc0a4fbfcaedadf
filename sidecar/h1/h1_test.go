package h1

import (
	"errors"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	t.Parallel()
	head := "GET /a/b?x=1&y=2 HTTP/1.1\r\nHost: example.com:8080\r\nX-Key:  v1 \r\nConnection: keep-alive, X-Hop\r\nTE: trailers\r\n\r\nrest"
	var r Request
	n, err := ParseRequest([]byte(head), &r, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := n, len(head)-len("rest"); got != want {
		t.Errorf("head length %d, want %d", got, want)
	}
	if string(r.Method) != "GET" || string(r.Path) != "/a/b" || string(r.Query) != "x=1&y=2" || r.Minor != 1 {
		t.Errorf("request line: %q %q %q 1.%d", r.Method, r.Path, r.Query, r.Minor)
	}
	if string(r.Host) != "example.com:8080" || r.ContentLength != -1 || r.Chunked || r.Close || r.Upgrade || !r.TETrailers {
		t.Errorf("framing %+v", r)
	}
	if len(r.Fields) != 4 || string(r.Fields[1].Value) != "v1" {
		t.Errorf("fields %q", r.Fields)
	}
	if len(r.ConnOptions) != 1 || string(r.ConnOptions[0]) != "X-Hop" {
		t.Errorf("connection options %q", r.ConnOptions)
	}
}

func TestParseRequestIncompleteAndBound(t *testing.T) {
	t.Parallel()
	full := "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n"
	var r Request
	for i := range len(full) {
		if n, err := ParseRequest([]byte(full[:i]), &r, 1024); n != 0 || err != nil {
			t.Fatalf("prefix of %d bytes: %d %v, want incomplete", i, n, err)
		}
	}
	if n, err := ParseRequest([]byte(full), &r, len(full)); n != len(full) || err != nil || r.ContentLength != 3 {
		t.Errorf("head at exactly the bound: %d %v", n, err)
	}
	if _, err := ParseRequest([]byte(full), &r, len(full)-1); statusOf(err) != 431 {
		t.Errorf("head one byte over the bound: %v, want 431", err)
	}
	if _, err := ParseRequest([]byte("GET / HTTP/1.1\r\nX: "+strings.Repeat("a", 100)), &r, 50); statusOf(err) != 431 {
		t.Errorf("unfinished head past the bound: %v, want 431", err)
	}
	// Empty lines before the request line are skipped.
	if n, err := ParseRequest([]byte("\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"), &r, 1024); err != nil || n != 31 {
		t.Errorf("leading CRLFs: %d %v", n, err)
	}
}

func statusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func TestParseRequestRejects(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		head   string
		status int
	}{
		"CL+TE":          {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
		"two CLs":        {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
		"CL list":        {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1,1\r\n\r\n", 400},
		"obs-fold":       {"GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n\tc\r\n\r\n", 400},
		"no host":        {"GET / HTTP/1.1\r\n\r\n", 400},
		"bad host":       {"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400},
		"TE identity":    {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n", 501},
		"HTTP/3.0":       {"GET / HTTP/3.0\r\nHost: x\r\n\r\n", 505},
		"lowercase http": {"GET / http/1.1\r\nHost: x\r\n\r\n", 400},
		"two spaces":     {"GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		"name with @":    {"GET / HTTP/1.1\r\nHost: x\r\nA@b: c\r\n\r\n", 400},
		"DEL in value":   {"GET / HTTP/1.1\r\nHost: x\r\nA: \x7f\r\n\r\n", 400},
	} {
		var r Request
		if _, err := ParseRequest([]byte(tc.head), &r, 4096); statusOf(err) != tc.status {
			t.Errorf("%s: %v, want %d", name, err, tc.status)
		}
	}
	var r Request
	if _, err := ParseRequest([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), &r, 4096); err != nil || !r.PRI {
		t.Errorf("HTTP/2 preface: %v, PRI %v", err, r.PRI)
	}
}

func TestParseResponse(t *testing.T) {
	t.Parallel()
	var r Response
	head := "HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
	n, err := ParseResponse([]byte(head), &r, 1024)
	if err != nil || n != len(head)-5 || r.Status != 404 || string(r.Reason) != "Not Found" || r.ContentLength != 5 || !r.Close {
		t.Errorf("%d %v %+v", n, err, r)
	}
	if _, err := ParseResponse([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), &r, 1024); err != nil || !r.Chunked || r.Close {
		t.Errorf("chunked last: %v %+v", err, r)
	}
	if _, err := ParseResponse([]byte("HTTP/1.0 200 OK\r\n\r\n"), &r, 1024); err != nil || !r.Close {
		t.Errorf("HTTP/1.0 without keep-alive must close: %v %+v", err, r)
	}
	if _, err := ParseResponse([]byte("HTTP/1.1 2000 OK\r\n\r\n"), &r, 1024); err == nil {
		t.Error("a four-digit status was accepted")
	}
}

func TestChunked(t *testing.T) {
	t.Parallel()
	body := "4;a=b\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-T: 1\r\n\r\nNEXT"
	// Whole, and one byte at a time.
	var c Chunked
	n, err := c.Scan([]byte(body))
	if err != nil || !c.Done() || n != len(body)-4 {
		t.Errorf("whole: %d %v done=%v", n, err, c.Done())
	}
	c.Reset()
	total := 0
	for i := 0; i < len(body) && !c.Done(); i++ {
		m, err := c.Scan([]byte{body[i]})
		if err != nil {
			t.Fatalf("byte %d: %v", i, err)
		}
		total += m
	}
	if total != len(body)-4 {
		t.Errorf("byte by byte: %d bytes, want %d", total, len(body)-4)
	}
	for name, bad := range map[string]string{
		"no digits":        ";x\r\n",
		"LF only":          "1\nA\r\n0\r\n\r\n",
		"missing data CR":  "1\r\nAB\r\n",
		"trailer no colon": "0\r\nX\r\n\r\n",
		"trailer fold":     "0\r\nX: 1\r\n 2\r\n\r\n",
		"too many digits":  "1000000000000000\r\n",
	} {
		c.Reset()
		if _, err := c.Scan([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestParseRequestAllocatesNothing(t *testing.T) {
	head := []byte("GET /deny/x?q=1 HTTP/1.1\r\nHost: x\r\nX-Key: abuser\r\nUser-Agent: t\r\nAccept: */*\r\n\r\n")
	var r Request
	if _, err := ParseRequest(head, &r, 4096); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = ParseRequest(head, &r, 4096) }); n != 0 {
		t.Errorf("%v allocations per parse, want 0", n)
	}
}

// FuzzParseRequest: no input panics, and an accepted head is within the
// bound and has a consistent framing.
func FuzzParseRequest(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add([]byte("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		n, err := ParseRequest(b, &r, 512)
		if err != nil || n == 0 {
			return
		}
		if n > len(b) || (r.Chunked && r.ContentLength >= 0) {
			t.Fatalf("accepted %q: n %d, chunked %v, length %d", b, n, r.Chunked, r.ContentLength)
		}
		var c Chunked
		_, _ = c.Scan(b[n:])
	})
}
