package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/bench/harness"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// Config is the harness's whole configuration.
type Config struct {
	// Addrs, when set, names an existing cluster (comma-separated seeds);
	// otherwise the harness starts one with Masters masters.
	Addrs     string
	Masters   int
	Callers   int
	Duration  time.Duration
	Warmup    time.Duration
	Keys      int
	Algorithm string
	// Requests is redis-benchmark's -n.
	Requests int
	// Pipeline is redis-benchmark's -P for its pipelined ceiling.
	Pipeline int
	// Rounds is how many times the closed-loop measurements repeat,
	// interleaved.
	Rounds int
	// OpenLoad is the open-loop phase's offered rate as a share of each
	// mode's measured maximum.
	OpenLoad float64
	Pin      bool
	RedisCPU int
	LoadCPU  int
	Window   time.Duration
	Timeout  time.Duration
	// PoolSize is the unbatched baseline's connection pool per node; 0
	// means one per caller, so that the baseline is never short of
	// connections (go-redis's default, 10 per GOMAXPROCS, would
	// cap it at 10 calls in flight per node once pinned to one CPU).
	PoolSize int
	JSON     bool
	// CPUProfile, when set, is where the batched closed-loop phase writes
	// a CPU profile of this process.
	CPUProfile string
}

// Register binds the flags to c, with their defaults.
func (c *Config) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.Addrs, "addrs", "", "seed addresses of an existing cluster (default: start one on loopback)")
	fs.IntVar(&c.Masters, "masters", 3, "masters of the cluster the harness starts")
	fs.IntVar(&c.Callers, "callers", 64, "concurrent callers (and redis-benchmark clients)")
	fs.DurationVar(&c.Duration, "duration", 5*time.Second, "length of each measured phase")
	fs.DurationVar(&c.Warmup, "warmup", time.Second, "unmeasured run before each phase")
	fs.IntVar(&c.Keys, "keys", 100000, "distinct counters the load spreads over")
	fs.StringVar(&c.Algorithm, "algorithm", "TokenBucket", "algorithm of the limit: TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog")
	fs.IntVar(&c.Requests, "requests", 200000, "requests per redis-benchmark run (-n)")
	fs.IntVar(&c.Pipeline, "pipeline", 16, "redis-benchmark pipeline depth for the pipelined ceiling (-P)")
	fs.Float64Var(&c.OpenLoad, "open-load", 0.5, "offered rate of the open-loop latency phase, as a share of each mode's measured maximum")
	fs.IntVar(&c.Rounds, "rounds", 3, "interleaved repetitions of the closed-loop measurements; the report gives medians")
	fs.BoolVar(&c.Pin, "pin", true, "pin redis-server to -redis-cpu and the load to -load-cpu with taskset, when available")
	fs.IntVar(&c.RedisCPU, "redis-cpu", 0, "CPU for the redis-server processes")
	fs.IntVar(&c.LoadCPU, "load-cpu", 1, "CPU for this process and redis-benchmark")
	fs.DurationVar(&c.Window, "window", redisstore.DefaultBatchWindow, "batch window of the batched phase")
	fs.DurationVar(&c.Timeout, "timeout", time.Second, "per-call deadline of the store (generous: the harness measures, it does not shed)")
	fs.IntVar(&c.PoolSize, "pool-size", 0, "connections per node of the unbatched baseline (default: one per caller)")
	fs.BoolVar(&c.JSON, "json", false, "print the report as JSON")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the batched closed-loop phase to this file")
}

