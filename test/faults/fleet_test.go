package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/lateness"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// sidecar is one replica's decision path as floodgate-sidecar builds it:
// the engine (deny cache, fallback buckets) on its own Redis store client,
// whose calls it records.
type sidecar struct {
	name  string
	store *redisstore.Store
	calls *callLog
	eng   *engine.Engine
	m     *metrics.Metrics
}

// storeCall is one call the engine made to the store.
type storeCall struct {
	at    time.Time
	shard string
	took  time.Duration
	err   error
}

// callLog is a limiter.Store that records the calls to the store it wraps.
type callLog struct {
	s  limiter.Store
	mu sync.Mutex
	cs []storeCall
}

// Take implements limiter.Store. A call made for a decided request (see
// sidecar.decide) is also recorded on the request's trace.
func (l *callLog) Take(ctx context.Context, req limiter.Request) (limiter.Decision, string, error) {
	start := time.Now()
	d, shard, err := l.s.Take(ctx, req)
	c := storeCall{at: start, shard: shard, took: time.Since(start), err: err}
	l.mu.Lock()
	l.cs = append(l.cs, c)
	l.mu.Unlock()
	if tr, ok := ctx.Value(traceKey{}).(*trace); ok {
		tr.add(c)
	}
	return d, shard, err
}

// traceKey is the context key of a decided request's trace.
type traceKey struct{}

// trace is what one decided request did: the store calls it made itself
// (a request that waited for another's call on its key makes none).
type trace struct {
	mu    sync.Mutex
	calls []storeCall
}

func (tr *trace) add(c storeCall) {
	tr.mu.Lock()
	tr.calls = append(tr.calls, c)
	tr.mu.Unlock()
}

// String describes the call.
func (c storeCall) String() string {
	return fmt.Sprintf("{%s took %v: %v}", c.shard, c.took, c.err)
}

// between returns the calls that started in [from, to].
func (l *callLog) between(from, to time.Time) []storeCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []storeCall
	for _, c := range l.cs {
		if !c.at.Before(from) && !c.at.After(to) {
			out = append(out, c)
		}
	}
	return out
}

// unanswered counts the calls to shard, started before before, that were
// sent and got no answer (a timeout, a lost connection): the store says
// they may have run, once.
func (l *callLog) unanswered(shard string, before time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.cs {
		if c.err == nil || c.shard != shard || !c.at.Before(before) {
			continue
		}
		if msg := c.err.Error(); strings.Contains(msg, "may have run") || strings.Contains(msg, "no answer within the call deadline") {
			n++
		}
	}
	return n
}

// newSidecar builds a sidecar on cluster c's seeds with opts.
func newSidecar(t testing.TB, name string, c *redistest.Cluster, opts redisstore.Options) *sidecar {
	t.Helper()
	opts.Addrs = c.Addrs()
	opts.Password = c.Password()
	opts.ClientName = "floodgate-sidecar:" + name
	s, err := redisstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	fb, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	calls := &callLog{s: s}
	// As the sidecar builds it: a decision's budget is the store's call
	// deadline.
	e, err := engine.New(engine.Options{Store: calls, StoreName: "redis", Fallback: fb, Metrics: m, Parallel: true, Budget: s.Timeout()})
	if err != nil {
		t.Fatal(err)
	}
	return &sidecar{name: name, store: s, calls: calls, eng: e, m: m}
}

// newFleet builds n sidecars, named prefix-0 to prefix-n-1, on cluster c
// with opts, and the rule each enforces as one of n replicas sharing the
// fail-open limit lim.
func newFleet(t testing.TB, c *redistest.Cluster, prefix string, n int, opts redisstore.Options, lim limiter.Limit) ([]*sidecar, []*engine.Rule) {
	t.Helper()
	fleet := make([]*sidecar, n)
	rules := make([]*engine.Rule, n)
	for i := range n {
		fleet[i] = newSidecar(t, fmt.Sprintf("%s-%d", prefix, i), c, opts)
		rules[i] = fleet[i].rule(t, lim, int32(n), false)
	}
	return fleet, rules
}

