// Command floodgate-splitbench measures a split counter where it is meant
// to be used: one key whose traffic is beyond what one Redis shard can
// answer. In one run, on one 3-master Redis Cluster on loopback:
//
//  1. The floor: one key, neither split nor leased, decided through
//     floodgate's engine and Redis store (batched, as a sidecar runs it)
//     by -callers concurrent callers for -duration. The decisions per
//     second are what one shard answers for one key here; the master's
//     CPU use over the window shows whether it was saturated.
//  2. The split: the same kind of key with split 3 and leases, at a limit
//     of -factor times that floor per second, decided by -sidecars
//     engines (each with a store client of its own, as separate sidecars
//     have), offered -offered times the limit in an open loop for
//     -duration. It reports the admitted total against L·T + burst and
//     0.98 L·T, the decisions answered locally, on a lease, and by Redis,
//     the script calls per master and each master's Redis CPU.
//
// When taskset is available the redis-server processes run on CPU 1 and
// this process on CPU 0. Run it on an otherwise idle machine:
//
//	go run ./bench/cmd/floodgate-splitbench -duration 10s
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/bench/harness"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "floodgate-splitbench:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	duration time.Duration
	callers  int
	sidecars int
	workers  int
	factor   float64
	offered  float64
	split    int
	json     bool
}

func run(args []string, stdout, stderr io.Writer) error {
	var c config
	fs := flag.NewFlagSet("floodgate-splitbench", flag.ContinueOnError)
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "length of each phase")
	fs.IntVar(&c.callers, "callers", 256, "concurrent callers of the floor phase")
	fs.IntVar(&c.sidecars, "sidecars", 8, "engines, each with its own store client, in the split phase")
	fs.IntVar(&c.workers, "workers", 4, "goroutines deciding on each engine in the split phase (a sidecar serves many requests at once)")
	fs.Float64Var(&c.factor, "factor", 10, "the split key's limit, in multiples of the floor's decisions per second")
	fs.Float64Var(&c.offered, "offered", 1.5, "offered load of the split phase, in multiples of its limit")
	fs.IntVar(&c.split, "split", 3, "sub-counters of the split key")
	fs.BoolVar(&c.json, "json", false, "write the report as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.duration < time.Second || c.callers < 1 || c.sidecars < 1 || c.workers < 1 || c.factor <= 0 || c.offered <= 0 || c.split < 2 {
		return errors.New("-duration must be at least 1s; -callers, -sidecars and -factor positive; -split at least 2")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := measure(ctx, c, stderr)
	if err != nil {
		return err
	}
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.print(stdout)
	return nil
}

// Report is one run's figures.
type Report struct {
	Pinning     string  `json:"pinning"`
	LoadAverage string  `json:"loadAverage"`
	Seconds     float64 `json:"seconds"`
	Callers     int     `json:"floorCallers"`
	// Floor: one key on one shard, unsplit and unleased.
	FloorDecisionsPerSec float64 `json:"floorDecisionsPerSec"`
	FloorScriptCalls     int64   `json:"floorScriptCalls"`
	FloorMasterCPU       float64 `json:"floorMasterCpuShare"` // CPU-seconds per second of the key's master
	FloorErrors          int64   `json:"floorErrors"`
	// CeilingPerSec is redis-benchmark's pipelined EVALSHA of the same
	// script on one key of the key's master, with its CPU share.
	CeilingPerSec    float64 `json:"ceilingPerSec"`
	CeilingMasterCPU float64 `json:"ceilingMasterCpuShare"`
	// ShardCapacity is the larger of the two: what one shard answers for
	// one key at most. The split key's limit is a multiple of it.
	ShardCapacity float64 `json:"shardCapacityPerSec"`
	// Split: one key over K sub-counters with leases, at Limit per second.
	Split          int     `json:"split"`
	Limit          int64   `json:"limitPerSec"`
	OfferedPerSec  float64 `json:"offeredPerSec"`
	AchievedPerSec float64 `json:"achievedPerSec"`
	// SelfCPU is this process's CPU-seconds per second over the split
	// phase: near 1 with GOMAXPROCS=1 means the engines and the load
	// generator used all of their core.
	SelfCPU          float64   `json:"selfCpuShare"`
	Decided          int64     `json:"decided"`
	Admitted         int64     `json:"admitted"`
	AdmittedPerSec   float64   `json:"admittedPerSec"`
	UpperBound       int64     `json:"upperBound"` // L·T + burst
	LowerBound       int64     `json:"lowerBound"` // 0.98 L·T
	Sources          [6]int64  `json:"sources"`    // by engine.Source
	ScriptCalls      []int64   `json:"scriptCallsPerMaster"`
	MasterCPU        []float64 `json:"masterCpuSeconds"`
	MasterCPURatio   float64   `json:"masterCpuMaxOverMin"`
	FloorMultiple    float64   `json:"admittedOverFloor"`
	SplitElapsedSecs float64   `json:"splitSeconds"`
	// Leases sums the sidecars' lease counters (calls by result, granted,
	// returned and lost tokens), read after they stopped.
	Leases map[string]float64 `json:"leases"`
}