// Validate reports every problem with c at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Addrs == "" && (c.Masters < 1 || c.Masters > 16) {
		errs = append(errs, fmt.Errorf("masters: must be between 1 and 16, got %d", c.Masters))
	}
	for _, a := range c.addrs() {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("addrs: %q: %w", a, err))
		}
	}
	if c.Callers < 1 || c.Callers > 10000 {
		errs = append(errs, fmt.Errorf("callers: must be between 1 and 10000, got %d", c.Callers))
	}
	if c.Duration < 100*time.Millisecond || c.Duration > time.Hour {
		errs = append(errs, fmt.Errorf("duration: must be between 100ms and 1h, got %v", c.Duration))
	}
	if c.Warmup < 0 || c.Warmup > time.Hour {
		errs = append(errs, fmt.Errorf("warmup: must be between 0 and 1h, got %v", c.Warmup))
	}
	if c.Keys < 1 || c.Keys > 100_000_000 {
		errs = append(errs, fmt.Errorf("keys: must be between 1 and 1e8, got %d", c.Keys))
	}
	if _, err := limiter.ParseAlgorithm(c.Algorithm); err != nil {
		errs = append(errs, fmt.Errorf("algorithm: %w", err))
	}
	if c.Requests < 1000 {
		errs = append(errs, fmt.Errorf("requests: must be at least 1000, got %d", c.Requests))
	}
	if c.Pipeline < 1 || c.Pipeline > 1024 {
		errs = append(errs, fmt.Errorf("pipeline: must be between 1 and 1024, got %d", c.Pipeline))
	}
	if c.OpenLoad <= 0 || c.OpenLoad > 1 {
		errs = append(errs, fmt.Errorf("open-load: must be in (0, 1], got %v", c.OpenLoad))
	}
	if c.Rounds < 1 || c.Rounds > 100 {
		errs = append(errs, fmt.Errorf("rounds: must be between 1 and 100, got %d", c.Rounds))
	}
	if c.RedisCPU < 0 || c.LoadCPU < 0 {
		errs = append(errs, errors.New("redis-cpu, load-cpu: must not be negative"))
	}
	if c.Pin && c.RedisCPU == c.LoadCPU {
		errs = append(errs, fmt.Errorf("redis-cpu and load-cpu are both %d: pinning wants two CPUs", c.RedisCPU))
	}
	if c.Window <= 0 || c.Window > redisstore.MaxBatchWindow {
		errs = append(errs, fmt.Errorf("window: must be in (0, %v], got %v", redisstore.MaxBatchWindow, c.Window))
	}
	if c.PoolSize < 0 || c.PoolSize > 100000 {
		errs = append(errs, fmt.Errorf("pool-size: must be between 0 and 100000, got %d", c.PoolSize))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout: must be positive, got %v", c.Timeout))
	}
	return errors.Join(errs...)
}

func (c *Config) addrs() []string {
	if c.Addrs == "" {
		return nil
	}
	return strings.Split(c.Addrs, ",")
}

// Phase is one measured load.
type Phase struct {
	Name      string        `json:"name"`
	Rate      float64       `json:"decisionsPerSecond"`
	Decisions int64         `json:"decisions"`
	Errors    int64         `json:"errors"`
	P50       time.Duration `json:"p50"`
	P99       time.Duration `json:"p99"`
	P999      time.Duration `json:"p999"`
	Max       time.Duration `json:"max"`
	// Target is the offered rate of an open-loop phase.
	Target float64 `json:"targetPerSecond,omitempty"`
	// P99Sojourn is the p99 from scheduled arrival to answer, queueing in
	// the load generator included, in an open-loop phase.
	P99Sojourn time.Duration `json:"p99Sojourn,omitempty"`
	// ClientCPU and ServerCPU are the CPU time (user and system) per
	// decision of this process and of all redis-server processes. Unlike
	// rates they hardly depend on what else the machine runs. ClientCPU
	// is 0 for redis-benchmark phases, ServerCPU when the harness did not
	// start the servers.
	ClientCPU time.Duration `json:"clientCPUPerDecision,omitempty"`
	ServerCPU time.Duration `json:"serverCPUPerDecision,omitempty"`
	// Foreign is the share of the machine's CPU time during the phase
	// that went to processes other than this one and the redis-servers
	// it started (other work on a shared machine), 0 to 1. Rates and
	// latencies mean little when it is high; CPU per decision still does.
	Foreign float64 `json:"foreignCPUShare"`
	// PerWrite is the mean number of decisions per pipelined write of a
	// batched phase.
	PerWrite float64 `json:"decisionsPerWrite,omitempty"`
	// Note says how the phase ran.
	Note string `json:"note,omitempty"`
}