// warmUp has every sidecar of fleet decide on each key until the store
// answers, so that a test starts with every connection up.
func warmUp(t testing.TB, fleet []*sidecar, rules []*engine.Rule, keys ...string) {
	t.Helper()
	for i, sc := range fleet {
		for _, k := range keys {
			deadline := time.Now().Add(30 * time.Second)
			for sc.decide(t.Context(), i, rules[i], k, nil).source != engine.FromStore {
				if time.Now().After(deadline) {
					t.Fatal("the store never answered the warm-up")
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}

// rule builds the rule every replica of a fleet of replicas enforces.
func (sc *sidecar) rule(t testing.TB, lim limiter.Limit, replicas int32, failClosed bool) *engine.Rule {
	t.Helper()
	r, err := engine.NewRule("faults", "r", lim, replicas, failClosed, false, sc.m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// decision is one decided request.
type decision struct {
	sidecar int
	at      time.Time // when Decide was called
	took    time.Duration
	outcome engine.Outcome
	source  engine.Source
	// calls are the store calls the request made itself.
	calls []storeCall
}

// story tells what a decision waited for: the store calls it made, each
// from when it started after the decision's arrival, or that it made none
// (it waited for another request's call on its key, or was decided
// locally).
func (d decision) story() string {
	if len(d.calls) == 0 {
		return "no store call of its own"
	}
	var b strings.Builder
	for i, c := range d.calls {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "a store call started %v after its arrival took %v (%v)",
			c.at.Sub(d.at).Round(10*time.Microsecond), c.took.Round(10*time.Microsecond), c.err)
	}
	return b.String()
}

// record collects decisions from concurrent callers, and the spans of
// its schedule that a driver skipped because the machine stalled it.
type record struct {
	mu    sync.Mutex
	ds    []decision
	skips []skip
}

// skip is a span of one sidecar's schedule whose requests the driver never
// sent: the machine held the driver past them (see drive).
type skip struct {
	sidecar  int
	from, to time.Time
}

func (r *record) add(d decision) {
	r.mu.Lock()
	r.ds = append(r.ds, d)
	r.mu.Unlock()
}

func (r *record) skipped(sc int, from, to time.Time) {
	r.mu.Lock()
	r.skips = append(r.skips, skip{sidecar: sc, from: from, to: to})
	r.mu.Unlock()
}

// scheduled returns how long sidecar sc's driver kept to its schedule
// within [from, to]: the span less what it skipped there.
func (r *record) scheduled(sc int, from, to time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := to.Sub(from)
	for _, s := range r.skips {
		if s.sidecar != sc {
			continue
		}
		a, b := s.from, s.to
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if lost := b.Sub(a); lost > 0 {
			d -= lost
		}
	}
	return d
}

func (r *record) all() []decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ds)
}

// decide decides one request on key under rule and records it.
func (sc *sidecar) decide(ctx context.Context, i int, r *engine.Rule, key string, rec *record) decision {
	var v engine.Verdict
	tr := &trace{}
	ctx = context.WithValue(ctx, traceKey{}, tr)
	start := time.Now()
	sc.eng.Decide(ctx, []engine.Hit{{Rule: r, Key: key, Cost: 1}}, &v)
	d := decision{sidecar: i, at: start, took: time.Since(start), outcome: v.Outcome, source: v.Results[0].Source}
	tr.mu.Lock()
	d.calls = tr.calls
	tr.mu.Unlock()
	if rec != nil {
		rec.add(d)
	}
	return d
}

// drive has every sidecar decide requests on key, each at rate per second
// (open loop: a request is sent on schedule whether or not the last one
// has been answered, as independent clients do), until stop is closed.
// A driver the machine holds more than 100ms past its schedule resumes
// from the present instead of bursting to catch up, and records the span
// it skipped in rec.
func drive(ctx context.Context, fleet []*sidecar, rules []*engine.Rule, key string, rate float64, rec *record, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / rate)
	for i, sc := range fleet {
		wg.Go(func() {
			var inner sync.WaitGroup
			defer inner.Wait()
			next := time.Now()
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Until(next)):
				}
				inner.Go(func() { sc.decide(ctx, i, rules[i], key, rec) })
				next = next.Add(interval)
				if now := time.Now(); now.Sub(next) > 100*time.Millisecond {
					rec.skipped(i, next, now) // the machine stalled: do not burst to catch up
					next = now
				}
			}
		})
	}
	return &wg
}

// counts sums decisions by outcome and source.
func counts(ds []decision) map[string]int {
	out := map[string]int{}
	for _, d := range ds {
		out[d.outcome.String()+"/"+d.source.String()]++
	}
	return out
}

// admitted counts the allowed decisions.
func admitted(ds []decision) int {
	n := 0
	for _, d := range ds {
		if d.outcome == engine.Allow {
			n++
		}
	}
	return n
}

// maxTook returns the slowest decision.
func maxTook(ds []decision) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d.took)
	}
	return m
}

func percentile(ds []decision, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	t := make([]time.Duration, len(ds))
	for i, d := range ds {
		t[i] = d.took
	}
	slices.Sort(t)
	return t[min(len(t)-1, int(float64(len(t))*p))]
}

// startProbe starts measuring the machine's lateness, with sleepers of
// the store's default call budget, and watching the running nodes among
// nodes (see test/lateness).
func startProbe(nodes ...*redistest.Node) *lateness.Probe {
	var pids []int
	for _, n := range nodes {
		if pid := n.Pid(); pid > 0 {
			pids = append(pids, pid)
		}
	}
	return lateness.Start(lateness.Options{Sleep: redisstore.DefaultTimeout, PIDs: pids})
}

// keyOn returns a counter key (the engine's Hit.Key) whose slot master m
// holds.
func keyOn(t testing.TB, c *redistest.Cluster, m *redistest.Node, tag string) string {
	t.Helper()
	for i := range 100000 {
		key := fmt.Sprintf("%s:%s:%d", t.Name(), tag, i)
		owner, err := c.MasterForSlot(t.Context(), redislayout.KeySlot(key))
		if err != nil {
			t.Fatal(err)
		}
		if owner == m {
			return key
		}
	}
	t.Fatalf("no key on %v", m)
	return ""
}

// waitUntil polls cond every 20ms until it holds, and reports whether it
// did within timeout. The timeout only bounds a hang: a test waits on the
// state it needs, never for a guessed time.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// storeAgain reports whether every one of sidecars has decided a request,
// that arrived after since, from the store or from the deny cache the
// store's answers fill.
func (r *record) storeAgain(sidecars int, since time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	back := make([]bool, sidecars)
	left := sidecars
	// Decisions are added as they end: the ones that arrived after since
	// are among the last, back to those that ended well before it.
	for i := len(r.ds) - 1; i >= 0; i-- {
		d := r.ds[i]
		if d.at.Add(d.took).Before(since.Add(-time.Second)) {
			break
		}
		if back[d.sidecar] || d.at.Before(since) || (d.source != engine.FromStore && d.source != engine.FromDenyCache) {
			continue
		}
		back[d.sidecar] = true
		if left--; left == 0 {
			return true
		}
	}
	return false
}
