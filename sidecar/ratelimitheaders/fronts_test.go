package ratelimitheaders_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/events"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/proxy"
	leanproxy "github.com/floodgate-dev/floodgate/sidecar/proxy/lean"
	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// The fronts are tested at a fixed instant, 20 s into a minute, so every
// field is exact: FixedWindow's windows end 40 s later.
var t0 = time.Unix(1_700_000_000, 0)

// rule is one rule of a case. Each front gets it in its own form: an HTTP
// rule on path /<case>, keyed by X-User, costed by X-Cost; a descriptor
// rule on (case, <case>), (user, *) in domain "d", costed by hits_addend.
type rule struct {
	name  string
	limit string // the limit, in YAML flow style
	extra string // more fields of the rule, in YAML flow style
	// down makes the counter store unreachable for the rule's keys.
	down bool
}

// fieldCase is one row of the table both fronts are held to: the calls
// before, then one call whose answer must carry want.
type fieldCase struct {
	name   string
	rules  []rule
	before []int64 // the costs of the calls made first
	cost   int64   // the cost of the call checked
	status int     // the HTTP status; 200 is OK for Envoy, anything else OVER_LIMIT
	want   [ratelimitheaders.NumFields]string
}

const tb = "{requests: 2, per: 1m, burst: 4, algorithm: TokenBucket}"

var fieldCases = []fieldCase{
	{name: "allowed", rules: []rule{{name: "allowed", limit: tb}}, cost: 1, status: 200,
		want: [...]string{"4", "3", "30", `"p.allowed";q=2;w=60`, `"p.allowed";r=3;t=30`, ""}},
	{name: "cost-denied", rules: []rule{{name: "cost-denied", limit: tb}}, before: []int64{2}, cost: 3, status: 429,
		want: [...]string{"4", "0", "60", `"p.cost-denied";q=2;w=60`, `"p.cost-denied";r=0;t=60`, "30"}},
	{name: "sub-second", rules: []rule{{name: "sub-second", limit: "{requests: 4, per: 1s, algorithm: TokenBucket}"}},
		before: []int64{4}, cost: 1, status: 429,
		want: [...]string{"4", "0", "1", `"p.sub-second";q=4;w=1`, `"p.sub-second";r=0;t=1`, "1"}},
	{name: "window", rules: []rule{{name: "window", limit: "{requests: 2, per: 1m, algorithm: FixedWindow}"}},
		before: []int64{1}, cost: 1, status: 200,
		want: [...]string{"2", "0", "40", `"p.window";q=2;w=60`, `"p.window";r=0;t=40`, ""}},
	{name: "window-denied", rules: []rule{{name: "window-denied", limit: "{requests: 2, per: 1m, algorithm: FixedWindow}"}},
		before: []int64{1, 1}, cost: 1, status: 429,
		want: [...]string{"2", "0", "40", `"p.window-denied";q=2;w=60`, `"p.window-denied";r=0;t=40`, "40"}},
	{name: "tightest", rules: []rule{
		{name: "tightest-a", limit: "{requests: 100, per: 1m, algorithm: GCRA}"},
		{name: "tightest-b", limit: "{requests: 2, per: 1m, algorithm: TokenBucket}"},
	}, cost: 1, status: 200,
		want: [...]string{"2", "1", "30", `"p.tightest-b";q=2;w=60`, `"p.tightest-b";r=1;t=30`, ""}},
	{name: "shadow", rules: []rule{{name: "shadow", limit: "{requests: 1, per: 1h}", extra: "mode: Shadow"}},
		before: []int64{1}, cost: 1, status: 200},
	{name: "unmatched", status: 200, cost: 1},
	{name: "fail-closed", rules: []rule{{name: "fail-closed", limit: tb, extra: "failureMode: Closed", down: true}},
		cost: 1, status: 503,
		want: [...]string{"4", "0", "1", `"p.fail-closed";q=2;w=60`, `"p.fail-closed";r=0;t=1`, "1"}},
	// A fail-open rule decides on this replica's share of the limit
	// (limiter.Share): 2 per minute, burst 4, dealt out to 2 replicas, a
	// token every 30 s, each replica holding at most 2. The sidecar has
	// no pod name, so it is replica 1 (a hash of ""), which owns the odd
	// tokens; the key starts empty, and t0 is 10 s before token
	// 56666667 arrives (t0*2/60s = 56666666.67). X-RateLimit-Limit is the
	// share's capacity, the bucket that Remaining and Reset describe (full
	// when tokens up to 56666670 have arrived, 100 s on);
	// RateLimit-Policy is still the rule's policy.
	{name: "fallback", rules: []rule{{name: "fallback", limit: tb, down: true}}, cost: 1, status: 429,
		want: [...]string{"2", "0", "100", `"p.fallback";q=2;w=60`, `"p.fallback";r=0;t=100`, "10"}},
	{name: "fallback-denied", rules: []rule{{name: "fallback-denied", limit: tb, down: true}},
		before: []int64{1, 1}, cost: 1, status: 429,
		want: [...]string{"2", "0", "100", `"p.fallback-denied";q=2;w=60`, `"p.fallback-denied";r=0;t=100`, "10"}},
}