// Report is the result of a run.
type Report struct {
	Algorithm string  `json:"algorithm"`
	Masters   int     `json:"masters"`
	Callers   int     `json:"callers"`
	Pinned    string  `json:"pinned"`
	Phases    []Phase `json:"phases"`
	// Median is the median rate of each closed-loop measurement over the
	// rounds.
	Median Medians `json:"median"`
	// BatchedOverUnbatched is the median over the rounds of the batched
	// store's rate over the unbatched baseline's, same round, same
	// cluster.
	BatchedOverUnbatched float64 `json:"batchedOverUnbatched"`
	// BatchedOverCeiling is the batched store's median rate over
	// redis-benchmark's median unpipelined EVALSHA ceiling.
	BatchedOverCeiling float64 `json:"batchedOverUnpipelinedCeiling"`
	// FcallOverEvalsha is the median over the rounds of the servers' CPU
	// per decision calling the script as the library's function (FCALL,
	// as the store does) over calling it by EVALSHA, both pipelined by
	// redis-benchmark in the same round; 0 when the harness did not start
	// the servers.
	FcallOverEvalsha float64 `json:"fcallOverEvalshaServerCPU"`
}

// Medians are decisions per second, medians over the rounds.
type Medians struct {
	CeilingUnpipelined float64 `json:"redisBenchmarkP1"`
	CeilingPipelined   float64 `json:"redisBenchmarkPipelined"`
	Unbatched          float64 `json:"storeUnbatched"`
	Batched            float64 `json:"storeBatched"`
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Write prints the report as a table, or as JSON.
func (r *Report) Write(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	ew := &errWriter{w: w}
	ew.printf("algorithm %s, %d masters, %d callers, pinning: %s\n\n", r.Algorithm, r.Masters, r.Callers, r.Pinned)
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	tew := &errWriter{w: tw}
	tew.printf("phase\tdecisions/s\tdecisions\terrors\tp50\tp99\tp99.9\tmax\tclient CPU/dec\tserver CPU/dec\tdec/write\tforeign CPU\t\n")
	for _, p := range r.Phases {
		perWrite := "-"
		if p.PerWrite > 0 {
			perWrite = fmt.Sprintf("%.1f", p.PerWrite)
		}
		tew.printf("%s\t%.0f\t%d\t%d\t%v\t%v\t%v\t%v\t%v\t%v\t%s\t%.0f%%\t\n", p.Name, p.Rate, p.Decisions, p.Errors,
			round(p.P50), round(p.P99), round(p.P999), round(p.Max), round(p.ClientCPU), round(p.ServerCPU), perWrite, 100*p.Foreign)
	}
	if tew.err != nil {
		return tew.err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ew.printf("\n")
	seen := map[string]bool{}
	for _, p := range r.Phases {
		if p.Note != "" && !seen[p.Note] {
			seen[p.Note] = true
			ew.printf("%s: %s\n", p.Name, p.Note)
		}
	}
	ew.printf("\nmedians over the rounds, decisions/s: redis-benchmark -P 1 %.0f, pipelined %.0f; unbatched baseline %.0f, store batched %.0f\n",
		r.Median.CeilingUnpipelined, r.Median.CeilingPipelined, r.Median.Unbatched, r.Median.Batched)
	ew.printf("batched store / unbatched baseline (median of the rounds' ratios): %.2fx\n", r.BatchedOverUnbatched)
	ew.printf("batched store / redis-benchmark unpipelined EVALSHA ceiling: %.2fx\n", r.BatchedOverCeiling)
	ew.printf("server CPU per decision, FCALL / EVALSHA of the same script (median of the rounds' ratios): %.3fx\n", r.FcallOverEvalsha)
	ew.printf("foreign CPU: the machine's CPU time taken by other processes during a phase (redis-benchmark's own included);\n" +
		"where it is high, rates and latencies measure the machine's contention, and CPU per decision is the figure to compare\n")
	return ew.err
}

// errWriter keeps the first write error, so that a report is written
// without a check after every line.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(e, format, args...)
}

func round(d time.Duration) time.Duration {
	switch {
	case d > 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d > 10*time.Microsecond:
		return d.Round(time.Microsecond)
	}
	return d
}

// Run runs every phase and returns the report. Progress goes to log.
func Run(ctx context.Context, cfg Config, log io.Writer) (*Report, error) {
	logf := func(format string, args ...any) { _, _ = fmt.Fprintf(log, format, args...) }
	alg, _ := limiter.ParseAlgorithm(cfg.Algorithm)
	l := limiter.Limit{Algorithm: alg, Requests: 1_000_000_000, Period: time.Hour}
	if alg == limiter.SlidingLog {
		l.Requests = limiter.MaxLogRequests // the biggest log a key may hold
	}
	params, err := limiter.NewParams(l)
	if err != nil {
		return nil, err
	}
	rep := &Report{Algorithm: alg.String(), Callers: cfg.Callers, Pinned: "no"}

	addrs := cfg.addrs()
	var serverPids []int
	if len(addrs) == 0 {
		logf("starting a %d-master cluster on loopback\n", cfg.Masters)
		c, err := redistest.NewCluster(redistest.Options{Masters: cfg.Masters})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		addrs = c.Addrs()
		for _, n := range c.Nodes() {
			serverPids = append(serverPids, n.Pid())
		}
	}
	masters, err := masterAddrs(ctx, addrs)
	if err != nil {
		return nil, err
	}
	rep.Masters = len(masters)
	if cfg.Pin {
		rep.Pinned = pin(cfg, serverPids, log)
	}

	// The script for EVALSHA, as sidecars called it before the library,
	// and the library for FCALL, as they call it now: the same Lua.
	src, sha, fn, _ := redislayout.TakeScript(alg)
	libName, lib := redislayout.Library()
	for _, m := range masters {
		cl := redis.NewClient(&redis.Options{Addr: m, Protocol: 2, DisableIdentity: true})
		got, err := cl.ScriptLoad(ctx, src).Result()
		if err == nil && got != sha {
			err = fmt.Errorf("sha %s, want %s", got, sha)
		}
		if err == nil {
			if lerr := cl.FunctionLoad(ctx, lib).Err(); lerr != nil && !strings.Contains(lerr.Error(), "already exists") {
				err = fmt.Errorf("function load %s: %w", libName, lerr)
			}
		}
		_ = cl.Close()
		if err != nil {
			return nil, fmt.Errorf("script load on %s: %w", m, err)
		}
	}

	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench-policy:rule:%016x", rand.Uint64())
	}
	pool := cfg.PoolSize
	if pool == 0 {
		pool = cfg.Callers
	}
	modes := []struct {
		name   string
		window time.Duration // 0: the unbatched baseline
	}{
		{"go-redis, one EVALSHA per decision", 0},
		{fmt.Sprintf("store, batched (window %v)", cfg.Window), cfg.Window},
	}
	newStore := func(window time.Duration) (store, error) {
		if window == 0 {
			return newUnbatched(addrs, l, pool, cfg.Timeout)
		}
		return redisstore.New(redisstore.Options{Addrs: addrs, Timeout: cfg.Timeout, BatchWindow: window})
	}

	// Rounds interleave every closed-loop measurement, so that a machine
	// whose load drifts during the run biases none of them; the report
	// gives each round and the medians.
	args := redisstore.ScriptArgs(params, -1, 1)
	var ceil1, ceilP, unb, bat, fcallCPU []float64
	for r := 1; r <= cfg.Rounds && ctx.Err() == nil; r++ {
		ps, err := ceilingRound(ctx, cfg, r, masters[0], sha, fn, alg, args, serverPids, log)
		if err != nil {
			return nil, err
		}
		rep.Phases = append(rep.Phases, ps[:]...)
		ceil1, ceilP = append(ceil1, ps[0].Rate), append(ceilP, ps[1].Rate)
		if ps[1].ServerCPU > 0 && ps[2].ServerCPU > 0 {
			fcallCPU = append(fcallCPU, float64(ps[2].ServerCPU)/float64(ps[1].ServerCPU))
		}
		for i, mode := range modes {
			s, err := newStore(mode.window)
			if err != nil {
				return nil, err
			}
			logf("round %d: %s: closed loop, %d callers\n", r, mode.name, cfg.Callers)
			closedLoop(ctx, s, keys, l, cfg.Callers, cfg.Warmup) // warm-up
			stopProfile := func() {}
			if cfg.CPUProfile != "" && mode.window > 0 && r == 1 {
				if stopProfile, err = startProfile(cfg.CPUProfile); err != nil {
					return nil, err
				}
			}
			cli0, srv0, st0, m0 := selfCPU(), serverCPU(serverPids), s.PipelineStats(), machineCPU()
			p := closedLoop(ctx, s, keys, l, cfg.Callers, cfg.Duration)
			cli, srv := selfCPU()-cli0, serverCPU(serverPids)-srv0
			p.ClientCPU = perDecision(cli, p.Decisions, []int{0})
			p.ServerCPU = perDecision(srv, p.Decisions, serverPids)
			p.Foreign = foreignShare(m0, machineCPU(), cli+srv)
			p.PerWrite = perWrite(st0, s.PipelineStats())
			stopProfile()
			_ = s.Close()
			p.Name = fmt.Sprintf("%d: %s", r, mode.name)
			p.Note = fmt.Sprintf("closed loop, %d callers", cfg.Callers)
			if i == 0 {
				p.Note += fmt.Sprintf(", %d connections per node", pool)
			} else {
				p.Note += ", one pipelined connection per node"
			}
			rep.Phases = append(rep.Phases, p)
			if i == 0 {
				unb = append(unb, p.Rate)
			} else {
				bat = append(bat, p.Rate)
			}
		}
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	rep.Median = Medians{
		CeilingUnpipelined: median(ceil1),
		CeilingPipelined:   median(ceilP),
		Unbatched:          median(unb),
		Batched:            median(bat),
	}
	ratios := make([]float64, len(unb))
	for i := range unb {
		ratios[i] = bat[i] / unb[i]
	}
	rep.BatchedOverUnbatched = median(ratios)
	rep.FcallOverEvalsha = median(fcallCPU)
	if rep.Median.CeilingUnpipelined > 0 {
		rep.BatchedOverCeiling = rep.Median.Batched / rep.Median.CeilingUnpipelined
	}

	// Latency under an open-loop load at OpenLoad (default half) of each mode's median
	// maximum.
	for i, mode := range modes {
		s, err := newStore(mode.window)
		if err != nil {
			return nil, err
		}
		maxRate := rep.Median.Unbatched
		if i == 1 {
			maxRate = rep.Median.Batched
		}
		target := maxRate * cfg.OpenLoad
		logf("%s: open loop at %.0f/s\n", mode.name, target)
		openLoop(ctx, s, keys, l, target, cfg.Warmup, 4*cfg.Callers)
		st0, cli0, srv0, m0 := s.PipelineStats(), selfCPU(), serverCPU(serverPids), machineCPU()
		p := openLoop(ctx, s, keys, l, target, cfg.Duration, 4*cfg.Callers)
		cli, srv := selfCPU()-cli0, serverCPU(serverPids)-srv0
		p.PerWrite = perWrite(st0, s.PipelineStats())
		p.ClientCPU = perDecision(cli, p.Decisions, []int{0})
		p.ServerCPU = perDecision(srv, p.Decisions, serverPids)
		p.Foreign = foreignShare(m0, machineCPU(), cli+srv)
		_ = s.Close()
		p.Name = fmt.Sprintf("%s, %.0f%% of its max", mode.name, 100*cfg.OpenLoad)
		p.Note = fmt.Sprintf("open loop at %.0f/s offered (%.0f%% of the median max %.0f), achieved %.0f/s, p99 arrival-to-answer %v",
			target, 100*cfg.OpenLoad, maxRate, p.Rate, round(p.P99Sojourn))
		if len(serverPids) > 0 && p.Rate > 0 {
			// Redis's busy share: at a lower rate a batched decision
			// shares its write with fewer others and costs Redis more,
			// so half the rate is more than half the work.
			p.Note += fmt.Sprintf(", redis-server busy %.0f%% of its CPU", 100*p.Rate*p.ServerCPU.Seconds())
		}
		rep.Phases = append(rep.Phases, p)
	}
	return rep, ctx.Err()
}

// startProfile starts a CPU profile into path and returns its stop.
func startProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// masterAddrs returns the masters' addresses, in CLUSTER SHARDS order.
func masterAddrs(ctx context.Context, seeds []string) ([]string, error) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds, Protocol: 2, DisableIdentity: true})
	defer func() { _ = cc.Close() }()
	var mu sync.Mutex
	var out []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		out = append(out, c.Options().Addr)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing masters: %w", err)
	}
	slices.Sort(out)
	return out, nil
}

