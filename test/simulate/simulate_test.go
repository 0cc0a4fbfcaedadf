// Package simulate checks that kubectl floodgate simulate agrees with a
// real floodgate-sidecar: one request trace, replayed through the plugin's
// simulation and through a sidecar process (memory store) whose clock the
// test moves to each request's instant (a build with the
// floodgate_debugclock tag), must get identical answers.
package simulate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/app"
	"github.com/floodgate-dev/floodgate/sidecar/runner"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

// policy has rules of every algorithm, several rules on one request
// (tightest wins), a cost header, a key read through trusted proxies, a
// shadow rule, a rule that rejects requests without its key, and one that
// delays instead of denying.
const policy = `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: shop, namespace: agree}
spec:
  podSelector: {matchLabels: {app: shop}}
  trustedProxies: {cidrs: [127.0.0.0/8]}
  rules:
  - name: per-key
    match: {path: {type: Prefix, value: /api/}}
    key: [{header: X-API-Key}]
    limit: {requests: 5, per: 10s, burst: 5}
  - name: quota
    match: {path: {type: Prefix, value: /api/}}
    key: [{header: X-API-Key}]
    limit: {requests: 12, per: 1m, algorithm: FixedWindow}
    cost: {fromHeader: X-Cost, default: 1, max: 4}
  - name: login
    match: {path: {type: Exact, value: /login}, methods: [POST]}
    key: [{clientIP: {}}]
    limit: {requests: 3, per: 10s, algorithm: SlidingWindow}
  - name: search
    match: {path: {type: RegularExpression, value: "/search(/.*)?"}}
    key: [{query: tenant}]
    onMissingKey: Shared
    limit: {requests: 2, per: 1s, burst: 4, algorithm: GCRA}
  - name: export
    match: {path: {type: Prefix, value: /export}}
    key: [{method: {}}, {path: {}}]
    limit: {requests: 2, per: 5s, algorithm: SlidingLog}
  - name: tenant
    match: {path: {type: Prefix, value: /tenant}}
    key: [{header: X-Tenant}]
    onMissingKey: Reject
    limit: {requests: 3, per: 2s}
  - name: smooth
    match: {path: {type: Prefix, value: /smooth}}
    key: [{header: X-API-Key}]
    limit: {requests: 4, per: 1s, onExceed: Delay, maxDelay: 500ms, delayAfter: 1}
  - name: trial
    mode: Shadow
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 10s}
`

var start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// traceLines is a seeded random trace: bursts at one instant, gaps of up
// to 0.6s, keys that come and go.
func traceLines(n int) string {
	rng := rand.New(rand.NewPCG(24, 2026))
	keys := []string{"alice", "bob", "carol"}
	clients := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	var b strings.Builder
	b.WriteString("# time method path fields\n")
	at := time.Duration(0)
	for range n {
		if rng.IntN(3) > 0 {
			at += time.Duration(rng.Int64N(int64(600 * time.Millisecond)))
		}
		xff := "X-Forwarded-For:" + clients[rng.IntN(len(clients))]
		var line string
		switch rng.IntN(9) {
		case 7, 8:
			line = fmt.Sprintf("GET /smooth/x X-API-Key:%s %s", keys[rng.IntN(2)], xff)
		case 0, 1:
			line = fmt.Sprintf("GET /api/orders X-API-Key:%s %s", keys[rng.IntN(len(keys))], xff)
			if rng.IntN(3) == 0 {
				line += fmt.Sprintf(" X-Cost:%d", rng.IntN(6)) // 0 and 5 are refused
			}
		case 2:
			line = "GET /api/orders " + xff // no key: per-key and quota skip it
		case 3:
			line = "POST /login " + xff
		case 4:
			q := []string{"?tenant=a", "?tenant=b", ""}[rng.IntN(3)]
			line = "GET /search/items" + q + " " + xff
		case 5:
			line = []string{"GET", "DELETE"}[rng.IntN(2)] + " /export/" + []string{"a", "b"}[rng.IntN(2)] + " " + xff
		default:
			line = "GET /tenant/x " + xff
			if rng.IntN(2) == 0 {
				line += " X-Tenant:" + keys[rng.IntN(len(keys))]
			}
		}
		fmt.Fprintf(&b, "%s %s\n", at, line)
	}
	return b.String()
}

func build(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, out)
	}
}

// sidecar is a floodgate-sidecar process with a manual clock.
type sidecar struct{ *simnode.Standalone }

func startSidecar(t *testing.T, bin, policyFile, upstream string) *sidecar {
	t.Helper()
	s, err := simnode.StartStandalone(context.Background(), bin, t.TempDir(),
		"--policy-file", policyFile, "--store", "memory", "--upstream", upstream, "--pod-labels", "app=shop",
		"--debug-manual-clock", start.Format(time.RFC3339Nano))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(5 * time.Second) })
	return &sidecar{s}
}

