package engine_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// redisEngine is an engine with leases on a real redis-server. With now,
// the engine decides on that clock (the rate and round trips its leases
// are sized on, their expiry) and sweeps only when told, while Redis
// counts on its own; without, both run on the wall clock. Its calls have
// a budget no busy machine exhausts (redisTimeout): a call that missed the
// default 50ms would be decided by the local fallback, which is not what
// these tests measure.
func redisEngine(t *testing.T, srv *redistest.Server, now func() time.Time) (*engine.Engine, *metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	st, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr()}, Single: true, BatchWindow: redisstore.DefaultBatchWindow, Timeout: redisTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var fbOpts []memstore.Option
	lo := &engine.LeaseOptions{}
	if now != nil {
		fbOpts = append(fbOpts, memstore.WithClock(now))
		lo.SweepInterval = -1
	}
	fb, err := memstore.New(fbOpts...)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	m := metrics.NewMetrics(reg)
	e, err := engine.New(engine.Options{Store: st, StoreName: "redis", Fallback: fb, Metrics: m, Parallel: true, Leases: lo, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e, m, reg
}

// redisTimeout is the call budget of the Redis stores here: a hang bound.
const redisTimeout = 10 * time.Second

func leasedRule(t *testing.T, m *metrics.Metrics, lim limiter.Limit) *engine.Rule {
	t.Helper()
	r, err := engine.NewRule("pol", "hot", lim, 1, false, false, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Spread(true, 1, m); err != nil {
		t.Fatal(err)
	}
	return r
}

// scripts counts the scripts a server has run: FCALL calls.
func scripts(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	info, err := srv.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != "cmdstat_fcall" {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				c, _ := strconv.ParseInt(v, 10, 64)
				n += c
			}
		}
	}
	return n
}

// fixedWindowCount reads the count of a FixedWindow counter from Redis.
func fixedWindowCount(t *testing.T, srv *redistest.Server, key string) int64 {
	t.Helper()
	st, err := srv.Client().Get(context.Background(), redislayout.CounterKey(key, limiter.FixedWindow)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 16 {
		t.Fatalf("state of %d bytes, want 16", len(st))
	}
	return int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(st[8:16]))))
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// TestLeasesOnRedis: a hot key decided on a real Redis makes about one
// script call per lease, and after shutdown the count in Redis is exactly
// what was admitted: every admitted request was paid for, and every unused
// token went back.
//
// The engine decides on a clock the test moves, 200µs a decision (5000
// requests a second), so that the leases are sized on that rate, however
// fast the machine runs the loop; Redis counts in its hour-long windows
// on its own clock. A run that a window boundary splits would count in two
// windows: it is run again, on a key of its own.
func TestLeasesOnRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	redistest.InOneWindow(t, srv.Client(), time.Hour, func(attempt int) func() {
		return leasesOnRedis(t, srv, fmt.Sprintf("leases-on-redis-%d", attempt))
	})
}

// leasesOnRedis runs TestLeasesOnRedis's traffic on key and returns the
// checks of its outcome, for a run that one window held.
func leasesOnRedis(t *testing.T, srv *redistest.Server, key string) (check func()) {
	clk := limitertest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	e, m, _ := redisEngine(t, srv, clk.Now)
	r := leasedRule(t, m, limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000, Period: time.Hour})
	before := scripts(t, srv)
	const n = 20000
	var v engine.Verdict
	for range n {
		clk.Add(200 * time.Microsecond)
		e.Decide(context.Background(), []engine.Hit{{Rule: r, Key: key, Cost: 1}}, &v)
		if v.Outcome != engine.Allow {
			t.Fatalf("denied: %+v", v.Results[0])
		}
	}
	calls := scripts(t, srv) - before
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	return func() {
		if calls > n/50 {
			t.Errorf("%d scripts for %d decisions, want at most 2%%", calls, n)
		}
		// A lease call that failed may have taken its tokens in Redis
		// all the same; without one the count is exact.
		errs := counter(m.Lease.CallsTotal.WithLabelValues("pol", "hot", metrics.LeaseError))
		if got := fixedWindowCount(t, srv, key); got < n || (errs == 0 && got != n) {
			t.Errorf("Redis counts %d after shutdown, want the %d admitted (%v lease calls failed)", got, n, errs)
		}
		t.Logf("%d scripts for %d decisions; %v granted, %v returned at shutdown", calls, n,
			counter(m.Lease.GrantedTokensTotal.WithLabelValues("pol", "hot")),
			counter(m.Lease.ReturnedTokensTotal.WithLabelValues("pol", "hot", metrics.ReturnShutdown)))
	}
}