// pin puts the redis-server processes on RedisCPU and this process on
// LoadCPU, and says what it did.
func pin(cfg Config, serverPids []int, log io.Writer) string {
	ts, err := exec.LookPath("taskset")
	if err != nil {
		return "no (taskset not found)"
	}
	if runtime.NumCPU() < 2 {
		return "no (one CPU)"
	}
	for _, pid := range serverPids {
		if out, err := exec.Command(ts, "-p", "-c", strconv.Itoa(cfg.RedisCPU), strconv.Itoa(pid)).CombinedOutput(); err != nil {
			_, _ = fmt.Fprintf(log, "taskset redis-server %d: %v: %s\n", pid, err, out)
			return "no (taskset failed)"
		}
	}
	if out, err := exec.Command(ts, "-a", "-p", "-c", strconv.Itoa(cfg.LoadCPU), strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		_, _ = fmt.Fprintf(log, "taskset self: %v: %s\n", err, out)
		return "no (taskset failed)"
	}
	// One CPU is left for the load: one P avoids the Go scheduler
	// fighting itself over it.
	runtime.GOMAXPROCS(1)
	which := fmt.Sprintf("redis-server on CPU %d, load and redis-benchmark on CPU %d", cfg.RedisCPU, cfg.LoadCPU)
	if len(serverPids) == 0 {
		which = fmt.Sprintf("load and redis-benchmark on CPU %d (redis-server not started here: not pinned)", cfg.LoadCPU)
	}
	return which
}