// policies renders the table's rules as a sidecar config, in one form or
// the other: the rules whose store is up in policy p (uid "up"), the others
// in a policy of the same name in another namespace (uid "down").
func policies(descriptorRules bool) string {
	var up, down strings.Builder
	for _, c := range fieldCases {
		for _, r := range c.rules {
			b := &up
			if r.down {
				b = &down
			}
			fmt.Fprintf(b, "  - name: %s\n    limit: %s\n", r.name, r.limit)
			if r.extra != "" {
				fmt.Fprintf(b, "    %s\n", r.extra)
			}
			if descriptorRules {
				fmt.Fprintf(b, "    match: {descriptors: {domain: d, entries: [{key: case, value: %s}, {key: user}]}}\n", c.name)
			} else {
				fmt.Fprintf(b, "    match: {path: {type: Exact, value: /%s}}\n    key: [{header: X-User}]\n    cost: {fromHeader: X-Cost}\n", c.name)
			}
		}
	}
	return "apiVersion: floodgate.dev/sidecar-config/v1\npolicies:\n" +
		"- name: p\n  uid: up\n  replicas: 2\n  rules:\n" + up.String() +
		"- name: p\n  namespace: b\n  uid: down\n  replicas: 2\n  rules:\n" + down.String()
}

// store is the in-memory store at the test's instant, unreachable for the
// keys of the policy with uid "down". It records every key it is asked
// about.
type store struct {
	mem  *memstore.Store
	mu   sync.Mutex
	keys map[string]bool
}

func (s *store) Take(ctx context.Context, req limiter.Request) (limiter.Decision, string, error) {
	s.mu.Lock()
	s.keys[req.Key] = true
	s.mu.Unlock()
	if strings.HasPrefix(req.Key, "down:") {
		return limiter.Decision{}, "", fmt.Errorf("dial 127.0.0.1:1: %w", limiter.ErrUnavailable)
	}
	return s.mem.Take(ctx, req)
}

func (s *store) seen(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[key]
}

// front is one of the sidecar's fronts, serving the table's rules on a
// real socket, with its own store, engine and deny-event log.
type front struct {
	name  string
	call  func(t *testing.T, c *fieldCase, cost int64) (status int, fields map[string][]string)
	store *store
	log   *syncBuffer
	stop  func()
}

