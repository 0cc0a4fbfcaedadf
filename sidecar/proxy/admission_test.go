package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/proxy"
	"github.com/floodgate-dev/floodgate/sidecar/proxy/lean"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// backend is an application whose requests wait until the test lets them
// answer, and that counts its requests in flight.
type backend struct {
	srv      *http.Server
	addr     string
	release  chan struct{} // each receive lets one waiting request answer
	inFlight atomic.Int64
	peak     atomic.Int64
	seen     atomic.Int64
	gone     atomic.Int64 // requests whose client (the sidecar) went away

	mu       sync.Mutex
	arrivals []time.Time // when each /fast/ request arrived
}

func newBackend(t *testing.T) *backend {
	t.Helper()
	b := &backend{release: make(chan struct{})}
	mux := http.NewServeMux()
	enter := func() func() {
		b.seen.Add(1)
		n := b.inFlight.Add(1)
		for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
		}
		return func() { b.inFlight.Add(-1) }
	}
	mux.HandleFunc("/fast/", func(w http.ResponseWriter, r *http.Request) {
		defer enter()()
		b.mu.Lock()
		b.arrivals = append(b.arrivals, time.Now())
		b.mu.Unlock()
		_, _ = io.WriteString(w, "fast")
	})
	mux.HandleFunc("/slow/", func(w http.ResponseWriter, r *http.Request) {
		defer enter()()
		select {
		case <-b.release:
			_, _ = io.WriteString(w, "slow")
		case <-r.Context().Done():
			b.gone.Add(1)
		}
	})
	// /echo/ answers the request's body.
	mux.HandleFunc("/echo/", func(w http.ResponseWriter, r *http.Request) {
		defer enter()()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = w.Write(body)
	})
	// /stream/ answers its head at once and its body when released.
	mux.HandleFunc("/stream/", func(w http.ResponseWriter, r *http.Request) {
		defer enter()()
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "head;")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-b.release:
			_, _ = io.WriteString(w, "end")
		case <-r.Context().Done():
			b.gone.Add(1)
		}
	})
	// /ws/ switches protocols and echoes lines until the client closes.
	mux.HandleFunc("/ws/", func(w http.ResponseWriter, r *http.Request) {
		defer enter()()
		nc, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer func() { _ = nc.Close() }()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			_, _ = brw.WriteString(line)
			_ = brw.Flush()
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.addr = ln.Addr().String()
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = b.srv.Serve(ln) }()
	t.Cleanup(func() {
		close(b.release)
		_ = b.srv.Close()
	})
	return b
}

// letOne lets one waiting request answer.
func (b *backend) letOne(t *testing.T) {
	t.Helper()
	select {
	case b.release <- struct{}{}:
	case <-time.After(5 * time.Second):
		t.Fatal("no request waits at the backend")
	}
}

