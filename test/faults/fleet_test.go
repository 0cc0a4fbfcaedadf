package faults

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	rtmetrics "runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
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

// noise measures how late this process's goroutines run on the shared
// machine: goroutines sleep as long as a call budget, staggered so that one
// wakes about every millisecond, and record when, and how much later than
// asked, they woke. They wait as a store call waits for its deadline, among
// the same goroutines. A timing bound in this package is the promise plus
// the lateness measured around the decision it bounds (excuse), so that a machine
// busy with other work does not fail it, while a stall of floodgate's own
// (waiting several call budgets) still does: the sleepers are not late
// then. With them, it reads the runtime's own measurement of how long
// runnable goroutines waited for a processor (/sched/latencies), which on
// a starved machine exceeds the timers' lateness, and the kernel's of how
// long each thread of the process (and each Redis node it is asked to
// watch) waited for a CPU, which adds up over a span on a machine where
// the process gets a fraction of a core.
type noise struct {
	mu      sync.Mutex
	samples []lateSample
	maxLate time.Duration // the worst lateness, once the samples are sorted
	// runq are the Go runtime's own measurements of how long runnable
	// goroutines waited to run (/sched/latencies), per interval of
	// runqEvery, in the order of their ends; osq the kernel's, of how
	// long each thread of the process, and each watched Redis node,
	// waited for a CPU while runnable (their schedstat).
	runq    []runqSample
	osq     []threadSample
	stop    chan struct{}
	done    chan struct{}
	endOnce sync.Once
}

// lateSample is one sleep: it ran from start to end, late by late.
type lateSample struct {
	start, end time.Time
	late       time.Duration
}

// runqSample is the longest time a goroutine waited in the run queue, as
// the runtime measured it (the lower bound of the highest histogram bucket
// that grew), over (from, to].
type runqSample struct {
	from, to time.Time
	worst    time.Duration
}

// threadSample is how long each thread of the process waited runnable for
// a CPU over (from, to], as the kernel counted it; worst is the longest of
// those waits. Threads that did not wait are left out.
type threadSample struct {
	from, to time.Time
	waits    map[string]time.Duration
	worst    time.Duration
}

// runqEvery is how often the run-queue measurement is read.
const runqEvery = 2 * time.Millisecond

// startNoise starts measuring; the Redis nodes among others, if any, are
// watched too (see redisHeld).
func startNoise(others ...*redistest.Node) *noise {
	n := &noise{stop: make(chan struct{}), done: make(chan struct{})}
	var pids []int
	for _, o := range others {
		if pid := o.Pid(); pid > 0 {
			pids = append(pids, pid)
		}
	}
	const sleep = redisstore.DefaultTimeout
	sleepers := int(sleep / time.Millisecond)
	var wg sync.WaitGroup
	// A goroutine woken (by a timer, a channel) or preempted waits in a
	// run queue until a processor takes it: on a machine this busy, at
	// times longer than the sleepers' timers are late. The runtime
	// measures that wait itself (for a sample of goroutines); read it
	// every couple of milliseconds.
	wg.Go(func() {
		s := []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}}
		rtmetrics.Read(s)
		prev := slices.Clone(s[0].Value.Float64Histogram().Counts)
		from := time.Now()
		for {
			select {
			case <-n.stop:
				return
			case <-time.After(runqEvery):
			}
			rtmetrics.Read(s)
			h := s[0].Value.Float64Histogram()
			to := time.Now()
			var worst time.Duration
			for i := len(h.Counts) - 1; i >= 0; i-- {
				if h.Counts[i] > prev[i] {
					if b := h.Buckets[i]; b > 0 && !math.IsInf(b, 0) {
						worst = time.Duration(b * float64(time.Second))
					}
					break
				}
			}
			copy(prev, h.Counts)
			n.mu.Lock()
			n.runq = append(n.runq, runqSample{from: from, to: to, worst: worst})
			n.mu.Unlock()
			from = to
		}
	})
	// A thread of the process that the kernel leaves waiting for a CPU
	// stalls the goroutine it runs, the timers of its processor and any
	// lock that goroutine holds, while the other threads (and sleepers)
	// go on. The kernel counts each thread's time spent runnable but not
	// running; read it every few milliseconds.
	wg.Go(func() {
		prev := threadWaits(nil, pids)
		from := time.Now()
		for {
			select {
			case <-n.stop:
				return
			case <-time.After(runqEvery):
			}
			cur := threadWaits(prev, pids)
			to := time.Now()
			ts := threadSample{from: from, to: to}
			for tid, w := range cur {
				if p, ok := prev[tid]; ok && w > p {
					if ts.waits == nil {
						ts.waits = map[string]time.Duration{}
					}
					ts.waits[tid] = w - p
					if !strings.HasPrefix(tid, redisThread) {
						ts.worst = max(ts.worst, w-p)
					}
				}
			}
			prev = cur
			n.mu.Lock()
			n.osq = append(n.osq, ts)
			n.mu.Unlock()
			from = to
		}
	})
	for i := range sleepers {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * time.Millisecond)
			for {
				select {
				case <-n.stop:
					return
				default:
				}
				start := time.Now()
				time.Sleep(sleep)
				end := time.Now()
				n.mu.Lock()
				n.samples = append(n.samples, lateSample{start: start, end: end, late: end.Sub(start) - sleep})
				n.mu.Unlock()
			}
		})
	}
	go func() {
		wg.Wait()
		n.mu.Lock()
		slices.SortFunc(n.samples, func(a, b lateSample) int { return a.end.Compare(b.end) })
		for _, s := range n.samples {
			n.maxLate = max(n.maxLate, s.late)
		}
		n.mu.Unlock()
		close(n.done)
	}()
	return n
}