// redisBenchmark runs redis-benchmark's EVALSHA of the script against the
// cluster and returns its rate.
// ceilingRound runs round r's redis-benchmark ceilings on master:
// EVALSHA of the script (sha) unpipelined and pipelined, and FCALL of its
// function (fn) pipelined, back to back, so that the servers' CPU per
// decision of the two calls compares within the round.
func ceilingRound(ctx context.Context, cfg Config, r int, master, sha, fn string, alg limiter.Algorithm, args []string, serverPids []int, log io.Writer) ([3]Phase, error) {
	var ps [3]Phase
	for i, run := range []struct {
		depth int
		head  []string
	}{{1, []string{"EVALSHA", sha}}, {cfg.Pipeline, []string{"EVALSHA", sha}}, {cfg.Pipeline, []string{"FCALL", fn}}} {
		_, _ = fmt.Fprintf(log, "round %d: redis-benchmark %s -P %d\n", r, run.head[0], run.depth)
		srv0, m0 := serverCPU(serverPids), machineCPU()
		p, err := redisBenchmark(ctx, cfg, master, run.head, alg, args, run.depth)
		if err != nil {
			return ps, err
		}
		srv := serverCPU(serverPids) - srv0
		p.ServerCPU = perDecision(srv, p.Decisions, serverPids)
		// redis-benchmark's own CPU is not measured: it counts as
		// foreign here.
		p.Foreign = foreignShare(m0, machineCPU(), srv)
		p.Name = fmt.Sprintf("%d: %s", r, p.Name)
		ps[i] = p
	}
	return ps, nil
}

