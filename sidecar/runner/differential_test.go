package runner

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/proxy"
)

// The differential harness: what the sidecar checked is what the
// application got. It runs the sidecar, each of its HTTP/1.1 fronts, in
// front of real HTTP server implementations, sends them known smuggling
// and bypass vectors (testdata/differential/corpus.txt) and requests
// generated from an HTTP/1.1 grammar with mutations, and compares every
// request an upstream parsed with the decisions the sidecar took
// (proxy.Options.Checked):
//
//   - the sidecar decided a request with the same method;
//   - the rule of the handler the upstream routed it to counted it;
//   - that rule counted it under the key the upstream reads;
//   - each response reaches the connection whose request it answers.
//
// Any mismatch fails the test and prints the bytes. go test -run
// TestDifferential -args -differential.report rewrites
// testdata/differential/report.md; FuzzDifferential explores further.

var (
	diffReport = flag.Bool("differential.report", false, "rewrite testdata/differential/report.md with the cases of TestDifferential by upstream")
	diffCases  = flag.Int("differential.cases", 1000, "requests TestDifferential generates for each upstream and front")
	diffSeed   = flag.Uint64("differential.seed", 1, "seed of TestDifferential's generated requests")
)

// diffPolicy counts each route of the upstreams under its own rule, with
// limits the harness never reaches: a request a rule counts is forwarded.
const diffPolicy = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: d
  uid: uid-d
  rules:
  - {name: once, match: {path: {type: Exact, value: /once}, methods: [GET]}, limit: {requests: 1000000, per: 1h}}
  - {name: login, match: {path: {type: Exact, value: /login}, methods: [POST]}, limit: {requests: 1000000, per: 1h}}
  - {name: admin, match: {path: {type: Exact, value: /admin}}, limit: {requests: 1000000, per: 1h}}
  - {name: keyed, match: {path: {type: Exact, value: /keyed}}, key: [{header: X-Api-Key}], limit: {requests: 1000000, per: 1h}}
  - {name: deep, match: {path: {type: Prefix, value: /deep/}}, limit: {requests: 1000000, per: 1h}}