func newEngine(t *testing.T, descriptorRules bool) (*engine.Engine, *ruleset.Set, *store, *metrics.Metrics) {
	t.Helper()
	c, err := config.Load([]byte(policies(descriptorRules)))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	set, err := ruleset.Compile(c, labels.Set{}, m)
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return t0 }
	mem, err := memstore.New(memstore.WithClock(now))
	if err != nil {
		t.Fatal(err)
	}
	fb, err := memstore.New(memstore.WithClock(now))
	if err != nil {
		t.Fatal(err)
	}
	st := &store{mem: mem, keys: map[string]bool{}}
	eng, err := engine.New(engine.Options{Store: st, Fallback: fb, Metrics: m, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return eng, set, st, m
}

// syncBuffer is a bytes.Buffer for a log written from the event queue.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// newQueue starts a deny-event queue writing JSON lines to a buffer.
func newQueue(t *testing.T) (*events.Queue, *syncBuffer, func()) {
	t.Helper()
	buf := &syncBuffer{}
	q := events.NewQueue(1024, slog.New(slog.NewJSONHandler(buf, nil)), nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	go q.Run(ctx)
	return q, buf, func() { cancel(); <-q.Done() }
}

// httpFront is the HTTP proxy on a loopback socket, in front of an
// application that answers 200: the net/http front when lean is false,
// else the lean HTTP/1.1 core.
func httpFront(t *testing.T, lean bool) *front {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	t.Cleanup(app.Close)
	eng, set, st, m := newEngine(t, false)
	q, log, stop := newQueue(t)
	up, err := url.Parse(app.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(proxy.Options{Upstream: up, Engine: eng, Metrics: m, Events: q, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p.SetRules(set)
	name, base := "http", ""
	if lean {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls := leanproxy.New(leanproxy.Options{Upstream: up.Host, Proxy: func() *proxy.Proxy { return p }, Log: slog.New(slog.DiscardHandler)})
		go func() { _ = ls.Serve(ln) }()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = ls.Shutdown(ctx)
		})
		name, base = "http-lean", "http://"+ln.Addr().String()
	} else {
		srv := httptest.NewServer(p)
		t.Cleanup(srv.Close)
		base = srv.URL
	}
	client := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	return &front{name: name, store: st, log: log, stop: stop,
		call: func(t *testing.T, c *fieldCase, cost int64) (int, map[string][]string) {
			t.Helper()
			req, err := http.NewRequest("GET", base+"/"+c.name, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-User", "alice")
			req.Header.Set("X-Cost", strconv.FormatInt(cost, 10))
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = res.Body.Close() }()
			_, _ = io.Copy(io.Discard, res.Body)
			fields := map[string][]string{}
			for _, name := range ratelimitheaders.Names {
				if vs := res.Header.Values(name); len(vs) > 0 {
					fields[name] = vs
				}
			}
			return res.StatusCode, fields
		}}
}

// grpcFront is the Envoy rate-limit service, with response headers on, on
// a loopback socket.
func grpcFront(t *testing.T) *front {
	t.Helper()
	eng, set, st, _ := newEngine(t, true)
	q, log, stop := newQueue(t)
	s, err := envoyrls.New(envoyrls.Options{Registerer: prometheus.NewRegistry(), Events: q, ResponseHeaders: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Install(eng, set)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.Register(gs)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	return &front{name: "grpc", store: st, log: log, stop: stop,
		call: func(t *testing.T, c *fieldCase, cost int64) (int, map[string][]string) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommonv3.RateLimitDescriptor{{
				Entries:    []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "case", Value: c.name}, {Key: "user", Value: "alice"}},
				HitsAddend: wrapperspb.UInt64(uint64(cost)),
			}}})
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			fields := map[string][]string{}
			for _, h := range out.ResponseHeadersToAdd {
				fields[h.Key] = append(fields[h.Key], h.Value)
			}
			if out.OverallCode == rlsv3.RateLimitResponse_OK {
				return 200, fields
			}
			return 0, fields
		}}
}

// Every front (net/http, the lean HTTP/1.1 core, Envoy) answers every case of one table with the same fields, from
// the same function, over real sockets.
func TestFrontsAgree(t *testing.T) {
	t.Parallel()
	for _, f := range []*front{httpFront(t, false), httpFront(t, true), grpcFront(t)} {
		t.Run(f.name, func(t *testing.T) {
			for i := range fieldCases {
				c := &fieldCases[i]
				for _, cost := range c.before {
					f.call(t, c, cost)
				}
				status, fields := f.call(t, c, c.cost)
				wantStatus := c.status
				if f.name == "grpc" && wantStatus != 200 {
					wantStatus = 0 // OVER_LIMIT
				}
				if status != wantStatus {
					t.Errorf("%s: status %d, want %d", c.name, status, wantStatus)
				}
				for fi, name := range ratelimitheaders.Names {
					got, want := fields[name], c.want[fi]
					switch {
					case want == "" && len(got) > 0:
						t.Errorf("%s: %s = %q, want none", c.name, name, got)
					case want != "" && (len(got) != 1 || got[0] != want):
						t.Errorf("%s: %s = %q, want %q", c.name, name, got, want)
					}
				}
			}
		})
	}
}