func (r *Report) print(w io.Writer) {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) } // a lost line only loses output
	p("floodgate-splitbench  %s  loadavg %s\n  pinning: %s\n\n", runtime.Version(), r.LoadAverage, r.Pinning)
	p("Floor: one key on one shard, not split, not leased (%.0fs)\n", r.Seconds)
	p("  floodgate's store, %d callers: %.0f decisions/s answered by Redis (%d script calls, %d errors); the key's master used %.0f%% of a core\n",
		r.Callers,
		r.FloorDecisionsPerSec, r.FloorScriptCalls, r.FloorErrors, 100*r.FloorMasterCPU)
	p("  redis-benchmark EVALSHA of the same script on that key, -P %d: %.0f/s, the master at %.0f%% of a core\n", ceilingPipeline, r.CeilingPerSec, 100*r.CeilingMasterCPU)
	p("  one shard answers one key at most %.0f/s here\n\n", r.ShardCapacity)
	p("Split: one key, split %d with leases, limit %d/s (%.1fx one shard), offered %.0f/s (achieved %.0f/s) for %.1fs\n", r.Split, r.Limit,
		float64(r.Limit)/r.ShardCapacity, r.OfferedPerSec, r.AchievedPerSec, r.SplitElapsedSecs)
	p("  decided %d, admitted %d (%.0f/s = %.1fx one shard); bounds: at most %d (L·T + burst), at least %d (0.98 L·T)\n",
		r.Decided, r.Admitted, r.AdmittedPerSec, r.FloorMultiple, r.UpperBound, r.LowerBound)
	p("  decided by: lease %d, Redis %d, deny cache %d, fallback %d, nowhere %d\n",
		r.Sources[engine.FromLease], r.Sources[engine.FromStore], r.Sources[engine.FromDenyCache], r.Sources[engine.FromFallback], r.Sources[engine.FromNowhere])
	p("  leases: %.0f calls, %.0f tokens granted (%.0f per call), %.0f returned, %.0f lost\n", r.Leases["lease_calls_total"], r.Leases["lease_granted_tokens_total"],
		r.Leases["lease_granted_tokens_total"]/max(1, r.Leases["lease_calls_total"]), r.Leases["lease_returned_tokens_total"], r.Leases["lease_lost_tokens_total"])
	p("  script calls per master %v; Redis CPU per master %s s (max/min %.2f)\n\n", r.ScriptCalls, fmtFloats(r.MasterCPU), r.MasterCPURatio)
	pass := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "FAIL"
	}
	p("Acceptance\n")
	p("  [%s] the split key's limit is at least 10x what one shard answers for one key: %.1fx\n", pass(float64(r.Limit) >= 10*r.ShardCapacity), float64(r.Limit)/r.ShardCapacity)
	if r.AchievedPerSec < float64(r.Limit) {
		p("  [FLOOR] the engines and load generator offered %.0f/s, below the limit %d/s, at %.0f%% of their core: this machine cannot offer more here\n",
			r.AchievedPerSec, r.Limit, 100*r.SelfCPU)
		p("  [%s] admitted exactly what was offered below the limit: %d of %d, none on the fallback, at most %d\n",
			pass(r.Admitted == r.Decided && r.Admitted <= r.UpperBound && r.Sources[engine.FromFallback] == 0), r.Admitted, r.Decided, r.UpperBound)
	} else {
		p("  [%s] admitted exactly: %d within [%d, %d], none on the fallback\n", pass(r.exact()), r.Admitted, r.LowerBound, r.UpperBound)
	}
	p("  [%s] Redis CPU per master within 1.3x of each other: %.2f\n", pass(r.MasterCPURatio > 0 && r.MasterCPURatio <= 1.3), r.MasterCPURatio)
}

func (r *Report) exact() bool {
	return r.Admitted <= r.UpperBound && r.Admitted >= r.LowerBound && r.Sources[engine.FromFallback] == 0
}