// waitSeen waits until the backend has received n requests in all.
func (b *backend) waitSeen(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for b.seen.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the backend has received %d requests, want %d", b.seen.Load(), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// slotStore is a memory store whose slot calls can be made to fail.
type slotStore struct {
	*memstore.Store
	fail atomic.Bool
}

func (s *slotStore) Acquire(ctx context.Context, req limiter.SlotRequest) (limiter.SlotDecision, string, error) {
	if s.fail.Load() {
		return limiter.SlotDecision{}, "shard", fmt.Errorf("refused: %w", limiter.ErrUnavailable)
	}
	return s.Store.Acquire(ctx, req)
}

// front is a sidecar front in front of a backend.
type front struct {
	name  string
	url   string
	p     *proxy.Proxy
	m     *metrics.Metrics
	store *slotStore
}

const admissionDoc = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-p
  %s
  rules:
  - name: slow
    match: {path: {type: Prefix, value: /slow}}
    key: [{header: X-Tenant}]
    concurrency: {max: 2}
  - name: stream
    match: {path: {type: Prefix, value: /stream}}
    key: [{header: X-Tenant}]
    concurrency: {max: 1}
  - name: ws
    match: {path: {type: Prefix, value: /ws}}
    key: [{header: X-Tenant}]
    concurrency: {max: 1}
  - name: closed
    match: {path: {type: Prefix, value: /slow/closed}}
    key: []
    concurrency: {max: 5}
    failureMode: Closed
  - name: rate
    match: {path: {type: Prefix, value: /slow/rated}}
    key: [{header: X-Tenant}]
    limit: {requests: 1, per: 1h}
  - name: critical
    match: {headers: [{name: X-Class, value: critical}]}
    priority: Critical
  - name: sheddable
    match: {headers: [{name: X-Class, value: sheddable}]}
    priority: Sheddable
`

// fronts starts the net/http front and the lean core, each with its own
// proxy, engine and stores, in front of b. shedding is the policy's
// loadShedding line, or "".
func fronts(t *testing.T, b *backend, shedding string) []*front {
	t.Helper()
	return frontsFor(t, b, fmt.Sprintf(admissionDoc, shedding))
}

// frontsFor is fronts with the config document doc.
func frontsFor(t *testing.T, b *backend, doc string) []*front {
	t.Helper()
	var out []*front
	for _, name := range []string{"net/http", "lean"} {
		f := &front{name: name}
		c, err := config.Load([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		f.m = metrics.NewMetrics(prometheus.NewRegistry())
		set, err := ruleset.Compile(c, labels.Set{}, f.m)
		if err != nil {
			t.Fatal(err)
		}
		ms, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		f.store = &slotStore{Store: ms}
		fb, err := memstore.New()
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(engine.Options{Store: f.store, Fallback: fb, Metrics: f.m})
		if err != nil {
			t.Fatal(err)
		}
		f.p, err = proxy.New(proxy.Options{Upstream: &url.URL{Scheme: "http", Host: b.addr}, Engine: e, Metrics: f.m,
			Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		f.p.SetRules(set)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		f.url = "http://" + ln.Addr().String()
		hs := &http.Server{Handler: f.p, ReadHeaderTimeout: 5 * time.Second}
		if name == "net/http" {
			go func() { _ = hs.Serve(ln) }()
			t.Cleanup(func() { _ = hs.Close() })
		} else {
			ls := lean.New(lean.Options{Upstream: b.addr, Proxy: func() *proxy.Proxy { return f.p },
				Log: slog.New(slog.DiscardHandler)})
			go func() { _ = hs.Serve(ls.Handoff()) }()
			go func() { _ = ls.Serve(ln) }()
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_ = ls.Shutdown(ctx)
				_ = hs.Close()
			})
		}
		out = append(out, f)
	}
	return out
}

func gauge(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// inFlight returns the rule's slots this front holds.
func (f *front) inFlight(t *testing.T, rule string) float64 {
	return gauge(t, f.m.ConcurrencyInFlight.WithLabelValues("p", rule))
}

// waitInFlight waits until the rule's slots held reach want.
func (f *front) waitInFlight(t *testing.T, rule string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.inFlight(t, rule) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s holds %v slots, want %v", f.name, rule, f.inFlight(t, rule), want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// reply is an answer read off a raw connection.
type reply struct {
	status int
	header http.Header
	body   string
}

// send writes a request on a new connection and returns the connection
// and a reader for its answer.
func send(t *testing.T, base, path string, hdr ...string) (net.Conn, *bufio.Reader) {
	t.Helper()
	u, _ := url.Parse(base)
	nc, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	// A request the sidecar never answers fails its test here rather than
	// holding the package until the test binary's timeout.
	if err := nc.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: test\r\n"
	for i := 0; i+1 < len(hdr); i += 2 {
		req += hdr[i] + ": " + hdr[i+1] + "\r\n"
	}
	if _, err := io.WriteString(nc, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	return nc, bufio.NewReader(nc)
}

func readReply(t *testing.T, br *bufio.Reader) reply {
	t.Helper()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	_ = res.Body.Close()
	return reply{status: res.StatusCode, header: res.Header, body: string(body)}
}

func do(t *testing.T, base, path string, hdr ...string) reply {
	t.Helper()
	_, br := send(t, base, path, hdr...)
	return readReply(t, br)
}

// A concurrency rule admits max requests of a key at once on both fronts;
// the next one gets 429 with Retry-After and no rate fields, and a slot
// comes back when a response body is complete.
func TestConcurrencyRuleOnBothFronts(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	for _, f := range fronts(t, b, "") {
		t.Run(f.name, func(t *testing.T) {
			replies := make(chan reply, 4)
			hold := func(tenant string) {
				_, br := send(t, f.url, "/slow/a", "X-Tenant", tenant)
				go func() { replies <- readReplyNoFail(br) }()
			}
			hold("acme")
			hold("acme")
			f.waitInFlight(t, "slow", 2)
			r := do(t, f.url, "/slow/a", "X-Tenant", "acme")
			if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" {
				t.Fatalf("third request: %d Retry-After %q, want 429 with Retry-After 1", r.status, r.header.Get("Retry-After"))
			}
			for _, h := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "Ratelimit", "Ratelimit-Policy"} {
				if v := r.header.Get(h); v != "" {
					t.Errorf("a concurrency denial carries %s: %q; it is no rate", h, v)
				}
			}
			var prob map[string]any
			if err := json.Unmarshal([]byte(r.body), &prob); err != nil || prob["type"] != proxy.ProblemConcurrencyLimited ||
				!strings.Contains(fmt.Sprint(prob["detail"]), "2 requests in flight, at most 2") {
				t.Errorf("problem body %s (%v)", r.body, err)
			}
			// The cap is per key.
			hold("other")
			f.waitInFlight(t, "slow", 3)
			// A complete response gives its slot back.
			b.letOne(t)
			if r := <-replies; r.status != http.StatusOK || r.body != "slow" {
				t.Fatalf("released request: %d %q", r.status, r.body)
			}
			f.waitInFlight(t, "slow", 2)
			b.letOne(t)
			b.letOne(t)
			for range 2 {
				<-replies
			}
			f.waitInFlight(t, "slow", 0)
			if p := b.peak.Load(); p > 3 {
				t.Errorf("the backend saw %d requests at once, want at most 3 (2 of acme, 1 of other)", p)
			}
		})
	}
}

// readReplyNoFail reads an answer, for a goroutine: a failure is a reply
// with status 0 and the error as its body.
func readReplyNoFail(br *bufio.Reader) reply {
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return reply{body: err.Error()}
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return reply{body: err.Error()}
	}
	return reply{status: res.StatusCode, header: res.Header, body: string(body)}
}

// A client that goes away gives its slot back at once, while the
// application is still working on its request, on both fronts.
func TestConcurrencySlotComesBackWhenTheClientGoes(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	for _, f := range fronts(t, b, "") {
		t.Run(f.name, func(t *testing.T) {
			gone, seen := b.gone.Load(), b.seen.Load()
			nc, _ := send(t, f.url, "/slow/a", "X-Tenant", "leaver")
			f.waitInFlight(t, "slow", 1)
			// The slot is taken before the request goes on: the client
			// leaves once the application has it, not while it is on
			// its way there (the application would never see it go).
			b.waitSeen(t, seen+1)
			_ = nc.Close()
			f.waitInFlight(t, "slow", 0)
			deadline := time.Now().Add(5 * time.Second)
			for b.gone.Load() == gone {
				if time.Now().After(deadline) {
					t.Fatal("the backend never saw its request cancelled")
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
}

// A streamed response holds its slot until its last byte; the shedder
// counts it in flight only until its head.
func TestConcurrencySlotHeldWhileTheBodyStreams(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	for _, f := range fronts(t, b, "loadShedding: {minLimit: 10, maxLimit: 10}") {
		t.Run(f.name, func(t *testing.T) {
			_, br := send(t, f.url, "/stream/x", "X-Tenant", "s")
			res, err := http.ReadResponse(br, nil)
			if err != nil || res.StatusCode != http.StatusOK {
				t.Fatalf("stream head: %v %v", res, err)
			}
			head := make([]byte, len("head;"))
			if _, err := io.ReadFull(res.Body, head); err != nil {
				t.Fatal(err)
			}
			if got := f.inFlight(t, "stream"); got != 1 {
				t.Errorf("slots held while the body streams = %v, want 1", got)
			}
			if r := do(t, f.url, "/stream/x", "X-Tenant", "s"); r.status != http.StatusTooManyRequests {
				t.Errorf("a second stream of the key: %d, want 429", r.status)
			}
			if _, in := f.p.Shedder().Current(); in != 0 {
				t.Errorf("the shedder counts %d in flight after the head, want 0", in)
			}
			b.letOne(t)
			rest, err := io.ReadAll(res.Body)
			if err != nil || string(rest) != "end" {
				t.Fatalf("stream end %q: %v", rest, err)
			}
			f.waitInFlight(t, "stream", 0)
		})
	}
}

// An upgraded connection (a WebSocket) holds its slot for as long as it is
// open; the lean core hands it to net/http, which holds it the same way.
func TestConcurrencySlotHeldWhileUpgraded(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	for _, f := range fronts(t, b, "") {
		t.Run(f.name, func(t *testing.T) {
			nc, br := send(t, f.url, "/ws/chat", "X-Tenant", "w", "Connection", "Upgrade", "Upgrade", "websocket")
			res, err := http.ReadResponse(br, nil)
			if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %v %v", res, err)
			}
			if _, err := io.WriteString(nc, "hello\n"); err != nil {
				t.Fatal(err)
			}
			if line, err := br.ReadString('\n'); err != nil || line != "hello\n" {
				t.Fatalf("echo %q: %v", line, err)
			}
			f.waitInFlight(t, "ws", 1)
			// The connection goes on carrying data after the switch, and
			// its slot stays taken meanwhile: a second line through it,
			// then a second upgrade of the key, refused.
			if _, err := io.WriteString(nc, "still there\n"); err != nil {
				t.Fatal(err)
			}
			if line, err := br.ReadString('\n'); err != nil || line != "still there\n" {
				t.Fatalf("echo %q: %v", line, err)
			}
			if got := f.inFlight(t, "ws"); got != 1 {
				t.Errorf("slots held while the upgraded connection is open = %v, want 1", got)
			}
			if r := do(t, f.url, "/ws/chat", "X-Tenant", "w", "Connection", "Upgrade", "Upgrade", "websocket"); r.status != http.StatusTooManyRequests {
				t.Errorf("a second upgrade of the key while the first is open: %d, want 429", r.status)
			}
			_ = nc.Close()
			f.waitInFlight(t, "ws", 0)
		})
	}
}

// A fail-closed concurrency rule whose store is unreachable answers 503;
// a rate rule that denies after the slots were taken gives them back.
func TestConcurrencyUnavailableAndRateDenial(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	for _, f := range fronts(t, b, "") {
		t.Run(f.name, func(t *testing.T) {
			f.store.fail.Store(true)
			r := do(t, f.url, "/slow/closed", "X-Tenant", "c")
			f.store.fail.Store(false)
			if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" || !strings.Contains(r.body, "fails closed") {
				t.Errorf("fail-closed rule with the store down: %d %q", r.status, r.body)
			}
			// The first request is allowed by the rate rule and waits; the
			// second is denied by it, after taking its slot, which it
			// gives back. The first has its slot before its rate decision:
			// the second goes only once the application has the first.
			seen := b.seen.Load()
			_, br := send(t, f.url, "/slow/rated", "X-Tenant", "r")
			b.waitSeen(t, seen+1)
			f.waitInFlight(t, "slow", 1)
			if r := do(t, f.url, "/slow/rated", "X-Tenant", "r"); r.status != http.StatusTooManyRequests || r.header.Get("Ratelimit-Policy") == "" {
				t.Errorf("rate-denied request: %d %v, want 429 with the rate fields", r.status, r.header)
			}
			if got := f.inFlight(t, "slow"); got != 1 {
				t.Errorf("slots held after a rate denial = %v, want 1", got)
			}
			b.letOne(t)
			_ = readReply(t, br)
			f.waitInFlight(t, "slow", 0)
		})
	}
}

// The shedder sheds by priority on both fronts: with a limit of 4 and
// reserves of 50% for Critical and 25% for Default, a Sheddable request is
// admitted while fewer than one request is in flight, a Default one while
// fewer than two are, and a Critical one while fewer than four Critical
// requests are, whatever the lower ones hold; the others get 503 with
// Retry-After (a Critical one after its brief wait) and never reach the
// application.
func TestShedderOnBothFronts(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	for _, f := range fronts(t, b, "loadShedding: {minLimit: 4, maxLimit: 4, reserved: {critical: 50, default: 25}}") {
		t.Run(f.name, func(t *testing.T) {
			seen := b.seen.Load()
			var readers []*bufio.Reader
			hold := func(class string) {
				_, br := send(t, f.url, "/slow/s", "X-Tenant", "t-"+class+fmt.Sprint(len(readers)), "X-Class", class)
				readers = append(readers, br)
			}
			waitBackend := func(n int64) {
				deadline := time.Now().Add(5 * time.Second)
				for b.seen.Load()-seen < n {
					if time.Now().After(deadline) {
						t.Fatalf("the backend saw %d requests, want %d", b.seen.Load()-seen, n)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
			shed := func(class string) {
				t.Helper()
				r := do(t, f.url, "/fast/x", "X-Class", class)
				if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" || !strings.Contains(r.body, proxy.ProblemOverloaded) {
					t.Errorf("%s request: %d %q, want 503 overloaded with Retry-After 1", class, r.status, r.body)
				}
			}
			hold("sheddable")
			waitBackend(1)
			shed("sheddable")
			hold("default")
			waitBackend(2)
			shed("sheddable")
			shed("default")
			hold("critical")
			hold("critical")
			waitBackend(4)
			// The limit is reached, but only two Critical requests are in
			// flight: two more go in.
			hold("critical")
			hold("critical")
			waitBackend(6)
			shed("critical")
			shed("default")
			if n := b.seen.Load() - seen; n != 6 {
				t.Errorf("the backend saw %d requests, want the 6 admitted: a shed request never reaches it", n)
			}
			for range readers {
				b.letOne(t)
			}
			for _, br := range readers {
				if r := readReply(t, br); r.status != http.StatusOK {
					t.Errorf("admitted request: %d", r.status)
				}
			}
			if r := do(t, f.url, "/fast/x", "X-Class", "sheddable"); r.status != http.StatusOK {
				t.Errorf("a sheddable request once the load is gone: %d, want 200", r.status)
			}
			shedTotal := 0.0
			for _, p := range []string{"Critical", "Default", "Sheddable"} {
				shedTotal += counter(t, f.m.ShedTotal.WithLabelValues(p, "enforce"))
			}
			if shedTotal != 5 {
				t.Errorf("shed_requests_total = %v, want 5", shedTotal)
			}
			if got := counter(t, f.m.RequestsTotal.WithLabelValues("shed")); got != 5 {
				t.Errorf("requests_total{outcome=shed} = %v, want 5", got)
			}
		})
	}
}