// TestLeaseWhenRedisGoesAway: with Redis killed, the sidecar spends the
// lease it holds, then the rule falls back to its local bucket; the tokens
// it could not give back are counted lost. The engine decides on a clock
// the test moves, 200µs a decision: its lease is sized on that rate, and
// expires on that clock, not when a busy machine happens to stall the
// loop.
func TestLeaseWhenRedisGoesAway(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	clk := limitertest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	e, m, _ := redisEngine(t, srv, clk.Now)
	r := leasedRule(t, m, limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1_000_000, Period: time.Hour})
	var v engine.Verdict
	decide := func() engine.Result {
		clk.Add(200 * time.Microsecond)
		e.Decide(context.Background(), []engine.Hit{{Rule: r, Key: "goes-away", Cost: 1}}, &v)
		return v.Results[0]
	}
	for deadline := time.Now().Add(time.Minute); decide().Source != engine.FromLease; {
		if time.Now().After(deadline) {
			t.Fatal("no lease taken in a minute")
		}
	}
	// Two rate slots at the key's rate: the lease has grown to its size.
	for range 2000 {
		decide()
	}
	srv.Kill()
	var fromLease, fallback int
	for deadline := time.Now().Add(time.Minute); fallback < 100 && time.Now().Before(deadline); {
		res := decide()
		switch res.Source {
		case engine.FromLease:
			if fallback > 0 {
				t.Fatal("a lease hit after the fallback began")
			}
			fromLease++
		case engine.FromFallback:
			fallback++
		default:
			t.Fatalf("decided from %v with Redis down", res.Source)
		}
		if !res.Allowed && res.Source != engine.FromFallback {
			t.Fatalf("denied from %v", res.Source)
		}
	}
	if fromLease == 0 || fallback == 0 {
		t.Fatalf("%d lease hits, %d fallback decisions: want both", fromLease, fallback)
	}
	if fromLease < 50 {
		t.Errorf("%d lease hits once Redis went away, want the lease spent (at least 50)", fromLease)
	}
	t.Logf("%d decisions on the lease, then %d on the fallback bucket", fromLease, fallback)
	_ = e.Close(context.Background())
}

// scriptStats returns the script calls a node has run and the
// microseconds it spent in them (INFO commandstats, FCALL).
func scriptStats(t *testing.T, n *redistest.Node) (calls, usec int64) {
	t.Helper()
	info, err := n.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || name != "cmdstat_fcall" {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			c, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls += c
			case "usec":
				usec += c
			}
		}
	}
	return calls, usec
}

// TestSplitOnThreeMasters: one key split over three sub-counters on a
// 3-master cluster puts a third of the script calls, and of the Redis CPU
// they take, on each master (within 1.3 times of each other), and admits
// exactly its limit, leases off or on.
//
// The engine decides on a clock the decisions move, 100µs each: its leases
// are sized on that rate and expire on that clock, not when a busy machine
// stalls the callers. Redis counts in hour-long windows on its own clock;
// a run that a window boundary splits is run again, on a key of its own.
func TestSplitOnThreeMasters(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, redistest.Options{Masters: 3})
	masters, err := cluster.Masters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}
	for _, lease := range []bool{false, true} {
		redistest.InOneWindow(t, masters[0].Client(), time.Hour, func(attempt int) func() {
			return splitOnThreeMasters(t, cluster, masters, lease, fmt.Sprintf("split-lease-%v-%d", lease, attempt))
		})
	}
}