// end stops the measurement; it may be called more than once.
func (n *noise) end() {
	n.endOnce.Do(func() { close(n.stop) })
	<-n.done
}

// during returns the worst lateness of the sleeps that overlap [from, to].
func (n *noise) during(from, to time.Time) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	i, _ := slices.BinarySearchFunc(n.samples, from, func(s lateSample, t time.Time) int { return s.end.Compare(t) })
	// The samples are in the order of their ends: one that began by to
	// ends by to + its sleep + its lateness, so the scan goes that far
	// (a late sample, which matters most, ends after punctual ones that
	// began later).
	horizon := to.Add(redisstore.DefaultTimeout + n.maxLate)
	var worst time.Duration
	for ; i < len(n.samples) && !n.samples[i].end.After(horizon); i++ {
		if s := n.samples[i]; !s.start.After(to) {
			worst = max(worst, s.late)
		}
	}
	return worst
}

// excuse returns what a decision that ran from at for took may exceed its
// bound by, on account of the machine: the worst lateness of the sleeps
// that overlap it (from just before it started, when a stall may already
// have held it up), which is how late its own timer may have fired, and
// how long the machine held it runnable: the longest wait of a runnable
// goroutine for a processor in the same span, as the runtime measured it,
// or the longest a thread of the process waited for a CPU in the span, as
// the kernel counted it, whichever is longer. A thread's waits are summed
// over the whole span, not taken one interval at a time: the decision's
// goroutine (or the one holding a lock it waits for) runs on a thread for
// the span, and a thread the kernel leaves waiting again and again holds
// it for every one of those waits; on a loaded machine they add up to
// more than any single one.
func (n *noise) excuse(at time.Time, took time.Duration) time.Duration {
	from, to := at.Add(-10*time.Millisecond), at.Add(took)
	g, _, held := n.runqDuring(from, to)
	return n.during(from, to) + max(g, held)
}

// stall returns the longest the machine held this process's goroutines up
// at once in [from, to]: the sleepers' worst lateness, and the longest
// single run-queue wait of a goroutine or of a thread. It bounds how far
// one stall can have pushed events together, where excuse bounds how
// late one decision can have been.
func (n *noise) stall(from, to time.Time) time.Duration {
	g, th, _ := n.runqDuring(from, to)
	return n.during(from, to) + max(g, th)
}

// runqDuring returns the longest run-queue wait the runtime measured in
// the intervals that overlap [from, to], the longest the kernel left a
// thread of the process waiting for a CPU in one of them, and the most
// one thread waited in all of them together.
func (n *noise) runqDuring(from, to time.Time) (goroutines, threads, held time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i, _ := slices.BinarySearchFunc(n.osq, from, func(s threadSample, t time.Time) int { return s.to.Compare(t) })
	sums := map[string]time.Duration{}
	for ; i < len(n.osq) && !n.osq[i].from.After(to); i++ {
		threads = max(threads, n.osq[i].worst)
		for tid, w := range n.osq[i].waits {
			if strings.HasPrefix(tid, redisThread) {
				continue
			}
			sums[tid] += w
			held = max(held, sums[tid])
		}
	}
	return worstIn(n.runq, from, to), threads, held
}