// Every front builds deny events with one constructor: the same fields for
// the same denial, apart from what the call was.
func TestFrontsDenyEventsAgree(t *testing.T) {
	t.Parallel()
	type event struct {
		Msg, Policy, Rule, Key, Source, Method, Path, Client string
		Shadow                                               bool
		Limit, Cost                                          int64
		RetryAfterSeconds                                    float64
	}
	c := &fieldCase{name: "cost-denied"}
	got := map[string]event{}
	for _, f := range []*front{httpFront(t, false), httpFront(t, true), grpcFront(t)} {
		f.call(t, c, 2)
		if status, _ := f.call(t, c, 3); status == 200 {
			t.Fatalf("%s: the call of cost 3 was admitted", f.name)
		}
		f.stop()
		lines := strings.Split(strings.TrimSpace(f.log.String()), "\n")
		if len(lines) != 1 {
			t.Fatalf("%s: %d deny events, want 1: %s", f.name, len(lines), f.log)
		}
		var raw map[string]any
		if err := json.Unmarshal([]byte(lines[0]), &raw); err != nil {
			t.Fatalf("%s: %v: %s", f.name, err, lines[0])
		}
		e := event{Msg: raw["msg"].(string), Policy: raw["policy"].(string), Rule: raw["rule"].(string), Key: raw["key"].(string),
			Source: raw["source"].(string), Method: raw["method"].(string), Path: raw["path"].(string), Client: raw["client"].(string),
			Shadow: raw["shadow"].(bool), Limit: int64(raw["limit"].(float64)), Cost: int64(raw["cost"].(float64)),
			RetryAfterSeconds: raw["retryAfterSeconds"].(float64)}
		got[f.name] = e
	}
	h, g := got["http"], got["grpc"]
	for _, e := range []event{h, g} {
		if e.Msg != "rate limit deny" || e.Policy != "p" || e.Rule != "cost-denied" || e.Source != "store" ||
			e.Shadow || e.Limit != 4 || e.Cost != 3 || e.RetryAfterSeconds != 30 ||
			!strings.HasPrefix(e.Key, "up:cost-denied:") || e.Client != "127.0.0.1" {
			t.Errorf("deny event %+v", e)
		}
	}
	if h.Method != "GET" || h.Path != "/cost-denied" {
		t.Errorf("http deny event names %s %q, want GET /cost-denied", h.Method, h.Path)
	}
	if g.Method != "ShouldRateLimit" || g.Path != "" {
		t.Errorf("grpc deny event names %s %q, want ShouldRateLimit and no path", g.Method, g.Path)
	}
}

// Both fronts key their counters with package descriptor's hash: the key a
// front charges is the rule's prefix and the hash of its input, built with
// descriptor.AppendField. The inputs differ in shape (an HTTP rule's key
// parts, a descriptor rule's entries) because a rule belongs to one front
// only; see package descriptor.
func TestFrontsKeyWithOneHash(t *testing.T) {
	t.Parallel()
	c := &fieldCase{name: "allowed"}
	hf, gf := httpFront(t, false), grpcFront(t)
	hf.call(t, c, 1)
	gf.call(t, c, 1)

	// The HTTP rule has one key part, the X-User header (part kind 1).
	in := descriptor.AppendField([]byte{1}, "alice")
	h := descriptor.Sum(in)
	if key := h.Key("up:allowed:"); !hf.store.seen(key) {
		t.Errorf("the HTTP front did not charge %s", key)
	}
	// The descriptor rule's entries: (case, allowed), (user, alice).
	in = nil
	for _, s := range []string{"case", "allowed", "user", "alice"} {
		in = descriptor.AppendField(in, s)
	}
	h = descriptor.Sum(in)
	if key := h.Key("up:allowed:"); !gf.store.seen(key) {
		t.Errorf("the Envoy front did not charge %s", key)
	}
}