func (s *sidecar) setClock(t *testing.T, at time.Time) {
	t.Helper()
	resp, err := http.Post(s.AdminURL+"/debug/clock?set="+url.QueryEscape(at.Format(time.RFC3339Nano)), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("moving the clock: %s: %s", resp.Status, body)
	}
}

// TestSimulateAgreesWithASidecar replays one trace through kubectl
// floodgate simulate and through a real sidecar on a clock moved to each
// request's instant, and requires identical answers.
func TestSimulateAgreesWithASidecar(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	build(t, "-o", filepath.Join(bin, "kubectl-floodgate"), "./cmd/kubectl-floodgate")
	build(t, "-tags", runner.DebugClockTag, "-o", filepath.Join(bin, "floodgate-sidecar"), "./cmd/floodgate-sidecar")

	policyFile := filepath.Join(dir, "policy.yaml")
	traceFile := filepath.Join(dir, "trace.txt")
	configFile := filepath.Join(dir, "sidecar.json")
	if err := os.WriteFile(policyFile, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(traceFile, []byte(traceLines(400)), 0o600); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(filepath.Join(bin, "kubectl-floodgate"), "simulate", policyFile, "--requests", traceFile,
		"--start", start.Format(time.RFC3339), "--pod-labels", "app=shop", "--write-config", configFile, "-o", "json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl floodgate simulate: %v\n%s", err, stderr.String())
	}
	var rep app.SimulateReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if got, want := len(rep.Decisions), 400; got != want {
		t.Fatalf("simulate decided %d requests, want %d", got, want)
	}

	var reached atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	defer backend.Close()
	sc := startSidecar(t, filepath.Join(bin, "floodgate-sidecar"), configFile, backend.URL)

	outcomes := map[string]int{}
	rules := map[string]int{}
	hc := &http.Client{Timeout: 10 * time.Second}
	for i, d := range rep.Decisions {
		sc.setClock(t, d.At)
		req, err := http.NewRequest(d.Method, sc.URL+d.Target, nil)
		if err != nil {
			t.Fatal(err)
		}
		for n, v := range d.Request {
			req.Header.Set(n, v)
		}
		before := reached.Load()
		sent := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		took := time.Since(sent)

		where := fmt.Sprintf("request %d (%s %s %v at +%v)", i, d.Method, d.Target, d.Request, d.At.Sub(start))
		if got, want := resp.StatusCode, d.Status; got != want {
			t.Errorf("%s: the sidecar answered %d, simulate %d (%s)", where, got, want, body)
		}
		if got, want := reached.Load() > before, d.Outcome == "allowed"; got != want {
			t.Errorf("%s: reached the application: sidecar %v, simulate %v", where, got, want)
		}
		for _, f := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit-Policy", "Ratelimit", "Retry-After"} {
			if got, want := resp.Header.Get(f), d.Headers[f]; got != want {
				t.Errorf("%s: %s: sidecar %q, simulate %q", where, f, got, want)
			}
		}
		if d.Outcome != "allowed" {
			var pb struct{ Detail string }
			if err := json.Unmarshal(body, &pb); err != nil || pb.Detail != d.Detail {
				t.Errorf("%s: problem detail: sidecar %q, simulate %q", where, pb.Detail, d.Detail)
			}
		}
		if d.Delay != "" {
			// The sidecar holds the request on a real timer for the
			// wait the simulation reports: never shorter.
			wait, err := time.ParseDuration(d.Delay)
			if err != nil {
				t.Fatalf("%s: delay %q: %v", where, d.Delay, err)
			}
			if took < wait {
				t.Errorf("%s: the sidecar answered in %v, before the simulated delay of %v", where, took, wait)
			}
			outcomes["delayed"]++
		}
		outcomes[d.Outcome]++
		rule, _, _ := strings.Cut(d.Headers["Ratelimit"], ";")
		rules[rule]++
	}
	t.Logf("replayed %d requests: outcomes %v, binding rules %v", len(rep.Decisions), outcomes, rules)
	// The trace must have exercised what it is meant to compare.
	for _, o := range []string{"allowed", "denied", "rejected", "delayed"} {
		if outcomes[o] == 0 {
			t.Errorf("no request was %s: the trace does not exercise it", o)
		}
	}
	for _, r := range []string{`"shop.per-key"`, `"shop.quota"`, `"shop.login"`, `"shop.search"`, `"shop.export"`, `"shop.tenant"`, `"shop.smooth"`} {
		if rules[r] == 0 {
			t.Errorf("rule %s never bound an answer: the trace does not exercise it", r)
		}
	}
}
