package envoyrls_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// cluster is the package's shared Redis Cluster; fault tests start their
// own.
var cluster *redistest.Cluster

func TestMain(m *testing.M) {
	redistest.Main(m, redistest.Options{Masters: 3}, func(c *redistest.Cluster) { cluster = c })
}

func redisStore(t *testing.T, c *redistest.Cluster, timeout time.Duration) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(redisstore.Options{Addrs: c.Addrs(), Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var algorithms = []string{"TokenBucket", "GCRA", "SlidingWindow", "FixedWindow", "SlidingLog"}

// Every algorithm admits exactly its limit per distinct value of a
// key-only entry, over a real socket against the Redis Cluster.
func TestExactCountsPerAlgorithmRedis(t *testing.T) {
	t.Parallel()
	store := redisStore(t, cluster, 2*time.Second)
	cc := cluster.NewClient()
	t.Cleanup(func() { _ = cc.Close() })
	for _, alg := range algorithms {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			// Redis counts on its own clock, FixedWindow and SlidingWindow
			// in hour-long windows: calls that a window boundary splits
			// count in two windows, so a run that straddles one is made
			// again, on a server and counters of its own.
			redistest.InOneWindow(t, cc, time.Hour, func(attempt int) func() {
				// A uid of its own: the shared cluster outlives a run,
				// and -count=N and a rerun must start from fresh
				// counters.
				doc := fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: exact-%s-%d-%d
  rules:
  - name: per-user
    match: {descriptors: {domain: api, entries: [{key: user}]}}
    limit: {requests: 7, per: 1h, algorithm: %s}
`, strings.ToLower(alg), time.Now().UnixNano(), attempt, alg)
				r := newRLS(t, doc, setup{store: store, parallel: true})
				var alice []*rlsv3.RateLimitResponse
				for range 17 {
					alice = append(alice, r.call(t, req("api", d("user=alice"))))
				}
				bob := r.count(t, 9, req("api", d("user=bob")))
				return func() {
					for i, out := range alice[:7] {
						st := out.Statuses[0]
						if out.OverallCode != ok || st.Code != ok {
							t.Fatalf("call %d: %v, want OK", i, out)
						}
						if got, want := st.LimitRemaining, uint32(6-i); got != want {
							t.Errorf("call %d: limit_remaining %d, want %d", i, got, want)
						}
						if cl := st.CurrentLimit; cl.GetRequestsPerUnit() != 7 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || cl.GetUnitMultiplier() != nil {
							t.Errorf("call %d: current_limit %v, want 7 per HOUR", i, cl)
						}
					}
					for i, out := range alice[7:] {
						if out.OverallCode != over || out.Statuses[0].Code != over || out.Statuses[0].LimitRemaining != 0 {
							t.Fatalf("call %d past the limit: %v, want OVER_LIMIT with nothing remaining", 7+i, out)
						}
						if out.Statuses[0].DurationUntilReset.AsDuration() <= 0 {
							t.Errorf("OVER_LIMIT without duration_until_reset: %v", out.Statuses[0])
						}
					}
					if bob != 7 {
						t.Errorf("bob: %d of 9 admitted, want 7 (a counter per value)", bob)
					}
					if n := r.metric(t, "floodgate_sidecar_fallback_decisions_total"); n != 0 {
						t.Errorf("%v decisions fell back: the store calls failed", n)
					}
					if got := r.metric(t, "floodgate_sidecar_decisions_total", "rule", "per-user", "result", "allowed"); got != 14 {
						t.Errorf("allowed decisions metric %v, want 14", got)
					}
				}
			})
		})
	}
}

// Nested descriptors match level by level, most specific first, and only
// rules as deep as the descriptor.
func TestNestedDescriptors(t *testing.T) {
	t.Parallel()
	r := newRLS(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: nested
  rules:
  - name: marketing-per-number
    match: {descriptors: {domain: messaging, entries: [{key: message_type, value: marketing}, {key: to_number}]}}
    limit: {requests: 2, per: 24h, algorithm: FixedWindow}
  - name: per-number
    match: {descriptors: {domain: messaging, entries: [{key: to_number}]}}
    limit: {requests: 4, per: 24h, algorithm: FixedWindow}
  - name: vip-number
    match: {descriptors: {domain: messaging, entries: [{key: to_number, value: "555"}]}}
    limit: {requests: 1, per: 24h, algorithm: FixedWindow}
`, setup{})
	// Two levels: only the nested rule applies to the nested descriptor.
	mk := d("message_type=marketing", "to_number=111")
	if got := r.count(t, 5, req("messaging", mk)); got != 2 {
		t.Errorf("marketing to 111: %d of 5 admitted, want 2", got)
	}
	// The one-level descriptor has its own counter, untouched so far.
	if got := r.count(t, 6, req("messaging", d("to_number=111"))); got != 4 {
		t.Errorf("to 111: %d of 6 admitted, want 4", got)
	}
	// The most specific match wins: 555 has its own limit of 1, not 4.
	if got := r.count(t, 3, req("messaging", d("to_number=555"))); got != 1 {
		t.Errorf("to 555: %d of 3 admitted, want 1", got)
	}
	// A deeper descriptor than any rule matches nothing, as does another
	// message type.
	for _, desc := range []*rlcommonv3.RateLimitDescriptor{
		d("to_number=111", "extra=x"),
		d("message_type=transactional", "to_number=111"),
		d("message_type=marketing"),
	} {
		out := r.call(t, req("messaging", desc))
		if out.OverallCode != ok || out.Statuses[0].CurrentLimit != nil {
			t.Errorf("%v: %v, want a bare OK", desc, out)
		}
	}
	// Several descriptors in one call: all are checked; the nested one is
	// exhausted, so the call is OVER_LIMIT and the other one is not
	// charged.
	both := req("messaging", mk, d("to_number=222"))
	out := r.call(t, both)
	if out.OverallCode != over || out.Statuses[0].Code != over || out.Statuses[1].Code != ok {
		t.Fatalf("two descriptors: %v, want OVER_LIMIT from the first only", out)
	}
	if got := r.count(t, 5, req("messaging", d("to_number=222"))); got != 4 {
		t.Errorf("to 222 after a denied call that named it: %d of 5 admitted, want 4 (a denied call charges nothing)", got)
	}
}

// hits_addend is the cost; a descriptor's own hits_addend overrides the
// call's, and 0 there checks, as a cost of 1, without charging.
func TestHitsAddend(t *testing.T) {
	t.Parallel()
	r := newRLS(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: hits
  rules:
  - name: tokens
    match: {descriptors: {domain: llm, entries: [{key: tenant}]}}
    limit: {requests: 10, per: 1h, algorithm: FixedWindow}
`, setup{})
	in := req("llm", d("tenant=a"))
	in.HitsAddend = 3
	for i, want := range []uint32{7, 4, 1} {
		out := r.call(t, in)
		if out.OverallCode != ok || out.Statuses[0].LimitRemaining != want {
			t.Fatalf("call %d of cost 3: %v, want OK with %d remaining", i, out, want)
		}
	}
	if out := r.call(t, in); out.OverallCode != over {
		t.Fatalf("cost 3 with 1 left: %v, want OVER_LIMIT", out)
	}
	// A check (descriptor hits_addend 0) reports without charging.
	check := req("llm", d("tenant=a"))
	check.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	for range 3 {
		if out := r.call(t, check); out.OverallCode != ok || out.Statuses[0].LimitRemaining != 1 {
			t.Fatalf("check: %v, want OK with 1 remaining", out)
		}
	}
	// The descriptor's hits_addend wins over the call's.
	one := req("llm", d("tenant=a"))
	one.HitsAddend = 5
	one.Descriptors[0].HitsAddend = wrapperspb.UInt64(1)
	if out := r.call(t, one); out.OverallCode != ok || out.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("descriptor cost 1 over call cost 5: %v, want OK with 0 remaining", out)
	}
	// Nothing is left: a check is OVER_LIMIT, as a cost of 1 is.
	if out := r.call(t, check); out.OverallCode != over || out.Statuses[0].DurationUntilReset.AsDuration() <= 0 {
		t.Fatalf("check with nothing left: %v, want OVER_LIMIT with a wait", out)
	}
	// A cost above the capacity can never be admitted.
	big := req("llm", d("tenant=b"))
	big.HitsAddend = 11
	if out := r.call(t, big); out.OverallCode != over {
		t.Fatalf("cost 11 against a limit of 10: %v, want OVER_LIMIT", out)
	}
	if got := r.count(t, 11, req("llm", d("tenant=b"))); got != 10 {
		t.Errorf("tenant b after an oversized call: %d of 11 admitted, want 10", got)
	}
}

// Shadow rules answer OK, are counted, and report their own status.
func TestShadowRule(t *testing.T) {
	t.Parallel()
	r := newRLS(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: shadow
  rules:
  - name: soft
    mode: Shadow
    match: {descriptors: {domain: d, entries: [{key: user}]}}
    limit: {requests: 2, per: 1h, algorithm: FixedWindow}
  - name: hard
    match: {descriptors: {domain: d, entries: [{key: user}]}}
    limit: {requests: 4, per: 1h, algorithm: FixedWindow}
`, setup{})
	in := req("d", d("user=u"))
	if got := r.count(t, 6, in); got != 4 {
		t.Errorf("%d of 6 admitted, want 4: the shadow rule (2) must not deny, the enforced one (4) must", got)
	}
	if got := r.metric(t, "floodgate_sidecar_decisions_total", "rule", "soft", "result", "shadow_denied"); got < 2 {
		t.Errorf("shadow_denied %v, want at least 2", got)
	}
	if got := r.metric(t, "floodgate_sidecar_decisions_total", "rule", "hard", "result", "denied"); got != 2 {
		t.Errorf("hard denied %v, want 2", got)
	}
}

// Two limits on the same descriptor (a short burst and a long quota) both
// apply: the tighter one decides.
func TestTwoLimitsOnOneDescriptor(t *testing.T) {
	t.Parallel()
	r := newRLS(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: two
  rules:
  - name: burst
    match: {descriptors: {domain: d, entries: [{key: user}]}}
    limit: {requests: 3, per: 1h, algorithm: TokenBucket}
  - name: daily
    match: {descriptors: {domain: d, entries: [{key: user}]}}
    limit: {requests: 5, per: 24h, algorithm: FixedWindow}
`, setup{})
	if got := r.count(t, 5, req("d", d("user=a"))); got != 3 {
		t.Errorf("%d of 5 admitted, want 3 (the burst binds)", got)
	}
	out := r.call(t, req("d", d("user=a")))
	if cl := out.Statuses[0].CurrentLimit; cl.GetRequestsPerUnit() != 3 || cl.GetName() != "p.burst" {
		t.Errorf("denying status names %v, want p.burst", cl)
	}
	// The daily quota was charged only for the 3 admitted calls.
	if got := r.metric(t, "floodgate_sidecar_decisions_total", "rule", "daily", "result", "allowed"); got != 3 {
		t.Errorf("daily allowed %v, want 3", got)
	}
}

func TestUnknownDomainAndUnmatched(t *testing.T) {
	t.Parallel()
	r := newRLS(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: unk
  rules:
  - name: r
    match: {descriptors: {domain: known, entries: [{key: k, value: v}]}}
    limit: {requests: 1, per: 1h}
`, setup{})
	for _, in := range []*rlsv3.RateLimitRequest{req("other", d("k=v")), req("known", d("k=w")), req("known", d("x=v"))} {
		out := r.call(t, in)
		if out.OverallCode != ok || out.Statuses[0].Code != ok || out.Statuses[0].CurrentLimit != nil {
			t.Errorf("%v: %v, want a bare OK", in, out)
		}
	}
}

// Malformed calls get INVALID_ARGUMENT, never a panic or a decision.
func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	r := newRLS(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: bad
  rules:
  - name: r
    match: {descriptors: {domain: d, entries: [{key: k}]}}
    limit: {requests: 1, per: 1h}
`, setup{})
	huge := strings.Repeat("x", envoyrls.MaxValueLength+1)
	cases := map[string]*rlsv3.RateLimitRequest{
		"empty domain":     req("", d("k=v")),
		"no descriptors":   req("d"),
		"empty descriptor": req("d", &rlcommonv3.RateLimitDescriptor{}),
		"empty entry key":  req("d", d("=v")),
		"huge value":       req("d", d("k="+huge)),
		"huge key":         req("d", d(strings.Repeat("k", envoyrls.MaxKeyLength+1)+"=v")),
		"huge domain":      req(strings.Repeat("d", envoyrls.MaxDomainLength+1), d("k=v")),
		"call hits_addend": {Domain: "d", Descriptors: []*rlcommonv3.RateLimitDescriptor{d("k=v")}, HitsAddend: math.MaxUint32},
		"desc hits_addend": req("d", &rlcommonv3.RateLimitDescriptor{Entries: d("k=v").Entries, HitsAddend: wrapperspb.UInt64(math.MaxUint64)}),
		"negative hits":    req("d", &rlcommonv3.RateLimitDescriptor{Entries: d("k=v").Entries, IsNegativeHits: true, HitsAddend: wrapperspb.UInt64(1)}),
		"limit override":   req("d", &rlcommonv3.RateLimitDescriptor{Entries: d("k=v").Entries, Limit: &rlcommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}}),
		"too many entries": req("d", d(strings.Split(strings.Repeat("k=v,", envoyrls.MaxEntries+1), ",")[:envoyrls.MaxEntries+1]...)),
		"too many descs":   {Domain: "d", Descriptors: manyDescriptors(envoyrls.MaxDescriptors + 1)},
		"second entry key": req("d", d("k=v", "=w")),
		"later descriptor": req("d", d("k=v"), &rlcommonv3.RateLimitDescriptor{}),
	}
	for name, in := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := r.client.ShouldRateLimit(ctx, in)
		cancel()
		if got := status.Code(err); got != codes.InvalidArgument {
			t.Errorf("%s: code %v (%v), want InvalidArgument", name, got, err)
		}
	}
	if got := r.metric(t, "floodgate_sidecar_rls_calls_total", "code", "invalid_argument"); got != float64(len(cases)) {
		t.Errorf("invalid_argument calls %v, want %d", got, len(cases))
	}
	// Nothing was charged: the one request the limit allows still passes.
	if out := r.call(t, req("d", d("k=v"))); out.OverallCode != ok {
		t.Errorf("after the malformed calls: %v, want OK", out)
	}
}

func manyDescriptors(n int) []*rlcommonv3.RateLimitDescriptor {
	out := make([]*rlcommonv3.RateLimitDescriptor, n)
	for i := range out {
		out[i] = d("k=v")
	}
	return out
}

// Before Install the service is UNAVAILABLE and NOT_SERVING; after it,
// SERVING. Reflection lists the service.
func TestHealthAndReflection(t *testing.T) {
	t.Parallel()
	doc := `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: health
  rules:
  - name: r
    match: {descriptors: {domain: d, entries: [{key: k}]}}
    limit: {requests: 1, per: 1h}
`
	r := newRLS(t, doc, setup{noInstall: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.client.ShouldRateLimit(ctx, req("d", d("k=v"))); status.Code(err) != codes.Unavailable {
		t.Errorf("before a config: %v, want Unavailable", err)
	}
	hc := healthpb.NewHealthClient(r.conn)
	for _, svc := range []string{"", envoyrls.ServiceName} {
		res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || res.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health %q before a config: %v %v, want NOT_SERVING", svc, res, err)
		}
	}
	served := newRLS(t, doc, setup{})
	hc = healthpb.NewHealthClient(served.conn)
	res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: envoyrls.ServiceName})
	if err != nil || res.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health with a config: %v %v, want SERVING", res, err)
	}
	served.srv.Shutdown()
	res, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: envoyrls.ServiceName})
	if err != nil || res.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health after Shutdown: %v %v, want NOT_SERVING", res, err)
	}

	stream, err := reflectionpb.NewServerReflectionClient(r.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	joined := strings.Join(names, " ")
	for _, want := range []string{envoyrls.ServiceName, "grpc.health.v1.Health"} {
		if !strings.Contains(joined, want) {
			t.Errorf("reflection lists %v, want %s", names, want)
		}
	}
}

// With ResponseHeaders the answer carries the binding rule's fields.
func TestResponseHeaders(t *testing.T) {
	t.Parallel()
	r := newRLS(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: shop
  uid: hdr
  rules:
  - name: per-user
    match: {descriptors: {domain: d, entries: [{key: user}]}}
    limit: {requests: 2, per: 1m, algorithm: FixedWindow}
`, setup{headers: true})
	headers := func(out *rlsv3.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, h := range out.ResponseHeadersToAdd {
			m[h.Key] = h.Value
		}
		return m
	}
	h := headers(r.call(t, req("d", d("user=a"))))
	if h["X-RateLimit-Limit"] != "2" || h["X-RateLimit-Remaining"] != "1" || h["RateLimit-Policy"] != `"shop.per-user";q=2;w=60` || h["Retry-After"] != "" {
		t.Errorf("allowed call headers %v", h)
	}
	r.call(t, req("d", d("user=a")))
	out := r.call(t, req("d", d("user=a")))
	h = headers(out)
	if out.OverallCode != over || h["X-RateLimit-Remaining"] != "0" || h["Retry-After"] == "" || !strings.HasPrefix(h["RateLimit"], `"shop.per-user";r=0;t=`) {
		t.Errorf("denied call: %v headers %v", out.OverallCode, h)
	}
}

// A fail-open rule falls back to its local share and a fail-closed rule
// answers OVER_LIMIT while the Redis Cluster is down.
func TestFailModesWithClusterKilled(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, redistest.Options{Masters: 1, NodeTimeout: time.Second})
	// A call budget no answer of a loaded machine reaches, as in
	// TestExactCountsPerAlgorithmRedis: the healthy call must decide on
	// the cluster, and a timed-out call would fall back instead. The
	// calls after the kill do not wait for it: the dead node refuses
	// them, and its breaker then fails them at once.
	store := redisStore(t, c, 2*time.Second)
	// The fallback runs on a clock the test moves: what it admits depends
	// on the instants of the calls, not on how fast they are made.
	var now atomic.Int64
	now.Store(time.Date(2026, 3, 1, 12, 0, 0, 50_000_000, time.UTC).UnixNano())
	r := newRLS(t, `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: faults
  replicas: 2
  rules:
  - name: open
    match: {descriptors: {domain: d, entries: [{key: open}]}}
    limit: {requests: 10, per: 1s, algorithm: FixedWindow}
  - name: closed
    failureMode: Closed
    match: {descriptors: {domain: d, entries: [{key: closed}]}}
    limit: {requests: 10, per: 1h, algorithm: FixedWindow}
`, setup{store: store, parallel: true, clock: func() time.Time { return time.Unix(0, now.Load()) }})
	// The healthy call needs the store ready: its slot map loaded, its
	// connection to the master up and the rules' script (FixedWindow)
	// cached there. A first call does all of that within its own call
	// budget, which a loaded machine can exceed: the test waits for a call
	// of the store's own, on a key of its own, to answer.
	warm := limiter.Request{Key: "warm-up", Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000, Period: time.Hour}, Cost: 1}
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, _, err := store.Take(t.Context(), warm)
		if err == nil {
			break
		}
		if !errors.Is(err, limiter.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("the store does not answer 10s after the cluster started: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Healthy: both decide on the cluster.
	if out := r.call(t, req("d", d("open=a"), d("closed=a"))); out.OverallCode != ok {
		t.Fatalf("healthy: %v", out)
	}
	for _, n := range c.Nodes() {
		if err := c.Kill(n); err != nil {
			t.Fatal(err)
		}
	}
	// Fail open: this replica's share of 10 per second among 2 is every
	// other one of the limit's tokens, one each 200ms, and the key starts
	// empty. Calls every 20ms for 2s, from 50ms into a second, use every
	// token of the share as it arrives: those at 200ms, 400ms, ... 2s from
	// that second's start, 10.
	got := 0
	for range 100 {
		if r.call(t, req("d", d("open=b"))).OverallCode == ok {
			got++
		}
		now.Add(int64(20 * time.Millisecond))
	}
	if got != 10 {
		t.Errorf("fail-open with the cluster down: %d admitted in 2s, want the local share, 10", got)
	}
	if m := r.metric(t, "floodgate_sidecar_fallback_decisions_total", "rule", "open", "result", "allowed"); m != float64(got) {
		t.Errorf("fallback allowed %v, want %d", m, got)
	}
	// Fail closed: every call is OVER_LIMIT, retry in a second.
	for range 3 {
		out := r.call(t, req("d", d("closed=b")))
		st := out.Statuses[0]
		if out.OverallCode != over || st.Code != over || st.DurationUntilReset.AsDuration() != time.Second {
			t.Fatalf("fail-closed with the cluster down: %v, want OVER_LIMIT with 1s", out)
		}
	}
	if got := r.metric(t, "floodgate_sidecar_decisions_total", "rule", "closed", "result", "unavailable"); got != 3 {
		t.Errorf("closed unavailable decisions %v, want 3", got)
	}
	// A call naming both: the fail-closed rule decides, nothing is taken
	// from the fail-open share.
	if out := r.call(t, req("d", d("open=c"), d("closed=c"))); out.OverallCode != over {
		t.Errorf("both rules, cluster down: %v, want OVER_LIMIT", out)
	}
}
