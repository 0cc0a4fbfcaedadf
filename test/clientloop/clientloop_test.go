// Package clientloop tests floodgate's Go client (module
// github.com/floodgate-dev/floodgate/client) and its gRPC interceptors
// against a real floodgate-sidecar process: the answers they handle are
// the sidecar's own 429s, Retry-After and RateLimit fields.
package clientloop

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/client"
	"github.com/floodgate-dev/floodgate/client/grpcclient"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

var sidecarBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "clientloop")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	sidecarBin, err = simnode.BuildSidecar(context.Background(), filepath.Join("..", ".."), dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// startSidecar runs a sidecar with policy (a sidecar config) in front of
// upstream.
func startSidecar(t *testing.T, policy, upstream string, args ...string) *simnode.Standalone {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(file, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := simnode.StartStandalone(context.Background(), sidecarBin, dir,
		append([]string{"--policy-file", file, "--store", "memory", "--upstream", upstream}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(5 * time.Second) })
	return s
}

// limitPolicy limits each X-API-Key to requests per period.
func limitPolicy(requests int, per string) string {
	return fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: shop
  uid: shop-1
  rules:
  - name: per-key
    key: [{header: X-API-Key}]
    limit: {requests: %d, per: %s}
`, requests, per)
}

// backend is the application; it counts what reaches it.
type backend struct {
	*httptest.Server
	hits atomic.Int64
}

func newBackend(t *testing.T) *backend {
	b := &backend{}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(b.Close)
	return b
}

// counting counts the attempts a Transport makes, by status.
type counting struct {
	base http.RoundTripper
	mu   sync.Mutex
	n    map[int]int
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	if err == nil {
		c.mu.Lock()
		if c.n == nil {
			c.n = map[int]int{}
		}
		c.n[resp.StatusCode]++
		c.mu.Unlock()
	}
	return resp, err
}

func (c *counting) count(code int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[code]
}

func get(t *testing.T, hc *http.Client, url, key string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

func TestTransportWaitsOutTheSidecarsRetryAfter(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	s := startSidecar(t, limitPolicy(2, "2s"), b.URL)
	attempts := &counting{base: http.DefaultTransport}
	hc := &http.Client{Transport: client.NewTransport(client.Options{Base: attempts, MaxJitter: time.Millisecond})}

	for range 2 {
		if code := get(t, hc, s.URL+"/api", "alice"); code != http.StatusOK {
			t.Fatalf("status %d, want 200", code)
		}
	}
	start := time.Now()
	if code := get(t, hc, s.URL+"/api", "alice"); code != http.StatusOK {
		t.Fatalf("the third request: status %d, want 200 after waiting out the 429", code)
	}
	if e := time.Since(start); e < time.Second {
		t.Errorf("the third request took %v: it did not wait for the sidecar's Retry-After (1s)", e)
	}
	if got, want := attempts.count(http.StatusTooManyRequests), 1; got != want {
		t.Errorf("the sidecar answered %d 429s, want %d: one, then a retry after Retry-After", got, want)
	}
	if got, want := b.hits.Load(), int64(3); got != want {
		t.Errorf("the application received %d requests, want %d", got, want)
	}

	// A POST is answered the 429 itself.
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/api", strings.NewReader("order"))
	req.Header.Set("X-API-Key", "alice")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if got, want := resp.StatusCode, http.StatusTooManyRequests; got != want {
		t.Errorf("POST: status %d, want %d: not retried", got, want)
	}
	if got := resp.Header.Get("Retry-After"); got == "" {
		t.Error("POST: the 429 reached the caller without its Retry-After")
	}
}

func TestPacedTransportStaysUnderTheSidecarsLimit(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	s := startSidecar(t, limitPolicy(20, "1s"), b.URL)
	attempts := &counting{base: http.DefaultTransport}
	hc := &http.Client{Transport: client.NewTransport(client.Options{Base: attempts, Pace: true})}
	// As fast as it can for 4s: the pacer learns the limit from the
	// sidecar's fields and spaces the requests.
	end := time.Now().Add(4 * time.Second)
	n := 0
	for time.Now().Before(end) {
		if code := get(t, hc, s.URL+"/api", "alice"); code != http.StatusOK {
			t.Fatalf("request %d: status %d", n, code)
		}
		n++
	}
	denied := attempts.count(http.StatusTooManyRequests)
	t.Logf("%d requests in 4s, %d answered 429 on the way", n, denied)
	if rate := float64(n) / 4; rate < 15 || rate > 30 {
		t.Errorf("%.1f requests/s, want about the limit of 20/s (its burst of 20 on top)", rate)
	}
	if denied > 2 {
		t.Errorf("the sidecar answered %d 429s, want at most 2: the pacer spaces requests before they are denied", denied)
	}
}

// healthServer is a gRPC application that answers its first call with
// RESOURCE_EXHAUSTED and a pushback trailer, as a service with its own
// quota would.
type healthServer struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
}

func (h *healthServer) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if h.calls.Add(1) == 1 {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(grpcclient.PushbackKey, "400"))
		return nil, status.Error(codes.ResourceExhausted, "the application's own quota")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func TestGRPCInterceptorsBehindTheSidecar(t *testing.T) {
	t.Parallel()
	h := &healthServer{}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	// The sidecar limits each x-api-key to 2 calls per 10s (one more every
	// 5s), in front of the gRPC application (h2c upstream).
	s := startSidecar(t, limitPolicy(2, "10s"), "http://"+ln.Addr().String(), "--upstream-h2c")

	in := grpcclient.New(grpcclient.Options{Idempotent: func(string) bool { return true },
		BaseDelay: 300 * time.Millisecond, MaxDelay: time.Second, MaxRetries: 12, Rand: func() float64 { return 0.5 }})
	cc, err := grpc.NewClient(strings.TrimPrefix(s.URL, "http://"),
		append(in.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	hc := healthpb.NewHealthClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "alice")

	// The application's RESOURCE_EXHAUSTED, through the sidecar, is
	// retried after its pushback (400ms, plus half of twice that).
	start := time.Now()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if e := time.Since(start); e < 800*time.Millisecond {
		t.Errorf("the first call took %v: it did not wait the application's pushback", e)
	}
	// That spent the key's two calls. The sidecar denies the next as a
	// gRPC error, RESOURCE_EXHAUSTED with grpc-retry-pushback-ms: retried
	// after the pushback, when the key has room again, about 4s later.
	start = time.Now()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("second call, denied by the sidecar then retried: %v", err)
	}
	if e := time.Since(start); e < 3*time.Second {
		t.Errorf("the denied call succeeded after %v: it was not denied, or not backed off", e)
	}
	if got, want := h.calls.Load(), int64(3); got != want {
		t.Errorf("the application received %d calls, want %d: none of the sidecar's denials reach it", got, want)
	}

	// Without the interceptors, the same denial is an error.
	raw, err := grpc.NewClient(strings.TrimPrefix(s.URL, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	_, err = healthpb.NewHealthClient(raw).Check(ctx, &healthpb.HealthCheckRequest{})
	if got, want := status.Code(err), codes.ResourceExhausted; got != want || !strings.Contains(err.Error(), "rate limit") {
		t.Errorf("a plain client got %v, want the sidecar's RESOURCE_EXHAUSTED", err)
	}
}
