package runner

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// parsed is what an application server behind the sidecar parsed of one
// request: the method and target as its router sees them, its header
// fields (lower-case names) and how many body bytes it read.
type parsed struct {
	Method  string              `json:"method"`
	Target  string              `json:"target"`
	Headers map[string][]string `json:"headers"`
	Body    int                 `json:"body"`
}

// appServer is a real HTTP server implementation run behind the sidecar,
// reporting every request it parsed.
type appServer struct {
	url  string
	seen func(t *testing.T) []parsed
}

// goApp serves with Go's net/http and the 1.22 mux, whose "GET /once"
// route also serves HEAD.
func goApp(t *testing.T) appServer {
	t.Helper()
	var mu sync.Mutex
	var seen []parsed
	record := func(r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		h := map[string][]string{}
		for k, vs := range r.Header {
			h[strings.ToLower(k)] = vs
		}
		mu.Lock()
		seen = append(seen, parsed{Method: r.Method, Target: r.URL.RequestURI(), Headers: h, Body: int(n)})
		mu.Unlock()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /once", func(w http.ResponseWriter, r *http.Request) { record(r); _, _ = io.WriteString(w, "once") })
	mux.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) { record(r); _, _ = io.WriteString(w, "login") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { record(r); _, _ = io.WriteString(w, "other") })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return appServer{url: srv.URL, seen: func(*testing.T) []parsed {
		mu.Lock()
		defer mu.Unlock()
		return append([]parsed(nil), seen...)
	}}
}

// nodeApp is Node's http module: it keeps connections alive and parses
// pipelined requests on them, as the applications behind a sidecar do.
// It reports what it parsed at /_seen on its own port, which the sidecar
// is not in front of.
const nodeAppJS = `
const http = require('http');
const seen = [];
const srv = http.createServer((req, res) => {
  if (req.url === '/_seen') {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify(seen));
    return;
  }
  let n = 0;
  req.on('data', (c) => { n += c.length; });
  req.on('end', () => {
    const headers = {};
    for (let i = 0; i < req.rawHeaders.length; i += 2) {
      const k = req.rawHeaders[i].toLowerCase();
      (headers[k] = headers[k] || []).push(req.rawHeaders[i + 1]);
    }
    seen.push({method: req.method, target: req.url, headers: headers, body: n});
    res.end('node ' + req.method + ' ' + req.url);
  });
});
srv.keepAliveTimeout = 120000;
srv.listen(0, '127.0.0.1', () => { console.log(srv.address().port); });
`

func nodeApp(t *testing.T) appServer {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is needed for this test (make test-deps installs it): %v", err)
	}
	script := filepath.Join(t.TempDir(), "app.js")
	if err := os.WriteFile(script, []byte(nodeAppJS), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	port := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		port <- strings.TrimSpace(line)
	}()
	var p string
	select {
	case p = <-port:
	case <-time.After(time.Minute):
		t.Fatal("node did not print its port within a minute")
	}
	if p == "" {
		t.Fatal("node exited before listening")
	}
	base := "http://127.0.0.1:" + p
	return appServer{url: base, seen: func(t *testing.T) []parsed {
		t.Helper()
		res, err := http.Get(base + "/_seen")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = res.Body.Close() }()
		var seen []parsed
		if err := json.NewDecoder(res.Body).Decode(&seen); err != nil {
			t.Fatal(err)
		}
		return seen
	}}
}
