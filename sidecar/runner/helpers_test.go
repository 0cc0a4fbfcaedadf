package runner

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// backend is the application behind the sidecar: it counts the requests
// that reach it and echoes what the tests inspect.
type backend struct {
	*httptest.Server
	hits atomic.Int64
}

func newBackend(t *testing.T, h http.HandlerFunc) *backend {
	t.Helper()
	b := &backend{}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("X-Seen-Host", r.Host)
		w.Header().Set("X-Seen-XFF", r.Header.Get("X-Forwarded-For"))
		_, _ = io.WriteString(w, "hello")
	}))
	t.Cleanup(b.Close)
	return b
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// sidecar is a running floodgate-sidecar on loopback.
type sidecar struct {
	*Runner
	policy string
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
	url    string
	admin  string
}

// startSidecar writes policy to a file and runs a sidecar on it in front of
// upstream. waitReady waits for /readyz.
func startSidecar(t *testing.T, upstream, policy string, waitReady bool, args ...string) *sidecar {
	t.Helper()
	return startSidecarOn(t, nil, upstream, policy, waitReady, args...)
}

// frozen is a clock that stands still in the middle of a minute and of an
// hour: windows of a minute or an hour that a test's requests fall in
// never roll over under them, and buckets never refill, however long a
// busy machine takes to send them.
func frozen() time.Time { return time.Date(2030, 1, 1, 12, 30, 30, 0, time.UTC) }

// startSidecarOn is startSidecar with the memory store, the fallback
// buckets and the engine deciding on clock, as a debugging build's
// --debug-manual-clock makes them (clock.go); nil is the wall clock.
func startSidecarOn(t *testing.T, clock func() time.Time, upstream, policy string, waitReady bool, args ...string) *sidecar {
	t.Helper()
	return startSidecarWith(t, clock, nil, upstream, policy, waitReady, args...)
}

// startSidecarWith is startSidecarOn with setup, when not nil, called on
// the Runner before it runs.
func startSidecarWith(t testing.TB, clock func() time.Time, setup func(*Runner), upstream, policy string, waitReady bool, args ...string) *sidecar {
	t.Helper()
	dir := t.TempDir()
	pf := filepath.Join(dir, "policy.yaml")
	if policy != "" {
		writeAtomic(t, pf, policy)
	}
	var cfg Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	all := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--upstream", upstream,
		"--policy-file", pf, "--policy-poll-interval", "20ms", "--drain-timeout", "5s"}, args...)
	if err := cfg.Parse(fs, all, func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: LogLevel(cfg.LogLevel)}))
	r, err := New(cfg, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if clock != nil {
		r.clock = clock
	}
	if setup != nil {
		setup(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &sidecar{Runner: r, policy: pf, logs: logs, cancel: cancel, done: make(chan error, 1),
		url: "http://" + r.ProxyAddr(), admin: "http://" + r.AdminAddr()}
	go func() { s.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		if err := s.stop(t); err != nil {
			t.Errorf("sidecar stopped with an error: %v", err)
		}
		if t.Failed() {
			t.Logf("sidecar logs:\n%s", logs.String())
		}
	})
	if waitReady {
		s.waitReady(t)
	}
	return s
}

func (s *sidecar) stop(t testing.TB) error {
	t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err
		return err
	case <-time.After(15 * time.Second):
		t.Fatal("sidecar did not stop")
		return nil
	}
}

func (s *sidecar) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if s.Ready() {
			if res, err := http.Get(s.admin + "/readyz"); err == nil {
				_ = res.Body.Close()
				if res.StatusCode == 200 {
					return
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("sidecar not ready; logs:\n%s", s.logs.String())
}

// waitRevision waits until the config with the given revision is in force.
func (s *sidecar) waitRevision(t *testing.T, rev string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if s.Status().Revision == rev {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("revision %q never applied; status %+v", rev, s.Status())
}

// waitError waits until /debug/config reports an error containing substr.
func (s *sidecar) waitError(t *testing.T, substr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Contains(s.Status().LastError, substr) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("error %q never reported; status %+v", substr, s.Status())
}

// metricsText returns the sidecar's /metrics.
func (s *sidecar) metricsText(t *testing.T) string {
	t.Helper()
	res, err := http.Get(s.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// metric returns the value of one sample of /metrics, e.g.
// `floodgate_sidecar_decisions_total{policy="p",result="denied",rule="r"}`.
func (s *sidecar) metric(t *testing.T, sample string) float64 {
	t.Helper()
	for _, line := range strings.Split(s.metricsText(t), "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err != nil {
				t.Fatalf("parse %q: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// writeAtomic replaces path the way editors and ConfigMap volumes do: write
// a temporary file, then rename it over the old one.
func writeAtomic(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// get sends a GET through the sidecar with the given headers.
func get(t *testing.T, c *http.Client, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(body)
}

// policyDoc returns a one-policy, one-rule config.
func policyDoc(rev, rule string) string {
	return fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
revision: %q
policies:
- name: p
  uid: uid-p
  rules:
  - name: r
%s
`, rev, indent(rule, "    "))
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}
