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
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// attempt is one request a Transport sent: when it left and when its
// answer arrived, and the answer's status and Retry-After.
type attempt struct {
	sent, back time.Time
	status     int
	retryAfter string
}

// counting records the attempts a Transport makes.
type counting struct {
	base http.RoundTripper
	mu   sync.Mutex
	log  []attempt
	last http.Header // the last answer's header
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	sent := time.Now()
	resp, err := c.base.RoundTrip(r)
	if err == nil {
		a := attempt{sent: sent, back: time.Now(), status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
		c.mu.Lock()
		c.log = append(c.log, a)
		c.last = resp.Header.Clone()
		c.mu.Unlock()
	}
	return resp, err
}

func (c *counting) count(code int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.log {
		if a.status == code {
			n++
		}
	}
	return n
}

func (c *counting) attempts() []attempt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]attempt(nil), c.log...)
}

// waitedOut checks that the attempt after a denial left no sooner than
// the denial's Retry-After after the denial arrived, and was admitted.
func waitedOut(t *testing.T, denied, retry attempt) {
	t.Helper()
	secs, err := strconv.Atoi(denied.retryAfter)
	if err != nil || secs < 1 {
		t.Fatalf("the sidecar's 429 had Retry-After %q, want whole seconds, at least 1", denied.retryAfter)
	}
	if w, ra := retry.sent.Sub(denied.back), time.Duration(secs)*time.Second; w < ra {
		t.Errorf("the retry left %v after the 429 arrived, want at least its Retry-After of %v", w, ra)
	}
	if retry.status != http.StatusOK {
		t.Errorf("the retry after the Retry-After was answered %d, want 200", retry.status)
	}
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

	// The key has 2 and one more a second: GETs in a row find it empty
	// within a few (however slow they are, they are not one a second
	// for long). The one the sidecar denies is waited out and retried,
	// and the caller gets the retry's 200.
	gets := 0
	for attempts.count(http.StatusTooManyRequests) == 0 {
		if gets == 20 {
			t.Fatalf("the sidecar denied none of %d GETs in a row (limit 2 per 2s)", gets)
		}
		if code := get(t, hc, s.URL+"/api", "alice"); code != http.StatusOK {
			t.Fatalf("GET %d: status %d, want 200 after waiting out any 429", gets, code)
		}
		gets++
	}
	log := attempts.attempts()
	if got, want := len(log), gets+1; got != want {
		t.Fatalf("%d attempts for %d GETs, want %d: one 429, then a retry after Retry-After", got, gets, want)
	}
	if d := log[len(log)-2]; d.status != http.StatusTooManyRequests {
		t.Fatalf("the next-to-last attempt was answered %d, want the 429 that the last one retried", d.status)
	}
	waitedOut(t, log[len(log)-2], log[len(log)-1])
	t.Logf("the sidecar denied GET %d with Retry-After %s; the retry left %v after the 429", gets, log[len(log)-2].retryAfter,
		log[len(log)-1].sent.Sub(log[len(log)-2].back))
	if got, want := b.hits.Load(), int64(gets); got != want {
		t.Errorf("the application received %d requests, want %d: every GET once, the 429 never", got, want)
	}

	// A POST is answered the 429 itself: POSTs in a row find the key empty
	// (the retry above took its last unit) and none is retried.
	posts, denied := 0, false
	for !denied {
		if posts == 20 {
			t.Fatalf("the sidecar denied none of %d POSTs in a row (limit 2 per 2s)", posts)
		}
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/api", strings.NewReader("order"))
		req.Header.Set("X-API-Key", "alice")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		posts++
		if resp.StatusCode == http.StatusTooManyRequests {
			denied = true
			if got := resp.Header.Get("Retry-After"); got == "" {
				t.Error("POST: the 429 reached the caller without its Retry-After")
			}
		} else if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %d: status %d, want 200 or the 429", posts, resp.StatusCode)
		}
	}
	if got, want := len(attempts.attempts())-len(log), posts; got != want {
		t.Errorf("%d attempts for %d POSTs, want %d: a POST is not retried", got, posts, want)
	}
}