func fmtFloats(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func logf(w io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(w, format+"\n", args...) // progress lines
}

func measure(ctx context.Context, c config, log io.Writer) (*Report, error) {
	rep := &Report{Seconds: c.duration.Seconds(), Callers: c.callers, Split: c.split, Pinning: "none (taskset missing or fewer than 2 CPUs)", Leases: map[string]float64{}}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		rep.LoadAverage = strings.TrimSpace(string(b))
	}
	logf(log, "starting a 3-master Redis Cluster")
	cluster, err := redistest.NewCluster(redistest.Options{Masters: 3})
	if err != nil {
		return nil, err
	}
	defer cluster.Close()
	masters, err := cluster.Masters(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("taskset"); err == nil && runtime.NumCPU() >= 2 {
		pinned := exec.Command("taskset", "-a", "-p", "-c", "0", strconv.Itoa(os.Getpid())).Run() == nil
		for _, n := range cluster.Nodes() {
			pinned = pinned && exec.Command("taskset", "-a", "-p", "-c", "1", strconv.Itoa(n.Pid())).Run() == nil
		}
		if pinned {
			runtime.GOMAXPROCS(1)
			rep.Pinning = "this process (engines and load) on CPU 0 with GOMAXPROCS=1; the redis-servers on CPU 1"
		}
	}

	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := measureFloor(ctx, c, cluster, "floor-"+run, rep, log); err != nil {
		return nil, err
	}
	if err := measureSplit(ctx, c, cluster, masters, "split-"+run, rep, log); err != nil {
		return nil, err
	}
	return rep, nil
}

// measureFloor measures what one shard answers for one key: floodgate's
// store with c.callers callers, then redis-benchmark's pipelined ceiling.
func measureFloor(ctx context.Context, c config, cluster *redistest.Cluster, floorKey string, rep *Report, log io.Writer) error {
	master, err := cluster.MasterForKey(ctx, redislayout.CounterKey(floorKey, limiter.TokenBucket))
	if err != nil {
		return err
	}
	fe, closeFloor, err := newSidecar(cluster, false)
	if err != nil {
		return err
	}
	fr, err := newRule(fe.m, limiter.MaxRequests, false, 1)
	if err != nil {
		return err
	}
	warm(ctx, fe.e, fr, floorKey)
	calls0, cpu0, err := masterStats(ctx, master)
	if err != nil {
		return err
	}
	logf(log, "floor: %d callers on one key for %v", c.callers, c.duration)
	var decided, errs atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range c.callers {
		wg.Go(func() {
			var v engine.Verdict
			hits := []engine.Hit{{Rule: fr, Key: floorKey, Cost: 1}}
			for time.Since(start) < c.duration && ctx.Err() == nil {
				fe.e.Decide(ctx, hits, &v)
				if v.Results[0].Source == engine.FromStore {
					decided.Add(1)
				} else {
					errs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	calls1, cpu1, err := masterStats(ctx, master)
	if err != nil {
		return err
	}
	closeFloor()
	rep.FloorDecisionsPerSec = float64(decided.Load()) / el
	rep.FloorScriptCalls, rep.FloorMasterCPU, rep.FloorErrors = calls1-calls0, (cpu1-cpu0)/el, errs.Load()
	if rep.FloorDecisionsPerSec <= 0 {
		return fmt.Errorf("floor: no decision answered by Redis (%d errors)", rep.FloorErrors)
	}

	cpu0 = nodeCPU(ctx, master)
	if rep.CeilingPerSec, err = ceiling(ctx, master, cluster.Password(), floorKey, strings.HasPrefix(rep.Pinning, "this process")); err != nil {
		return err
	}
	rep.CeilingMasterCPU = (nodeCPU(ctx, master) - cpu0) / (float64(ceilingRequests) / rep.CeilingPerSec)
	rep.ShardCapacity = max(rep.FloorDecisionsPerSec, rep.CeilingPerSec)
	return nil
}

// measureSplit decides one key split over c.split sub-counters with leases,
// at c.factor times the shard's capacity, from c.sidecars engines.
func measureSplit(ctx context.Context, c config, cluster *redistest.Cluster, masters []*redistest.Node, key string, rep *Report, log io.Writer) error {
	var err error
	limit := int64(math.Ceil(c.factor * rep.ShardCapacity))
	if limit > limiter.MaxRequests {
		limit = limiter.MaxRequests
	}
	rep.Limit = limit
	rep.OfferedPerSec = c.offered * float64(limit)
	type sidecar struct {
		e    *fleetEngine
		r    *engine.Rule
		stop func()
	}
	scs := make([]sidecar, c.sidecars)
	for i := range scs {
		fe, stop, err := newSidecar(cluster, true)
		if err != nil {
			return err
		}
		r, err := newRule(fe.m, limit, true, c.split)
		if err != nil {
			return err
		}
		scs[i] = sidecar{fe, r, stop}
	}
	rep.ScriptCalls, rep.MasterCPU = make([]int64, len(masters)), make([]float64, len(masters))
	for i, m := range masters {
		if rep.ScriptCalls[i], rep.MasterCPU[i], err = masterStats(ctx, m); err != nil {
			return err
		}
	}
	logf(log, "split: limit %d/s, %d sidecars of %d workers, offered %.0f/s for %v", limit, c.sidecars, c.workers, rep.OfferedPerSec, c.duration)
	// Open loop: every millisecond, each sidecar decides its share of the
	// offered rate. A tick that falls behind catches up on the next.
	var admitted, total atomic.Int64
	var sources [6]atomic.Int64
	perTick := rep.OfferedPerSec / 1000 / float64(c.sidecars*c.workers)
	self0, err := selfCPU()
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range c.sidecars * c.workers {
		s := scs[i%c.sidecars]
		wg.Go(func() {
			var v engine.Verdict
			hits := []engine.Hit{{Rule: s.r, Key: key, Cost: 1}}
			sent := 0.0
			for {
				el := time.Since(start)
				if el >= c.duration || ctx.Err() != nil {
					return
				}
				// A sidecar that fell behind by more than a tick's worth
				// does not make it up: the report gives the rate offered.
				due := perTick * float64(el/time.Millisecond+1)
				sent = max(sent, due-2*perTick)
				for ; sent < due; sent++ {
					s.e.e.Decide(ctx, hits, &v)
					total.Add(1)
					if v.Outcome == engine.Allow {
						admitted.Add(1)
					}
					if src := int(v.Results[0].Source); src < len(sources) {
						sources[src].Add(1)
					}
				}
				time.Sleep(time.Until(start.Add((el/time.Millisecond + 1) * time.Millisecond)))
			}
		})
	}
	wg.Wait()
	rep.SplitElapsedSecs = time.Since(start).Seconds()
	self1, err := selfCPU()
	if err != nil {
		return err
	}
	rep.SelfCPU = (self1 - self0).Seconds() / rep.SplitElapsedSecs
	for i, m := range masters {
		calls, cpu, err := masterStats(ctx, m)
		if err != nil {
			return err
		}
		rep.ScriptCalls[i], rep.MasterCPU[i] = calls-rep.ScriptCalls[i], cpu-rep.MasterCPU[i]
	}
	for _, s := range scs {
		s.stop()
	}
	for _, s := range scs {
		for name, v := range leaseCounters(s.e.reg) {
			rep.Leases[name] += v
		}
	}
	rep.Decided, rep.Admitted = total.Load(), admitted.Load()
	for i := range sources {
		rep.Sources[i] = sources[i].Load()
	}
	rep.AdmittedPerSec = float64(rep.Admitted) / rep.SplitElapsedSecs
	rep.AchievedPerSec = float64(rep.Decided) / rep.SplitElapsedSecs
	rep.FloorMultiple = rep.AdmittedPerSec / rep.ShardCapacity
	// A token bucket admits at most its capacity (burst = the limit here)
	// plus its refill over the run, and the run is as long as the
	// sidecars decided for.
	rep.UpperBound = limit + int64(float64(limit)*rep.SplitElapsedSecs)
	rep.LowerBound = int64(0.98 * float64(limit) * c.duration.Seconds())
	if lo, hi := slices.Min(rep.MasterCPU), slices.Max(rep.MasterCPU); lo > 0 {
		rep.MasterCPURatio = hi / lo
	}
	return nil
}

// fleetEngine is one simulated sidecar's engine and metrics.
type fleetEngine struct {
	e   *engine.Engine
	m   *metrics.Metrics
	reg *prometheus.Registry
}

// newSidecar builds an engine on a store client of its own, as a sidecar
// runs it, with leases when lease.
func newSidecar(cluster *redistest.Cluster, lease bool) (*fleetEngine, func(), error) {
	st, err := redisstore.New(redisstore.Options{Addrs: cluster.Addrs(), Password: cluster.Password(), BatchWindow: redisstore.DefaultBatchWindow})
	if err != nil {
		return nil, nil, err
	}
	fb, err := memstore.New()
	if err != nil {
		return nil, nil, err
	}
	reg := prometheus.NewRegistry()
	m := metrics.NewMetrics(reg)
	o := engine.Options{Store: st, StoreName: "redis", Fallback: fb, Metrics: m, Parallel: true}
	if lease {
		o.Leases = &engine.LeaseOptions{}
	}
	e, err := engine.New(o)
	if err != nil {
		_ = st.Close()
		return nil, nil, err
	}
	stop := func() {
		// Leases go back to Redis before the client closes.
		_ = e.Close(context.Background())
		_ = st.Close()
	}
	return &fleetEngine{e: e, m: m, reg: reg}, stop, nil
}

// newRule is a token bucket of limit per second, burst = limit.
func newRule(m *metrics.Metrics, limit int64, lease bool, split int) (*engine.Rule, error) {
	r, err := engine.NewRule("bench", "split", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: limit, Period: time.Second}, 1, false, false, m)
	if err != nil {
		return nil, err
	}
	if err := r.Spread(lease, split, m); err != nil {
		return nil, err
	}
	return r, nil
}

// warm makes the first store calls (slot map, script load) before timing,
// retrying while a busy machine makes them miss their deadline.
func warm(ctx context.Context, e *engine.Engine, r *engine.Rule, key string) {
	var v engine.Verdict
	for range 100 {
		e.Decide(ctx, []engine.Hit{{Rule: r, Key: key, Cost: 1}}, &v)
		if v.Results[0].Source == engine.FromStore {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// masterStats reads a node's script calls (INFO commandstats) and its
// CPU-seconds (INFO cpu: used_cpu_user + used_cpu_sys).
func masterStats(ctx context.Context, n *redistest.Node) (calls int64, cpu float64, err error) {
	info, err := n.Client().Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return 0, 0, fmt.Errorf("INFO on %s: %w", n.Addr(), err)
	}
	calls = harness.ScriptCalls(info)
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(rest, 64)
			cpu += f
		}
	}
	return calls, cpu, nil
}

// The redis-benchmark ceiling's pipeline depth, clients and requests.
const (
	ceilingPipeline = 16
	ceilingClients  = 32
	ceilingRequests = 1_000_000
)

// ceiling runs redis-benchmark's pipelined EVALSHA of the token bucket
// script on one key of its master (on CPU 0 beside this process when
// pinned) and returns the rate.
func ceiling(ctx context.Context, n *redistest.Node, password, key string, pinned bool) (float64, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return 0, errors.New("redis-benchmark not found: run `hack/redis-cluster.sh install`")
	}
	src, sha, _, _ := redislayout.TakeScript(limiter.TokenBucket)
	if _, err := n.Client().ScriptLoad(ctx, src).Result(); err != nil {
		return 0, fmt.Errorf("SCRIPT LOAD on %s: %w", n.Addr(), err)
	}
	p, err := limiter.NewParams(limiter.Limit{Algorithm: limiter.TokenBucket, Requests: limiter.MaxRequests, Period: time.Second})
	if err != nil {
		return 0, err
	}
	host, port, _ := net.SplitHostPort(n.Addr())
	args := []string{bin, "-h", host, "-p", port, "-c", strconv.Itoa(ceilingClients), "-n", strconv.Itoa(ceilingRequests),
		"-P", strconv.Itoa(ceilingPipeline), "--csv", "EVALSHA", sha, "1", redislayout.CounterKey(key, limiter.TokenBucket)}
	args = append(args, redisstore.ScriptArgs(p, -1, 1)...)
	if pw := password; pw != "" {
		args = append(args[:1], append([]string{"-a", pw, "--no-auth-warning"}, args[1:]...)...)
	}
	if pinned {
		args = append([]string{"taskset", "-c", "0"}, args...)
	}
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).Output()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, ",")
		if len(f) >= 2 && strings.HasPrefix(strings.Trim(f[0], `"`), "EVALSHA") {
			return strconv.ParseFloat(strings.Trim(f[1], `"`), 64)
		}
	}
	return 0, fmt.Errorf("redis-benchmark printed no EVALSHA row: %s", out)
}

// nodeCPU is a node's CPU-seconds so far (0 when INFO fails).
func nodeCPU(ctx context.Context, n *redistest.Node) float64 {
	_, cpu, err := masterStats(ctx, n)
	if err != nil {
		return 0
	}
	return cpu
}

// selfCPU is this process's user plus system CPU time.
func selfCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, err
	}
	return harness.ParseStatCPU(string(b))
}

// leaseCounters sums the lease counter families of a sidecar's registry,
// by name without the namespace.
func leaseCounters(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		name, ok := strings.CutPrefix(mf.GetName(), "floodgate_sidecar_")
		if !ok || !strings.HasPrefix(name, "lease_") || !strings.HasSuffix(name, "_total") {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[name] += m.GetCounter().GetValue()
		}
	}
	return out
}