// head is the command and its script: EVALSHA and the SHA1, or FCALL and
// the function.
func redisBenchmark(ctx context.Context, cfg Config, seed string, head []string, alg limiter.Algorithm, args []string, depth int) (Phase, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		if _, serr := os.Stat("/usr/bin/redis-benchmark"); serr != nil {
			return Phase{}, errors.New("redis-benchmark not found: run `hack/redis-cluster.sh install`")
		}
		bin = "/usr/bin/redis-benchmark"
	}
	host, port, _ := net.SplitHostPort(seed)
	part := strings.TrimPrefix(redislayout.CounterKey("x", alg), "fg:{x}:")
	cmd := []string{bin, "-h", host, "-p", port, "--cluster", "-c", strconv.Itoa(cfg.Callers),
		"-n", strconv.Itoa(cfg.Requests), "-r", strconv.Itoa(cfg.Keys), "-P", strconv.Itoa(depth), "--csv",
		head[0], head[1], "1", "fg:{tag}:__rand_int__:" + part}
	cmd = append(cmd, args...)
	if cfg.Pin {
		if ts, err := exec.LookPath("taskset"); err == nil && runtime.NumCPU() >= 2 {
			cmd = append([]string{ts, "-c", strconv.Itoa(cfg.LoadCPU)}, cmd...)
		}
	}
	var out, errOut bytes.Buffer
	c := exec.CommandContext(ctx, cmd[0], cmd[1:]...)
	c.Stdout, c.Stderr = &out, &errOut
	if err := c.Run(); err != nil {
		return Phase{}, fmt.Errorf("redis-benchmark: %w: %s", err, errOut.String())
	}
	// In cluster mode redis-benchmark lists the masters before the CSV.
	text := out.String()
	if i := strings.Index(text, `"test",`); i >= 0 {
		text = text[i:]
	}
	rows, err := csv.NewReader(strings.NewReader(text)).ReadAll()
	if err != nil {
		return Phase{}, fmt.Errorf("redis-benchmark csv: %w", err)
	}
	for _, row := range rows {
		if len(row) < 7 || !strings.HasPrefix(row[0], head[0]) {
			continue
		}
		rps, err := strconv.ParseFloat(row[1], 64)
		if err != nil {
			return Phase{}, fmt.Errorf("redis-benchmark rps %q: %w", row[1], err)
		}
		ms := func(s string) time.Duration {
			f, _ := strconv.ParseFloat(s, 64)
			return time.Duration(f * float64(time.Millisecond))
		}
		return Phase{
			Name:      fmt.Sprintf("redis-benchmark %s -P %d", head[0], depth),
			Rate:      rps,
			Decisions: int64(cfg.Requests),
			P50:       ms(row[4]),
			P99:       ms(row[6]),
			Max:       ms(row[len(row)-1]),
			Note:      fmt.Sprintf("%d clients, pipeline %d, %d random keys: the server's ceiling for this script", cfg.Callers, depth, cfg.Keys),
		}, nil
	}
	return Phase{}, fmt.Errorf("redis-benchmark printed no %s row: %s", head[0], out.String())
}