// redisHeld returns the most the kernel left one of the watched Redis
// nodes waiting for a CPU, in all over [from, to]: how much later than
// on an idle machine the node can have answered a client, or passed on
// news of the cluster, in that span.
func (n *noise) redisHeld(from, to time.Time) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	i, _ := slices.BinarySearchFunc(n.osq, from, func(s threadSample, t time.Time) int { return s.to.Compare(t) })
	sums := map[string]time.Duration{}
	var held time.Duration
	for ; i < len(n.osq) && !n.osq[i].from.After(to); i++ {
		for tid, w := range n.osq[i].waits {
			if strings.HasPrefix(tid, redisThread) {
				sums[tid] += w
				held = max(held, sums[tid])
			}
		}
	}
	return held
}

// worstIn returns the worst of the samples of ss, in the order of their
// ends, that overlap [from, to].
func worstIn(ss []runqSample, from, to time.Time) time.Duration {
	i, _ := slices.BinarySearchFunc(ss, from, func(s runqSample, t time.Time) int { return s.to.Compare(t) })
	var worst time.Duration
	for ; i < len(ss) && !ss[i].from.After(to); i++ {
		worst = max(worst, ss[i].worst)
	}
	return worst
}

// worstRunq returns the longest run-queue waits of the whole run: the
// runtime's, and the kernel's for a thread of the process.
func (n *noise) worstRunq() (goroutines, threads time.Duration) {
	g, th, _ := n.runqDuring(time.Time{}, time.Now().Add(time.Hour))
	return g, th
}

// threadWaits returns, by thread id, how long each thread of the process
// has waited runnable for a CPU (the second field of its schedstat), and
// each process of pids, by "pid:" and its id, its main thread (the one
// that serves a Redis node's clients), in a map sized after the last one,
// m. Threads it cannot read are left out.
func threadWaits(m map[string]time.Duration, pids []int) map[string]time.Duration {
	out := make(map[string]time.Duration, len(m))
	read := func(key, path string) {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return
		}
		if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			out[key] = time.Duration(ns)
		}
	}
	for _, pid := range pids {
		p := strconv.Itoa(pid)
		read(redisThread+p, "/proc/"+p+"/schedstat")
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return out
	}
	for _, task := range tasks {
		read(task.Name(), "/proc/self/task/"+task.Name()+"/schedstat")
	}
	return out
}

// redisThread prefixes a watched Redis node's key among the threads.
const redisThread = "pid:"

// worst returns the worst lateness of the whole run.
func (n *noise) worst() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	var w time.Duration
	for _, s := range n.samples {
		w = max(w, s.late)
	}
	return w
}

// keyOn returns a counter key (the engine's Hit.Key) whose slot master m
// holds.
func keyOn(t testing.TB, c *redistest.Cluster, m *redistest.Node, tag string) string {
	t.Helper()
	for i := range 100000 {
		key := fmt.Sprintf("%s:%s:%d", t.Name(), tag, i)
		owner, err := c.MasterForSlot(t.Context(), redisstore.KeySlot(key))
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

// loggedAt returns when node n last logged a line containing msg in its
// redis.log, by the log's own timestamp ("4242:M 05 Dec 2026 23:41:42.123
// * msg"): the instant of an event of the node's, which a client reacts
// to, as the node saw it (the same clock as this process's).
func loggedAt(n *redistest.Node, msg string) (time.Time, error) {
	b, err := os.ReadFile(filepath.Join(n.Dir(), "redis.log"))
	if err != nil {
		return time.Time{}, err
	}
	const layout = "02 Jan 2006 15:04:05.000"
	var at time.Time
	for line := range strings.Lines(string(b)) {
		if !strings.Contains(line, msg) {
			continue
		}
		_, rest, ok := strings.Cut(line, " ")
		if !ok || len(rest) < len(layout) {
			return time.Time{}, fmt.Errorf("%s: no timestamp in log line %q", n.Addr(), line)
		}
		if at, err = time.ParseInLocation(layout, rest[:len(layout)], time.Local); err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", n.Addr(), err)
		}
	}
	if at.IsZero() {
		return time.Time{}, fmt.Errorf("%s logged no %q", n.Addr(), msg)
	}
	return at, nil
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