// splitOnThreeMasters runs TestSplitOnThreeMasters's traffic on key and
// returns the checks of its outcome, for a run that one window held.
func splitOnThreeMasters(t *testing.T, cluster *redistest.Cluster, masters []*redistest.Node, lease bool, key string) (check func()) {
	const limit = 6000
	st, err := redisstore.New(redisstore.Options{Addrs: cluster.Addrs(), BatchWindow: redisstore.DefaultBatchWindow, Timeout: redisTimeout})
	if err != nil {
		t.Fatal(err)
	}
	clk := limitertest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	fb, err := memstore.New(memstore.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	m := metrics.NewMetrics(reg)
	var lo *engine.LeaseOptions
	if lease {
		lo = &engine.LeaseOptions{SweepInterval: -1}
	}
	e, err := engine.New(engine.Options{Store: st, StoreName: "redis", Fallback: fb, Metrics: m, Parallel: true, Leases: lo, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	r, err := engine.NewRule("pol", "split", limiter.Limit{Algorithm: limiter.FixedWindow, Requests: limit, Period: time.Hour}, 1, false, false, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Spread(lease, 3, m); err != nil {
		t.Fatal(err)
	}
	calls0, usec0 := make([]int64, 3), make([]int64, 3)
	for i, n := range masters {
		calls0[i], usec0[i] = scriptStats(t, n)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var v engine.Verdict
			for range limit * 12 / 10 / 8 {
				clk.Add(100 * time.Microsecond)
				e.Decide(context.Background(), []engine.Hit{{Rule: r, Key: key, Cost: 1}}, &v)
				if v.Outcome == engine.Allow {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	var calls, usec []int64
	for i, n := range masters {
		c, u := scriptStats(t, n)
		calls, usec = append(calls, c-calls0[i]), append(usec, u-usec0[i])
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	counted := int64(0)
	cc := cluster.NewClient()
	for i := range 3 {
		s, err := cc.Get(context.Background(), redislayout.CounterKey(redislayout.SplitKey(key, i, 3), limiter.FixedWindow)).Result()
		if err != nil {
			t.Fatal(err)
		}
		counted += int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[8:16]))))
	}
	_ = cc.Close()
	got, failed := admitted.Load(), failedStoreCalls(t, reg)
	return func() {
		// A call that failed may have taken its token in Redis: the
		// request was then decided without it.
		if counted < got || counted > got+failed {
			t.Errorf("lease=%v: Redis counts %d after shutdown, the sidecar admitted %d with %d failed store calls", lease, counted, got, failed)
		}
		if got > limit || float64(got) < 0.98*limit {
			t.Errorf("lease=%v: admitted %d of %d offered, want at most the limit %d and at least 98%% of it", lease, got, limit*12/10, limit)
		}
		if !lease {
			// The calls spread evenly is what the split must do; the CPU
			// each master spent on them (logged below) follows the calls,
			// but on a shared machine it also measures who else ran there,
			// so it is a harness figure, not an assertion.
			if lo, hi := slices.Min(calls), slices.Max(calls); lo <= 0 || float64(hi) > 1.3*float64(lo) {
				t.Errorf("script calls per master %v: want each within 1.3 times of the others", calls)
			}
		}
		t.Logf("lease=%v: admitted %d (Redis counts %d, %d failed store calls); script calls per master %v, script CPU per master %v µs", lease, got, counted, failed, calls, usec)
	}
}

// failedStoreCalls sums the store calls that got no answer in reg
// (store_operations_total with a result other than ok).
func failedStoreCalls(t *testing.T, reg *prometheus.Registry) int64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "floodgate_sidecar_store_operations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() != "ok" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int64(n)
}

var fleetSeconds = flag.Int("fleet.seconds", 5, "length in seconds of TestFourSidecarsOnOneKey (the acceptance run is 30)")

// TestFourSidecarsOnOneKey: four sidecars on one real Redis share a key of
// 1000/s, offered three times that with a 70/10/10/10 split, in real time:
// the fleet admits at most what the token bucket allows in the run (its
// capacity plus its refill), and it leaves no token of the shared count
// unused while Redis refuses its requests. Admissions on a sidecar's local
// fallback bucket, after a store call failed, are the failure mode's, not
// the shared count's: they are counted apart.
//
// Both bounds are taken from the events they follow, not from the test's
// schedule, which a busy machine may not keep. The run is timed from the
// first decision to the last: Redis decided every request in that span.
// And when Redis refuses a request its bucket holds less than a token;
// between two such refusals less than its fill time (capacity / rate)
// apart, the bucket cannot have reached its capacity, so every token it
// refilled in between was taken: by a request, or into a lease whose
// tokens were then admitted, given back or lost (counted by the engines).
// Each refusal is known to lie between its request's start and answer.
func TestFourSidecarsOnOneKey(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1000, Period: time.Second}
	shares := []float64{0.7, 0.1, 0.1, 0.1}
	const offered = 3000.0
	var engines []*engine.Engine
	var rules []*engine.Rule
	var ms []*metrics.Metrics
	var regs []*prometheus.Registry
	for range shares {
		e, m, reg := redisEngine(t, srv, nil)
		engines, rules, ms, regs = append(engines, e), append(rules, leasedRule(t, m, lim)), append(ms, m), append(regs, reg)
	}
	var admitted, fallback, decided atomic.Int64
	var mu sync.Mutex
	var first, last time.Time // the first decision's start, the last one's end
	var refused []span        // the decisions Redis refused
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(time.Duration(*fleetSeconds) * time.Second)
	for i, share := range shares {
		e, r := engines[i], rules[i]
		interval := time.Duration(float64(time.Second) / (offered * share))
		wg.Go(func() {
			var v engine.Verdict
			var mine []span
			var from time.Time
			next := start
			for next.Before(end) {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				sent := time.Now()
				if from.IsZero() {
					from = sent
				}
				e.Decide(context.Background(), []engine.Hit{{Rule: r, Key: "fleet", Cost: 1}}, &v)
				decided.Add(1)
				switch src := v.Results[0].Source; {
				case v.Outcome != engine.Allow:
					if src == engine.FromStore {
						mine = append(mine, span{sent, time.Now()})
					}
				case src == engine.FromFallback:
					fallback.Add(1)
				default:
					admitted.Add(1)
				}
				next = next.Add(interval)
			}
			to := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if first.IsZero() || from.Before(first) {
				first = from
			}
			if to.After(last) {
				last = to
			}
			refused = append(refused, mine...)
		})
	}
	wg.Wait()
	for _, e := range engines {
		if err := e.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	run := last.Sub(first)
	got := admitted.Load()
	lt := float64(lim.Requests) * run.Seconds()
	if bound := float64(lim.Capacity()) + lt; float64(got) > bound {
		t.Errorf("admitted %d in %v, want at most the capacity plus the refill, %.0f", got, run, bound)
	}
	// Tokens taken from Redis went to admitted requests, or back, or were
	// lost; a call that failed may have taken a lease's worth (at most
	// a tenth of the capacity) for nothing. Those refilled between close
	// refusals were all taken.
	var back, lost float64
	var failed int64
	for i, m := range ms {
		lost += counter(m.Lease.LostTokensTotal.WithLabelValues("pol", "hot"))
		for _, why := range []string{metrics.ReturnExpiry, metrics.ReturnRenewal, metrics.ReturnPolicyChange, metrics.ReturnShutdown} {
			back += counter(m.Lease.ReturnedTokensTotal.WithLabelValues("pol", "hot", why))
		}
		failed += failedStoreCalls(t, regs[i])
	}
	wasted := float64(failed) * math.Ceil(engine.DefaultLeaseMaxFraction*float64(lim.Capacity()))
	fill := time.Duration(float64(lim.Capacity()) / float64(lim.Requests) * float64(time.Second))
	taken, covered := refilledWhileRefused(refused, fill*9/10, float64(lim.Requests))
	if lower := taken - back - lost - wasted; float64(got) < lower {
		t.Errorf("admitted %d in %v; Redis refused requests while it refilled %.0f tokens, of which %.0f came back from leases, %.0f were lost and at most %.0f went to %d failed calls: want at least %.0f admitted",
			got, run, taken, back, lost, wasted, failed, lower)
	}
	t.Logf("admitted %d of %d decided in %v: %.4f of L*T, bound L*T + burst = %.0f; Redis refused %d requests, closely enough to count %.0f refilled tokens over %v (%.0f came back, %.0f lost, %d failed calls); %d more on the fallback bucket",
		got, decided.Load(), run, float64(got)/lt, float64(lim.Capacity())+lt, len(refused), taken, covered, back, lost, failed, fallback.Load())
}

// span is when a decision started and when it was answered.
type span struct{ from, to time.Time }

// refilledWhileRefused returns how many tokens, at rate a second, a bucket
// certainly refilled between refusals that lie at most within apart of
// each other (less than its fill time, so that it never reached its
// capacity in between), each refusal known only to lie in its span, and
// how long those stretches last in all. One token is allowed for each
// stretch: a refusal leaves less than one in the bucket, not none.
func refilledWhileRefused(refused []span, within time.Duration, rate float64) (tokens float64, covered time.Duration) {
	slices.SortFunc(refused, func(a, b span) int { return a.from.Compare(b.from) })
	for i := 0; i < len(refused); {
		a := refused[i]
		// The furthest refusal certainly after a and certainly within
		// reach of it.
		j := -1
		for k := i + 1; k < len(refused) && refused[k].to.Sub(a.from) <= within; k++ {
			if refused[k].from.After(a.to) {
				j = k
			}
		}
		if j < 0 {
			i++
			continue
		}
		d := refused[j].from.Sub(a.to)
		tokens += rate*d.Seconds() - 1
		covered += d
		i = j
	}
	return tokens, covered
}