// machineSample is the machine's busy and total CPU time, from /proc/stat.
type machineSample struct{ busy, total time.Duration }

// machineCPU reads the machine's CPU time so far; zero when /proc/stat
// cannot be read.
func machineCPU() machineSample {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineSample{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return machineSample{}
	}
	var v [8]int64
	for i := range v {
		v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
	}
	busy := v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
	return machineSample{busy: time.Duration(busy) * clockTick, total: time.Duration(busy+v[3]+v[4]) * clockTick}
}

// foreignShare returns the share of the machine's CPU time between two
// samples that went to processes other than ours, which used ours.
func foreignShare(a, b machineSample, ours time.Duration) float64 {
	total := b.total - a.total
	if total <= 0 {
		return 0
	}
	f := float64(b.busy-a.busy-ours) / float64(total)
	return min(max(f, 0), 1)
}

// perWrite returns the mean decisions per pipelined write between two
// readings, or 0 when there was none.
func perWrite(before, after redisstore.PipelineStats) float64 {
	w := after.Writes - before.Writes
	if w <= 0 {
		return 0
	}
	return float64(after.Decisions-before.Decisions) / float64(w)
}

// selfCPU returns this process's user and system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is the unit of /proc/<pid>/stat times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// serverCPU returns the summed user and system CPU time of pids, read from
// /proc; a process that cannot be read counts 0.
func serverCPU(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// The command name, in parentheses, may hold spaces: count the
		// fields after its closing parenthesis. utime and stime are
		// fields 14 and 15, the 12th and 13th after it.
		rest := string(b)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * clockTick
	}
	return total
}