`

// diffSentinel follows every case on its connection: once it is
// answered, every request before it has been.
const diffSentinel = "GET /_end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

// upstreamParse is what an upstream parsed of one request: the handler it
// routed to ("" when it answered without one: 405, a redirect, 400), the
// method, the path as it routes it, and the X-Api-Key it reads (HasKey:
// not empty; applications read an empty field as none).
type upstreamParse struct {
	ID      string `json:"id"`
	Handler string `json:"handler"`
	Method  string `json:"method"`
	Path    string `json:"path"`
	Key     string `json:"key"`
	HasKey  bool   `json:"hasKey"`
}

// diffUpstream is a real HTTP server behind the sidecar.
type diffUpstream struct {
	name, version string
	url           string
	// since returns what it parsed from the n-th request on.
	since func(n int) ([]upstreamParse, error)
}

// diffUpstreams are the servers: Go's net/http with the 1.22 mux, Node's
// http, Werkzeug and nginx.
var diffUpstreams = []struct {
	name  string
	start func(t testing.TB) diffUpstream
}{
	{"go-net-http", goDiffUpstream},
	{"node-http", nodeDiffUpstream},
	{"python-werkzeug", werkzeugDiffUpstream},
	{"nginx", nginxDiffUpstream},
}

var diffFronts = []struct {
	name string
	args []string
}{{"lean", nil}, {"net-http", []string{"--lean-http1=false"}}}

func goDiffUpstream(t testing.TB) diffUpstream {
	var mu sync.Mutex
	var seen []upstreamParse
	handle := func(handler string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			id := "go-" + strconv.Itoa(len(seen)+1)
			key := r.Header.Get("X-Api-Key")
			seen = append(seen, upstreamParse{ID: id, Handler: handler, Method: r.Method, Path: r.URL.Path, Key: key, HasKey: key != ""})
			mu.Unlock()
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("X-Diff-Id", id)
			_, _ = io.WriteString(w, handler+"\n")
		}
	}
	mux := http.NewServeMux()
	for pattern, handler := range map[string]string{"/_end": "end", "GET /once": "once", "POST /login": "login",
		"/admin": "admin", "/keyed": "keyed", "/deep/": "deep", "/": "other"} {
		mux.Handle(pattern, handle(handler))
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return diffUpstream{name: "go-net-http", version: runtime.Version(), url: srv.URL, since: func(n int) ([]upstreamParse, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen[min(n, len(seen)):]), nil
	}}
}

// startScript runs an upstream that prints "<port> <control port>" and
// serves its parses at /seen?from=N on the control port.
func startScript(t testing.TB, name, version string, argv ...string) diffUpstream {
	cmd := exec.Command(argv[0], argv[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s stderr:\n%.20000s", name, stderr.String())
		}
	})
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	var ports []string
	select {
	case l := <-line:
		ports = strings.Fields(l)
	case <-time.After(time.Minute):
		t.Fatalf("%s did not print its ports within a minute", name)
	}
	if len(ports) != 2 {
		t.Fatalf("%s exited before listening", name)
	}
	control := "http://127.0.0.1:" + ports[1] + "/seen?from="
	return diffUpstream{name: name, version: version, url: "http://127.0.0.1:" + ports[0], since: func(n int) ([]upstreamParse, error) {
		res, err := http.Get(control + strconv.Itoa(n))
		if err != nil {
			return nil, err
		}
		defer func() { _ = res.Body.Close() }()
		var seen []upstreamParse
		return seen, json.NewDecoder(res.Body).Decode(&seen)
	}}
}

func nodeDiffUpstream(t testing.TB) diffUpstream {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is needed (make test-deps installs it): %v", err)
	}
	v, _ := exec.Command(node, "--version").Output()
	return startScript(t, "node-http", "node "+strings.TrimSpace(string(v)), node, filepath.Join("testdata", "differential", "app.js"))
}

// debianPython is Debian's Python, which has Debian's Werkzeug.
const debianPython = "/usr/bin/python3"

func werkzeugDiffUpstream(t testing.TB) diffUpstream {
	v, err := exec.Command(debianPython, "-c", "import importlib.metadata as m; print(m.version('werkzeug'))").Output()
	if err != nil {
		t.Fatalf("Debian's python3-werkzeug is needed (make test-deps installs it): %v", err)
	}
	return startScript(t, "python-werkzeug", "werkzeug "+strings.TrimSpace(string(v)), debianPython, filepath.Join("testdata", "differential", "app.py"))
}

// nginxRecord is a line of the nginx upstream's access log.
type nginxRecord struct {
	upstreamParse
	Status string `json:"status"`
}

func nginxDiffUpstream(t testing.TB) diffUpstream {
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			t.Fatalf("nginx is needed (make test-deps installs it): %v", err)
		}
		nginx = "/usr/sbin/nginx"
	}
	v, _ := exec.Command(nginx, "-v").CombinedOutput()
	dir := t.TempDir()
	for _, d := range []string{"body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	tmpl, err := os.ReadFile(filepath.Join("testdata", "differential", "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, port, _ := net.SplitHostPort(addr)
	conf := strings.NewReplacer("DIR", dir, "PORT", port).Replace(string(tmpl))
	cf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nginx, "-p", dir, "-c", cf, "-e", filepath.Join(dir, "error.log"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start nginx: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx did not listen within a minute: %v\n%s", err, logs)
		}
	}
	log := filepath.Join(dir, "access.log")
	return diffUpstream{name: "nginx", version: strings.TrimSpace(strings.TrimPrefix(string(v), "nginx version: ")), url: "http://" + addr,
		since: func(n int) ([]upstreamParse, error) {
			b, err := os.ReadFile(log)
			if err != nil && !os.IsNotExist(err) {
				return nil, err
			}
			var seen []upstreamParse
			lines := bytes.Split(b, []byte("\n"))
			for i, line := range lines {
				if i < n || (i == len(lines)-1 && len(line) == 0) {
					continue
				}
				if i == len(lines)-1 { // a line still being written
					break
				}
				var r nginxRecord
				if err := json.Unmarshal(line, &r); err != nil {
					return nil, fmt.Errorf("nginx access log line %d: %w: %s", i, err, line)
				}
				r.HasKey = r.Key != "" // nginx does not tell an empty field from none
				if r.Status != "200" {
					r.Handler = ""
				}
				seen = append(seen, r.upstreamParse)
			}
			return seen, nil
		}}
}

// diffRun is the sidecar, one front, in front of one upstream.
type diffRun struct {
	up   diffUpstream
	sc   *sidecar
	addr string

	mu     sync.Mutex
	checks []proxy.Checked
	parsed int // parses of the upstream taken so far

	keys map[string]string // calibrated counter keys, by "1"+value or "0"

	// answerWait bounds an exchange's read, parseWait the wait for the
	// upstream's parses (a request the upstream refuses is never
	// parsed): FuzzDifferential shortens both to keep each input within
	// the fuzzing engine's patience.
	answerWait, parseWait time.Duration

	stats diffStats
}

// diffStats count the cases of a run, for the report.
type diffStats struct {
	Cases, Parsed, Refused, Stricter int
}

func startDiffRun(t testing.TB, up diffUpstream, frontArgs []string) *diffRun {
	run := &diffRun{up: up, keys: map[string]string{}, answerWait: 10 * time.Second, parseWait: 5 * time.Second}
	args := append([]string{"--read-header-timeout", "300ms", "--body-timeout", "300ms", "--log-level", "error"}, frontArgs...)
	run.sc = startSidecarWith(t, frozen, func(r *Runner) {
		r.checked = func(c proxy.Checked) {
			run.mu.Lock()
			run.checks = append(run.checks, c)
			run.mu.Unlock()
		}
	}, up.url, diffPolicy, true, args...)
	run.addr = strings.TrimPrefix(run.sc.url, "http://")
	return run
}

// exchange is one case on a connection of its own.
type diffExchange struct {
	sent    []byte
	answer  []byte
	checks  []proxy.Checked
	parses  []upstreamParse
	timeout bool
}

var diffIDs = regexp.MustCompile(`(?i)\r\nx-diff-id: *([a-z0-9-]+)`)

// exchange sends raw, then the sentinel, reads until the sidecar closes
// the connection, and waits until the upstream has parsed as many
// requests as the sidecar forwarded.
func (run *diffRun) exchange(t testing.TB, raw []byte) diffExchange {
	run.mu.Lock()
	from := len(run.checks)
	run.mu.Unlock()
	ex := diffExchange{sent: append(slices.Clone(raw), diffSentinel...)}
	nc, err := net.Dial("tcp", run.addr)
	if err != nil {
		t.Fatalf("dial the sidecar: %v", err)
	}
	_ = nc.SetDeadline(time.Now().Add(run.answerWait))
	if _, err := nc.Write(ex.sent); err != nil && !isReset(err) {
		t.Fatalf("write: %v", err)
	}
	ex.answer, err = io.ReadAll(nc)
	ex.timeout = isTimeout(err)
	_ = nc.Close()
	// The sidecar decides a request before it forwards it, and the
	// upstream records it when it parses it: wait for as many parses as
	// forwarded requests, then a moment for any the sidecar did not
	// decide.
	deadline := time.Now().Add(run.parseWait)
	for {
		run.mu.Lock()
		ex.checks = slices.Clone(run.checks[from:])
		run.mu.Unlock()
		forwarded := 0
		for _, c := range ex.checks {
			if c.Outcome == proxy.Pass || c.Outcome == proxy.Allowed {
				forwarded++
			}
		}
		got, err := run.up.since(run.parsed)
		if err != nil {
			t.Fatalf("%s: read what it parsed: %v", run.up.name, err)
		}
		ex.parses = got
		if len(got) >= forwarded || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	run.parsed += len(ex.parses)
	return ex
}

// isReset reports a write that the sidecar cut by closing first, as it
// does after refusing a request.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// key returns the counter key the keyed rule gives a request whose
// X-Api-Key is v (none when !has), from a request that carries it plainly.
func (run *diffRun) key(t testing.TB, v string, has bool) (string, bool) {
	id := "0"
	if has {
		id = "1" + v
	}
	if k, ok := run.keys[id]; ok {
		return k, true
	}
	if has && strings.ContainsAny(v, "\r\n\x00") {
		return "", false
	}
	req := "GET /keyed HTTP/1.1\r\nHost: x\r\n"
	if has {
		req += "X-Api-Key: " + v + "\r\n"
	}
	ex := run.exchange(t, []byte(req+"\r\n"))
	for _, c := range ex.checks {
		if i := slices.Index(c.Rules, "d.keyed"); i >= 0 {
			run.keys[id] = c.Keys[i]
			return c.Keys[i], true
		}
	}
	return "", false
}

// check compares what the upstream parsed in ex with what the sidecar
// decided, and returns what does not agree.
func (run *diffRun) check(t testing.TB, ex diffExchange) []string {
	var bad []string
	// Any decision may answer any parse of the exchange: a server logs a
	// request it refused when the connection closes (nginx), after the
	// next one.
	used := make([]bool, len(ex.checks))
	ids := map[string]bool{}
	for _, p := range ex.parses {
		ids[p.ID] = true
		if p.Method == "" {
			// The upstream refused what it got before it read a method
			// (nginx logs its 400s too): nothing reached a handler.
			continue
		}
		var want string
		wantOK := true
		if p.Handler == "keyed" {
			want, wantOK = run.key(t, p.Key, p.HasKey)
		}
		covers := func(c proxy.Checked) bool {
			if !routed(p.Handler) {
				return true
			}
			i := slices.Index(c.Rules, "d."+p.Handler)
			return i >= 0 && (p.Handler != "keyed" || wantOK && c.Keys[i] == want)
		}
		found := -1
		for i, c := range ex.checks {
			if !used[i] && (c.Outcome == proxy.Pass || c.Outcome == proxy.Allowed) && c.Method == p.Method && covers(c) {
				found = i
				break
			}
		}
		if found < 0 {
			// Name the nearest decision: one with the method.
			for i, c := range ex.checks {
				if !used[i] && (c.Outcome == proxy.Pass || c.Outcome == proxy.Allowed) && c.Method == p.Method {
					found = i
					break
				}
			}
		}
		if found < 0 {
			bad = append(bad, fmt.Sprintf("the upstream parsed %s %q (handler %q) and the sidecar decided no such request: unchecked",
				p.Method, p.Path, p.Handler))
			continue
		}
		used[found] = true
		c := ex.checks[found]
		if routed(p.Handler) {
			i := slices.Index(c.Rules, "d."+p.Handler)
			if i < 0 {
				bad = append(bad, fmt.Sprintf("the upstream routed %s %q to handler %q; the sidecar decided %s %q under rules %v",
					p.Method, p.Path, p.Handler, c.Method, c.Path, c.Rules))
				continue
			}
			if p.Handler == "keyed" {
				if !wantOK || c.Keys[i] != want {
					bad = append(bad, fmt.Sprintf("the upstream read X-Api-Key %q (present %v) and the sidecar counted another key", p.Key, p.HasKey))
				}
			}
		}
		for _, r := range c.Rules {
			if r != "d."+p.Handler {
				run.stats.Stricter++
				break
			}
		}
	}
	for _, m := range diffIDs.FindAllSubmatch(ex.answer, -1) {
		if !ids[string(m[1])] {
			bad = append(bad, fmt.Sprintf("the connection received the answer to request %s, which is not one it sent", m[1]))
		}
	}
	return bad
}

// routed reports whether a handler is one a rule counts.
func routed(handler string) bool {
	switch handler {
	case "", "other", "end":
		return false
	}
	return true
}

// one runs a case and fails t on any mismatch.
func (run *diffRun) one(t testing.TB, name string, raw []byte) {
	ex := run.exchange(t, raw)
	run.stats.Cases++
	for _, p := range ex.parses {
		// Neither the sentinel nor what an upstream refused unread.
		if p.Handler != "end" && p.Method != "" {
			run.stats.Parsed++
		}
	}
	if len(ex.parses) == 0 {
		run.stats.Refused++
	}
	if bad := run.check(t, ex); len(bad) > 0 {
		t.Errorf("%s, %s: %s\n  sent:     %q\n  answered: %q (cut by the client's deadline: %v)\n  decided:  %+v\n  parsed:   %+v",
			run.up.name, name, strings.Join(bad, "\n  "), ex.sent, clip(ex.answer, 2000), ex.timeout, ex.checks, ex.parses)
	}
}

func clip(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// readCorpus reads testdata/differential/corpus.txt: a case per line, its
// name, a tab and the request as a Go string literal.
func readCorpus(t testing.TB) [][2]string {
	b, err := os.ReadFile(filepath.Join("testdata", "differential", "corpus.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var cases [][2]string
	for n, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, lit, ok := strings.Cut(line, "\t")
		raw, err := strconv.Unquote(strings.TrimSpace(lit))
		if !ok || err != nil {
			t.Fatalf("corpus.txt:%d: want a name, a tab and a quoted request: %v", n+1, err)
		}
		cases = append(cases, [2]string{name, raw})
	}
	return cases
}

// TestDifferential runs the corpus and the generated requests through
// both fronts in front of each upstream.
func TestDifferential(t *testing.T) {
	t.Parallel()
	corpus := readCorpus(t)
	var mu sync.Mutex
	report := map[string]diffStats{}
	versions := map[string]string{}
	for _, u := range diffUpstreams {
		for _, f := range diffFronts {
			t.Run(u.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				run := startDiffRun(t, u.start(t), f.args)
				for _, c := range corpus {
					run.one(t, "corpus case "+c[0], []byte(c[1]))
				}
				corpusStats := run.stats
				rng := rand.New(rand.NewPCG(*diffSeed, 0))
				for i := range *diffCases {
					g := newGen(rng)
					run.one(t, fmt.Sprintf("generated case %d (seed %d)", i, *diffSeed), g.request())
				}
				t.Logf("%s behind the %s front: %d corpus cases, %d generated; the upstream parsed %d requests, %d cases were refused whole, %d decisions counted a rule besides the route's",
					run.up.version, f.name, corpusStats.Cases, run.stats.Cases-corpusStats.Cases, run.stats.Parsed, run.stats.Refused, run.stats.Stricter)
				mu.Lock()
				report[u.name+" | "+f.name] = run.stats
				versions[u.name] = run.up.version
				mu.Unlock()
			})
		}
	}
	t.Cleanup(func() {
		if !*diffReport || t.Failed() {
			return
		}
		var b strings.Builder
		fmt.Fprintf(&b, "# Differential harness: cases by upstream\n\n"+
			"Written by `go test ./sidecar/runner -run TestDifferential -args -differential.report`: "+
			"the corpus (%d cases) and %d generated requests (seed %d) through each front in front of each upstream. "+
			"0 mismatches: every request an upstream parsed was decided by the sidecar with the same method, "+
			"counted by the rule of the handler it reached, under the key the upstream reads, "+
			"and every answer reached the connection that asked.\n\n", len(corpus), *diffCases, *diffSeed)
		b.WriteString("| upstream | version | front | cases | requests the upstream parsed | cases it parsed nothing of (refused by the sidecar or by it) | decisions that counted a rule besides the route's |\n|---|---|---|---|---|---|---|\n")
		keys := make([]string, 0, len(report))
		for k := range report {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			s := report[k]
			up, front, _ := strings.Cut(k, " | ")
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %d |\n", up, versions[up], front, s.Cases, s.Parsed, s.Refused, s.Stricter)
		}
		if err := os.WriteFile(filepath.Join("testdata", "differential", "report.md"), []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	})
}