func TestPacedTransportStaysUnderTheSidecarsLimit(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	s := startSidecar(t, limitPolicy(20, "1s"), b.URL)
	attempts := &counting{base: http.DefaultTransport}
	tr := client.NewTransport(client.Options{Base: attempts, Pace: true})
	hc := &http.Client{Transport: tr}
	// As fast as it can, 60 requests: the burst of 20 and then at most
	// 20 a second, so at least 2s, over which the pacer learns the limit
	// from the sidecar's fields and spaces the requests. How close to the
	// limit and how rarely denied is a figure of the machine's speed:
	// floodgate-clientbench measures it (-clients 1 -limit 20); the
	// pacer's control loop is TestPacerSharesALimit's, on simulated time.
	const n = 60
	start := time.Now()
	for i := range n {
		if code := get(t, hc, s.URL+"/api", "alice"); code != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200 after waiting out any 429", i, code)
		}
	}
	elapsed := time.Since(start)
	denied := attempts.count(http.StatusTooManyRequests)
	t.Logf("%d requests in %v (%.1f/s), %d answered 429 on the way", n, elapsed, n/elapsed.Seconds(), denied)
	if got, want := b.hits.Load(), int64(n); got != want {
		t.Errorf("the application received %d requests, want %d", got, want)
	}
	// What the pacer learns from: the sidecar's own fields.
	attempts.mu.Lock()
	f := client.ParseFields(attempts.last, time.Now())
	attempts.mu.Unlock()
	if f.Name != `shop.per-key` || f.Quota != 20 || f.Window != time.Second || !f.Known() {
		t.Errorf("the sidecar's answer reads as %+v, want shop.per-key, 20 per 1s and what remains", f)
	}
	// The pacer paces: a spacing is set, and it is no shorter than the
	// fastest it ever aims at for 20/s (1.5 x the rate, when the limit is
	// full) or than a unit of it after a denial: 1s/30. A pacer that
	// misread the limit as larger would space less.
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	if iv := tr.Pacer(u.Host).Interval(); iv < time.Second/30 {
		t.Errorf("the pacer's spacing is %v after %d answers of a 20/s limit, want at least %v", iv, n, time.Second/30)
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

	// The attempts the interceptors make, as an interceptor inside
	// theirs sees them.
	type call struct {
		sent, back time.Time
		code       codes.Code
		msg        string
		pushback   time.Duration
	}
	var mu sync.Mutex
	var calls []call
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var trailer metadata.MD
		c := call{sent: time.Now()}
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Trailer(&trailer))...)
		c.back, c.code = time.Now(), status.Code(err)
		if st, ok := status.FromError(err); ok {
			c.msg = st.Message()
		}
		if v := trailer.Get(grpcclient.PushbackKey); len(v) > 0 {
			if ms, perr := strconv.Atoi(v[0]); perr == nil {
				c.pushback = time.Duration(ms) * time.Millisecond
			}
		}
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
		return err
	}
	attempts := func() []call {
		mu.Lock()
		defer mu.Unlock()
		return append([]call(nil), calls...)
	}
	// waited checks that attempt i was retried, after at least the
	// interceptors' wait on its pushback (Rand 0.5: the pushback plus
	// half of twice it, capped at 5s), counted from its answer's arrival.
	waited := func(cs []call, i int) {
		t.Helper()
		if i+1 >= len(cs) {
			t.Fatalf("attempt %d (%v %q) was not retried", i, cs[i].code, cs[i].msg)
		}
		p := cs[i].pushback
		want := p + min(p, 2500*time.Millisecond)
		if w := cs[i+1].sent.Sub(cs[i].back); w < want {
			t.Errorf("attempt %d was retried %v after its %v pushback arrived, want at least %v", i, w, p, want)
		}
	}

	in := grpcclient.New(grpcclient.Options{Idempotent: func(string) bool { return true },
		BaseDelay: 300 * time.Millisecond, MaxDelay: time.Second, MaxRetries: 12, Rand: func() float64 { return 0.5 }})
	cc, err := grpc.NewClient(strings.TrimPrefix(s.URL, "http://"),
		append(in.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(record))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	hc := healthpb.NewHealthClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "alice")

	// The application's RESOURCE_EXHAUSTED, through the sidecar, is
	// retried after its pushback (400ms, plus half of twice that).
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	cs := attempts()
	if len(cs) != 2 || cs[0].code != codes.ResourceExhausted || cs[0].pushback != 400*time.Millisecond || cs[1].code != codes.OK {
		t.Fatalf("first call's attempts %+v, want the application's RESOURCE_EXHAUSTED with its 400ms pushback, then OK", cs)
	}
	waited(cs, 0)

	// That spent the key's two calls, and one comes back every 5s: calls
	// in a row find it empty within a few. The sidecar denies one as a
	// gRPC error, RESOURCE_EXHAUSTED with grpc-retry-pushback-ms, and it
	// is retried after the pushback, when the key has room again.
	ok := 1
	for {
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d, denied by the sidecar then retried: %v", ok+1, err)
		}
		ok++
		if slices.ContainsFunc(attempts()[2:], func(c call) bool { return c.code != codes.OK }) {
			break
		}
		if ok == 20 {
			t.Fatalf("the sidecar denied none of %d calls in a row (limit 2 per 10s)", ok)
		}
	}
	cs = attempts()
	d := len(cs) - 2
	if c := cs[d]; c.code != codes.ResourceExhausted || !strings.Contains(c.msg, "rate limit") || c.pushback <= 0 {
		t.Fatalf("attempt %d: %v %q with pushback %v, want the sidecar's RESOURCE_EXHAUSTED with a pushback", d, c.code, c.msg, c.pushback)
	}
	waited(cs, d)
	t.Logf("the sidecar denied call %d with a pushback of %v; retried %v after it arrived", ok, cs[d].pushback, cs[d+1].sent.Sub(cs[d].back))
	if got, want := h.calls.Load(), int64(ok+1); got != want {
		t.Errorf("the application received %d calls, want %d: none of the sidecar's denials reach it", got, want)
	}

	// Without the interceptors, the same denial is an error: calls in a
	// row find the key empty again (the retry took its last unit).
	raw, err := grpc.NewClient(strings.TrimPrefix(s.URL, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	for i := 0; ; i++ {
		_, err = healthpb.NewHealthClient(raw).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			break
		}
		if i == 20 {
			t.Fatalf("a plain client: the sidecar denied none of %d calls in a row", i)
		}
	}
	if got, want := status.Code(err), codes.ResourceExhausted; got != want || !strings.Contains(err.Error(), "rate limit") {
		t.Errorf("a plain client got %v, want the sidecar's RESOURCE_EXHAUSTED", err)
	}
}