// perDecision divides cpu over n decisions; 0 when there are no pids to
// measure or no decisions.
func perDecision(cpu time.Duration, n int64, pids []int) time.Duration {
	if len(pids) == 0 || n <= 0 {
		return 0
	}
	return cpu / time.Duration(n)
}

// closedLoop has callers decide back to back on random keys for d.
func closedLoop(ctx context.Context, s store, keys []string, l limiter.Limit, callers int, d time.Duration) Phase {
	var errs atomic.Int64
	lat := make([][]time.Duration, callers)
	stop := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			mine := make([]time.Duration, 0, 1<<14)
			for time.Now().Before(stop) && ctx.Err() == nil {
				t0 := time.Now()
				_, _, err := s.Take(ctx, limiter.Request{Key: keys[rng.IntN(len(keys))], Limit: l, Cost: 1})
				if err != nil {
					errs.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			lat[w] = mine
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	p := summarize(all)
	p.Errors = errs.Load()
	p.Rate = float64(len(all)) / elapsed.Seconds()
	return p
}

// openLoop offers decisions at rate per second for d, whatever the answers
// take, from workers goroutines, and measures each decision's store
// latency and its time from scheduled arrival to answer. Arrivals are
// released at their scheduled instants (harness.Pacer), at most arrivalTick
// late.
func openLoop(ctx context.Context, s store, keys []string, l limiter.Limit, rate float64, d time.Duration, workers int) Phase {
	type arrival struct{ at time.Time }
	queue := make(chan arrival, 1<<16)
	var errs, dropped atomic.Int64
	lat := make([][]time.Duration, workers)
	soj := make([][]time.Duration, workers)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for a := range queue {
				t0 := time.Now()
				_, _, err := s.Take(ctx, limiter.Request{Key: keys[rng.IntN(len(keys))], Limit: l, Cost: 1})
				t1 := time.Now()
				if err != nil {
					errs.Add(1)
					continue
				}
				lat[w] = append(lat[w], t1.Sub(t0))
				soj[w] = append(soj[w], t1.Sub(a.at))
			}
		})
	}
	interval := time.Duration(float64(time.Second) / rate)
	total := int64(d / interval)
	pc, err := harness.NewPacer()
	if err != nil {
		close(queue)
		wg.Wait()
		return Phase{Errors: 1, Note: err.Error()}
	}
	defer pc.Close()
	for sent := int64(0); sent < total && ctx.Err() == nil; {
		// Release every arrival that is due, then sleep until the next
		// one, but at least arrivalTick: a wake-up costs the generator
		// a few system calls, and at tens of thousands of arrivals a
		// second one per arrival would take most of its core. Arrivals
		// therefore leave at most arrivalTick late (their sojourn counts
		// it), in groups of rate*arrivalTick at most.
		for now := time.Since(start); sent < total && time.Duration(sent)*interval <= now; sent++ {
			select {
			case queue <- arrival{at: start.Add(time.Duration(sent) * interval)}:
			default:
				dropped.Add(1)
			}
		}
		pc.Sleep(max(time.Until(start.Add(time.Duration(sent)*interval)), arrivalTick))
	}
	close(queue)
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	p := summarize(all)
	p.Errors = errs.Load() + dropped.Load()
	p.Rate = float64(len(all)) / elapsed.Seconds()
	p.Target = rate
	sj := slices.Concat(soj...)
	slices.Sort(sj)
	if len(sj) > 0 {
		p.P99Sojourn = sj[min(len(sj)-1, len(sj)*99/100)]
	}
	return p
}

// arrivalTick is the open loop's shortest sleep between releases.
const arrivalTick = 100 * time.Microsecond

func summarize(ds []time.Duration) Phase {
	slices.Sort(ds)
	at := func(q float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		return ds[min(len(ds)-1, int(float64(len(ds))*q))]
	}
	return Phase{Decisions: int64(len(ds)), P50: at(.5), P99: at(.99), P999: at(.999), Max: at(1)}
}
