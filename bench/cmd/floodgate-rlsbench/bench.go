package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/bench/harness"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// Config is the harness's flags.
type Config struct {
	SidecarBin string
	Duration   time.Duration
	Warmup     time.Duration
	Conns      int
	Callers    int
	Rounds     int
	Out        string
	// RatelimitBin, when set, is an envoyproxy/ratelimit binary measured
	// beside the sidecar in the same rounds, on the same Redis Cluster.
	RatelimitBin string
	// CPUProfile, when set, is a directory that receives a CPU profile of
	// the server under test for each measured case and round (see
	// profile.go); the sidecar then runs in process in a re-exec of the
	// harness.
	CPUProfile string
	// ServeNull, set by the harness on its own re-exec, serves the null
	// ShouldRateLimit server on this address instead of benchmarking.
	ServeNull string
	// ServeSidecar, set by the harness on its own re-exec, runs the
	// sidecar's runner with the arguments after the flags.
	ServeSidecar bool
	// Control, set by the harness on its own re-exec, serves the profile
	// control endpoint on this address.
	Control string
}

// Register defines the flags.
func (c *Config) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.SidecarBin, "sidecar-bin", "", "floodgate-sidecar binary; empty builds ./cmd/floodgate-sidecar")
	fs.DurationVar(&c.Duration, "duration", 5*time.Second, "length of each measurement")
	fs.DurationVar(&c.Warmup, "warmup", time.Second, "unmeasured load before each measurement")
	fs.IntVar(&c.Conns, "conns", 4, "gRPC connections of the load generator")
	fs.IntVar(&c.Callers, "callers", 64, "concurrent calls in flight (closed loop)")
	fs.IntVar(&c.Rounds, "rounds", 3, "measurements of each case, interleaved; the report gives the median")
	fs.StringVar(&c.Out, "out", "", "write the JSON report here")
	fs.StringVar(&c.RatelimitBin, "ratelimit-bin", "", "envoyproxy/ratelimit binary (its service_cmd) to measure beside the sidecar, same cases and rounds; the report gives the same-run ratios")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "directory for a CPU profile of the server per case and round; the sidecar then runs in process in this harness's binary")
	fs.StringVar(&c.ServeNull, "serve-null", "", "internal: serve the null server on this address")
	fs.BoolVar(&c.ServeSidecar, "serve-sidecar", false, "internal: run the sidecar with the remaining arguments")
	fs.StringVar(&c.Control, "control-listen", "", "internal: serve the profile control endpoint on this address")
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Duration < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("-duration: at least 100ms, got %v", c.Duration))
	}
	if c.Warmup < 0 {
		errs = append(errs, errors.New("-warmup: must not be negative"))
	}
	if c.Conns < 1 || c.Callers < 1 || c.Callers < c.Conns {
		errs = append(errs, fmt.Errorf("-conns and -callers: at least 1, callers >= conns, got %d and %d", c.Conns, c.Callers))
	}
	if c.Rounds < 1 {
		errs = append(errs, errors.New("-rounds: at least 1"))
	}
	return errors.Join(errs...)
}

// Report is the JSON output.
type Report struct {
	Machine    Machine       `json:"machine"`
	Cases      []Case        `json:"cases"`
	Acceptance []Requirement `json:"acceptance"`
}

// Machine says where the numbers come from.
type Machine struct {
	CPUs        int    `json:"cpus"`
	GoVersion   string `json:"goVersion"`
	Pinning     string `json:"pinning"`
	LoadAverage string `json:"loadAverageAtStart"`
	Profiling   string `json:"profiling,omitempty"`
	ClockTicks  int    `json:"clockTicksPerSec"`
}

// Case is one workload's median measurement.
type Case struct {
	Name string `json:"name"`
	// ID is the case's short name (cold, hot-allowed, central-cold, ...).
	ID string `json:"id"`
	// Server is serverNull, serverFloodgate or serverPeer.
	Server string `json:"server"`
	// DecisionsPerSec is completed calls per second (closed loop).
	DecisionsPerSec float64 `json:"decisionsPerSec"`
	// CPUMicrosPerDecision is the server process's user+system CPU time
	// (from /proc/<pid>/stat) over the measurement, per completed call.
	CPUMicrosPerDecision float64 `json:"cpuMicrosPerDecision"`
	// CoreUtilisation is the server's CPU time over wall time: near 1
	// means the load saturated its core.
	CoreUtilisation float64 `json:"coreUtilisation"`
	// OverNull is CPUMicrosPerDecision over the null server's, measured
	// in the same run.
	OverNull float64 `json:"cpuOverNull,omitempty"`
	// RedisCommandsPerDecision is the commands clients sent the Redis
	// Cluster during the measurement (redisCommands), per completed call:
	// 1 when every decision is a script call, near 0 when leases or the
	// deny cache answer locally.
	RedisCommandsPerDecision float64 `json:"redisCommandsPerDecision"`
	Errors                   int64   `json:"errors"`
	OK                       int64   `json:"ok"`
	Over                     int64   `json:"overLimit"`
	// Rounds are the individual measurements (CPU µs per decision).
	Rounds []float64 `json:"roundsCpuMicros"`
	// RoundOverNull is the median over the rounds of this case's CPU per
	// decision over the null server's in the same round: less moved by
	// load from outside the run that drifts between rounds than OverNull.
	RoundOverNull float64 `json:"cpuOverNullRoundMedian,omitempty"`
	// PeerOverFloodgate, on an envoyproxy/ratelimit case, is its CPU per
	// decision over floodgate's in the same case (median over median),
	// and RoundPeerOverFloodgate the median of the per-round ratios.
	PeerOverFloodgate      float64 `json:"peerOverFloodgate,omitempty"`
	RoundPeerOverFloodgate float64 `json:"peerOverFloodgateRoundMedian,omitempty"`
	// CentralOverSidecar, on a central service case, is its CPU per
	// decision over the sidecar's RLS mode in the same case (median over
	// median), and RoundCentralOverSidecar the median of the per-round
	// ratios.
	CentralOverSidecar      float64 `json:"centralOverSidecar,omitempty"`
	RoundCentralOverSidecar float64 `json:"centralOverSidecarRoundMedian,omitempty"`
}

// Requirement is one acceptance criterion.
type Requirement struct {
	Name string  `json:"name"`
	Want string  `json:"want"`
	Got  float64 `json:"got"`
	Met  bool    `json:"met"`
}

// policy is the sidecar's config, in envoyproxy/ratelimit's format: a
// counter per user value with a limit no run reaches (cold and hot), and
// a small one that a flood exceeds at once (hot-denied).
const policy = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: flood
    rate_limit: {unit: hour, requests_per_unit: 10}
`

// centralPolicy is the central rate-limit service's config, in floodgate's
// format: the policies a gateway's request descriptors name, keyed on a
// request header, with the same limits as policy's descriptors.
const centralPolicy = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: gw
  uid: gw-1
  rules:
  - name: per-key
    match: {path: {type: Prefix, value: /api}}
    key: [{header: X-Api-Key}]
    limit: {requests: 1000000000, per: 1h}
- name: flood
  uid: flood-1
  rules:
  - name: per-key
    key: [{header: X-Api-Key}]
    limit: {requests: 10, per: 1h}
`

// dialAll opens n connections to each address and waits until each
// server answers; the returned func closes them all.
func dialAll(ctx context.Context, n int, logDir string, addrs ...string) (map[string][]*grpc.ClientConn, func(), error) {
	conns := map[string][]*grpc.ClientConn{}
	closeAll := func() {
		for _, cs := range conns {
			for _, c := range cs {
				_ = c.Close()
			}
		}
	}
	for _, addr := range addrs {
		for range n {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, closeAll, err
			}
			conns[addr] = append(conns[addr], c)
		}
		if err := waitServing(ctx, conns[addr][0]); err != nil {
			return nil, closeAll, fmt.Errorf("server on %s (logs in %s): %w", addr, logDir, err)
		}
	}
	return conns, closeAll, nil
}

// startCentral starts the central rate-limit service: the same binary
// and store as the sidecar under test, the policies in floodgate's
// format (centralPolicy), on ports[0] (gRPC), ports[1] and ports[2].
func startCentral(dir, bin string, cluster *redistest.Cluster, ports []string, start func(string, ...string) (*exec.Cmd, error)) (*exec.Cmd, string, error) {
	pf := filepath.Join(dir, "central.yaml")
	if err := os.WriteFile(pf, []byte(centralPolicy), 0o600); err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + ports[0]
	cmd, err := start(bin, "--grpc-listen", addr, "--listen", "127.0.0.1:"+ports[1], "--admin-listen", "127.0.0.1:"+ports[2],
		"--policy-file", pf, "--store", "redis", "--redis-addrs", strings.Join(cluster.Addrs(), ","), "--log-level", "warn")
	return cmd, addr, err
}

// centralWorkloads are the central service's cases, asked with the
// request descriptors a gateway sends: the sidecar's three, by id with a
// "central-" prefix.
func centralWorkloads() []workload {
	return []workload{
		{"central service: cold keys (request descriptors)", "central-cold", serverCentral, func(run, i int64) *rlcommonv3.RateLimitDescriptor {
			return requestDescriptor("gw", "c"+strconv.FormatInt(run, 10)+"-"+strconv.FormatInt(i, 10))
		}},
		{"central service: one hot key, allowed", "central-hot-allowed", serverCentral, func(run, i int64) *rlcommonv3.RateLimitDescriptor {
			return requestDescriptor("gw", "hot")
		}},
		{"central service: one hot key, over its limit", "central-hot-denied", serverCentral, func(run, i int64) *rlcommonv3.RateLimitDescriptor {
			return requestDescriptor("flood", "hot")
		}},
	}
}

// requestDescriptor is the descriptor a gateway sends, with floodgate's
// generated route actions, for GET https://api.example.com/api/items from
// 203.0.113.7 with X-Api-Key: key, for the standalone policy name.
func requestDescriptor(policy, key string) *rlcommonv3.RateLimitDescriptor {
	return &rlcommonv3.RateLimitDescriptor{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{
		{Key: config.PolicyEntryKey, Value: config.PolicyEntryValue("", policy)},
		{Key: config.AuthorityEntryKey, Value: "api.example.com"},
		{Key: config.MethodEntryKey, Value: "GET"},
		{Key: config.PathEntryKey, Value: "/api/items?page=2"},
		{Key: config.RemoteAddressEntryKey, Value: "203.0.113.7"},
		{Key: config.HeaderEntryKey("X-Api-Key"), Value: key},
	}}
}

// workload makes the descriptor of call i.
type workload struct {
	name, short, server string
	desc                func(run, i int64) *rlcommonv3.RateLimitDescriptor
}

func entry(k, v string) *rlcommonv3.RateLimitDescriptor {
	return &rlcommonv3.RateLimitDescriptor{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
}

// The servers a workload runs against.
const (
	serverNull      = "null"
	serverFloodgate = "floodgate"
	serverPeer      = "envoyproxy/ratelimit"
	// serverCentral is floodgate-sidecar as the central rate-limit
	// service: request descriptors decided on HTTP rules.
	serverCentral = "central"
)

// Run runs the harness.
func Run(ctx context.Context, cfg Config, log io.Writer) (*Report, error) {
	logf := func(format string, args ...any) { _, _ = fmt.Fprintf(log, format, args...) }
	rep := &Report{Machine: Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), ClockTicks: clockTicks}}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		rep.Machine.LoadAverage = strings.TrimSpace(string(b))
	}
	dir, err := os.MkdirTemp("", "floodgate-rlsbench-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()

	_, tsErr := exec.LookPath("taskset")
	pin := tsErr == nil && runtime.NumCPU() >= 2
	if pin {
		// The generator (this process) and Redis share CPU 1; the
		// servers under test get CPU 0.
		if out, err := exec.Command("taskset", "-a", "-cp", "1", strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("pin the load generator: %w: %s", err, out)
		}
		rep.Machine.Pinning = "servers on CPU 0 (GOMAXPROCS=1); load generator and Redis on CPU 1"
	} else {
		rep.Machine.Pinning = "none (taskset missing or one CPU)"
	}

	logf("starting a 3-master Redis Cluster\n")
	cluster, err := redistest.NewCluster(redistest.Options{Masters: 3})
	if err != nil {
		return nil, err
	}
	defer cluster.Close()
	if pin {
		for _, n := range cluster.Nodes() {
			if out, err := exec.Command("taskset", "-a", "-cp", "1", strconv.Itoa(n.Pid())).CombinedOutput(); err != nil {
				return nil, fmt.Errorf("pin redis: %w: %s", err, out)
			}
		}
	}

	bin := cfg.SidecarBin
	if bin == "" {
		bin = filepath.Join(dir, "floodgate-sidecar")
		logf("building floodgate-sidecar\n")
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/floodgate-sidecar").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build floodgate-sidecar: %w: %s", err, out)
		}
	}
	sidecarBin := bin // bin may become this binary, with -cpuprofile
	pf := filepath.Join(dir, "ratelimit.yaml")
	if err := os.WriteFile(pf, []byte(policy), 0o600); err != nil {
		return nil, err
	}
	ports := make([]string, 9)
	for i := range ports {
		if ports[i], err = harness.FreePort(); err != nil {
			return nil, err
		}
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	startEnv := func(env []string, name string, args ...string) (*exec.Cmd, error) {
		if pin {
			args = append([]string{"-c", "0", name}, args...)
			name = "taskset"
		}
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(append(os.Environ(), "GOMAXPROCS=1"), env...)
		lf, err := os.Create(filepath.Join(dir, fmt.Sprintf("proc-%d.log", len(procs))))
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = lf, lf
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		procs = append(procs, cmd)
		return cmd, nil
	}
	start := func(name string, args ...string) (*exec.Cmd, error) { return startEnv(nil, name, args...) }
	sidecarAddr, nullAddr := "127.0.0.1:"+ports[0], "127.0.0.1:"+ports[3]
	controls := map[string]string{}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	sidecarArgs := []string{"--grpc-listen", sidecarAddr, "--listen", "127.0.0.1:" + ports[1], "--admin-listen", "127.0.0.1:" + ports[2],
		"--policy-file", pf, "--store", "redis", "--redis-addrs", strings.Join(cluster.Addrs(), ","), "--log-level", "warn"}
	nullArgs := []string{"-serve-null", nullAddr}
	if cfg.CPUProfile != "" {
		if err := os.MkdirAll(cfg.CPUProfile, 0o755); err != nil {
			return nil, fmt.Errorf("-cpuprofile: %w", err)
		}
		controls[serverFloodgate], controls[serverNull] = "127.0.0.1:"+ports[4], "127.0.0.1:"+ports[5]
		sidecarArgs = append([]string{"-serve-sidecar", "-control-listen", controls[serverFloodgate], "--"}, sidecarArgs...)
		bin = self
		nullArgs = append([]string{"-control-listen", controls[serverNull]}, nullArgs...)
		rep.Machine.Profiling = "CPU profiles in " + cfg.CPUProfile + "; the sidecar ran in process in the harness binary"
	}
	sc, err := start(bin, sidecarArgs...)
	if err != nil {
		return nil, err
	}
	null, err := start(self, nullArgs...)
	if err != nil {
		return nil, err
	}
	central, centralAddr, err := startCentral(dir, sidecarBin, cluster, ports[6:9], start)
	if err != nil {
		return nil, err
	}

	conns, closeConns, err := dialAll(ctx, cfg.Conns, dir, sidecarAddr, nullAddr, centralAddr)
	defer closeConns()
	if err != nil {
		return nil, err
	}

	var runID atomic.Int64
	workloads := make([]workload, 0, 10)
	workloads = append(workloads, []workload{
		{"null server (answers OK at once)", serverNull, serverNull, func(run, i int64) *rlcommonv3.RateLimitDescriptor { return entry("user", "u") }},
		{"cold keys (a new counter every call, each a Redis call)", "cold", serverFloodgate, func(run, i int64) *rlcommonv3.RateLimitDescriptor {
			return entry("user", "c"+strconv.FormatInt(run, 10)+"-"+strconv.FormatInt(i, 10))
		}},
		{"one hot key, allowed", "hot-allowed", serverFloodgate, func(run, i int64) *rlcommonv3.RateLimitDescriptor { return entry("user", "hot") }},
		{"one hot key, over its limit (local deny cache)", "hot-denied", serverFloodgate, func(run, i int64) *rlcommonv3.RateLimitDescriptor { return entry("flood", "hot") }},
	}...)
	pids := map[string]int{serverNull: null.Process.Pid, serverFloodgate: sc.Process.Pid, serverCentral: central.Process.Pid}
	addrs := map[string]string{serverNull: nullAddr, serverFloodgate: sidecarAddr, serverCentral: centralAddr}
	closePeer, err := addPeer(ctx, cfg, dir, cluster, startEnv, conns, pids, addrs, &workloads)
	defer closePeer()
	if err != nil {
		return nil, err
	}
	workloads = append(workloads, centralWorkloads()...)
	rounds := make([][]measurement, len(workloads))
	for round := range cfg.Rounds {
		for wi, w := range workloads {
			run := runID.Add(1)
			cs := conns[addrs[w.server]]
			logf("round %d: %s: warm-up\n", round+1, w.name)
			load(ctx, cs, cfg.Callers, cfg.Warmup, func(i int64) *rlcommonv3.RateLimitDescriptor { return w.desc(run, -i-1) })
			if ctl := controls[w.server]; ctl != "" {
				if err := profileCall(ctx, ctl, filepath.Join(cfg.CPUProfile, fmt.Sprintf("%s-r%d.pprof", w.short, round+1))); err != nil {
					return nil, err
				}
			}
			m, err := measureWithRedis(ctx, cluster, pids[w.server], cs, cfg.Callers, cfg.Duration, func(i int64) *rlcommonv3.RateLimitDescriptor { return w.desc(run, i) })
			if err != nil {
				return nil, err
			}
			if ctl := controls[w.server]; ctl != "" {
				if err := profileCall(ctx, ctl, ""); err != nil {
					return nil, err
				}
			}
			logf("round %d: %s: %.0f/s, %.1f µs CPU per decision, %.0f%% of a core, %.4f Redis commands per decision, %d errors\n",
				round+1, w.name, m.rate, m.cpuMicros, 100*m.util, m.redisCmds, m.errors)
			rounds[wi] = append(rounds[wi], m)
		}
	}
	for wi, w := range workloads {
		ms := rounds[wi]
		c := Case{Name: w.name, ID: w.short, Server: w.server}
		var cpu, rate, util, cmds []float64
		for _, m := range ms {
			cpu, rate, util, cmds = append(cpu, m.cpuMicros), append(rate, m.rate), append(util, m.util), append(cmds, m.redisCmds)
			c.Errors += m.errors
			c.OK += m.ok
			c.Over += m.over
		}
		c.Rounds = cpu
		c.CPUMicrosPerDecision, c.DecisionsPerSec, c.CoreUtilisation = median(cpu), median(rate), median(util)
		c.RedisCommandsPerDecision = median(cmds)
		rep.Cases = append(rep.Cases, c)
	}
	floor := rep.Cases[0].CPUMicrosPerDecision
	for i := range rep.Cases[1:] {
		c := &rep.Cases[i+1]
		if floor > 0 {
			c.OverNull = c.CPUMicrosPerDecision / floor
		}
		c.RoundOverNull = roundRatio(c.Rounds, rep.Cases[0].Rounds)
	}
	rep.peerRatios()
	rep.centralRatios()
	rep.Acceptance = []Requirement{
		{Name: "CPU per decision, one hot key (allowed), over the null server", Want: "<= 1.15", Got: rep.Cases[2].OverNull, Met: rep.Cases[2].OverNull <= 1.15},
		{Name: "Redis commands per decision, one hot key (allowed)", Want: "<= 0.02", Got: rep.Cases[2].RedisCommandsPerDecision, Met: rep.Cases[2].RedisCommandsPerDecision <= 0.02},
		{Name: "CPU per decision, one hot key (over its limit), over the null server", Want: "<= 1.5", Got: rep.Cases[3].OverNull, Met: rep.Cases[3].OverNull <= 1.5},
		{Name: "CPU per decision, cold keys, over the null server", Want: "<= 2", Got: rep.Cases[1].OverNull, Met: rep.Cases[1].OverNull <= 2},
	}
	return rep, nil
}

// addPeer starts envoyproxy/ratelimit when cfg names its binary, connects
// to it and adds its cases; the returned func closes the connections.
func addPeer(ctx context.Context, cfg Config, dir string, cluster *redistest.Cluster, start func([]string, string, ...string) (*exec.Cmd, error),
	conns map[string][]*grpc.ClientConn, pids map[string]int, addrs map[string]string, workloads *[]workload) (func(), error) {
	if cfg.RatelimitBin == "" {
		return func() {}, nil
	}
	p, cs, err := startPeer(ctx, cfg.RatelimitBin, dir, cluster, start, cfg.Conns)
	closeAll := func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}
	if err != nil {
		return closeAll, err
	}
	conns[p.addr] = cs
	pids[serverPeer], addrs[serverPeer] = p.pid, p.addr
	*workloads = withPeer(*workloads)
	return closeAll, nil
}

// withPeer adds floodgate's cases (the workloads after the null server's)
// again for the peer, to run in the same rounds.
func withPeer(ws []workload) []workload {
	for _, w := range ws[1:4] {
		w.name, w.short, w.server = serverPeer+": "+w.name, "peer-"+w.short, serverPeer
		ws = append(ws, w)
	}
	return ws
}

// peerRatios sets, on each envoyproxy/ratelimit case (after the null
// server and floodgate's three), its CPU per decision over floodgate's in
// the same case.
func (r *Report) peerRatios() {
	for i := 4; i < len(r.Cases); i++ {
		if r.Cases[i].Server != serverPeer {
			continue
		}
		c, fg := &r.Cases[i], r.Cases[i-3]
		if fg.CPUMicrosPerDecision > 0 {
			c.PeerOverFloodgate = c.CPUMicrosPerDecision / fg.CPUMicrosPerDecision
		}
		c.RoundPeerOverFloodgate = roundRatio(c.Rounds, fg.Rounds)
	}
}

// centralRatios sets, on each central service case, its CPU per
// decision over the sidecar's RLS mode in the matching case of the same
// run (cold, hot-allowed, hot-denied).
func (r *Report) centralRatios() {
	byID := map[string]Case{}
	for _, c := range r.Cases {
		byID[c.ID] = c
	}
	for i := range r.Cases {
		c := &r.Cases[i]
		if c.Server != serverCentral {
			continue
		}
		sc, ok := byID[strings.TrimPrefix(c.ID, "central-")]
		if !ok {
			continue
		}
		if sc.CPUMicrosPerDecision > 0 {
			c.CentralOverSidecar = c.CPUMicrosPerDecision / sc.CPUMicrosPerDecision
		}
		c.RoundCentralOverSidecar = roundRatio(c.Rounds, sc.Rounds)
	}
}

// peer is a running envoyproxy/ratelimit.
type peer struct {
	addr string
	pid  int
}

// startPeer starts envoyproxy/ratelimit on the harness's policy (it is
// written in that service's format) and Redis Cluster, pinned like the
// sidecar, and returns it with conns client connections to it once it
// serves.
func startPeer(ctx context.Context, bin, dir string, cluster *redistest.Cluster, start func([]string, string, ...string) (*exec.Cmd, error), conns int) (peer, []*grpc.ClientConn, error) {
	p, err := startPeerProcess(bin, dir, cluster, start)
	if err != nil {
		return p, nil, err
	}
	var cs []*grpc.ClientConn
	for range conns {
		c, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return p, cs, err
		}
		cs = append(cs, c)
	}
	if err := waitServing(ctx, cs[0]); err != nil {
		return p, cs, fmt.Errorf("envoyproxy/ratelimit on %s (logs in %s): %w", p.addr, dir, err)
	}
	return p, cs, nil
}

func startPeerProcess(bin, dir string, cluster *redistest.Cluster, start func([]string, string, ...string) (*exec.Cmd, error)) (peer, error) {
	root := filepath.Join(dir, "peer-runtime")
	if err := os.MkdirAll(filepath.Join(root, "ratelimit", "config"), 0o755); err != nil {
		return peer{}, err
	}
	if err := os.WriteFile(filepath.Join(root, "ratelimit", "config", "bench.yaml"), []byte(policy), 0o600); err != nil {
		return peer{}, err
	}
	var ports [3]string
	for i := range ports {
		p, err := harness.FreePort()
		if err != nil {
			return peer{}, err
		}
		ports[i] = p
	}
	env := []string{"USE_STATSD=false", "LOG_LEVEL=warn", "HOST=127.0.0.1", "PORT=" + ports[0], "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + ports[1],
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + ports[2], "RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"RUNTIME_IGNOREDOTFILES=true", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=cluster", "REDIS_URL=" + strings.Join(cluster.Addrs(), ",")}
	if pw := cluster.Password(); pw != "" {
		env = append(env, "REDIS_AUTH="+pw)
	}
	cmd, err := start(env, bin)
	if err != nil {
		return peer{}, err
	}
	return peer{addr: "127.0.0.1:" + ports[1], pid: cmd.Process.Pid}, nil
}

// measurement is one timed closed-loop run.
type measurement struct {
	rate, cpuMicros, util, redisCmds float64
	ok, over, errors                 int64
}

// measureWithRedis is measure, with the Redis commands per decision that
// the cluster ran meanwhile.
func measureWithRedis(ctx context.Context, cluster *redistest.Cluster, pid int, cs []*grpc.ClientConn, callers int, d time.Duration,
	desc func(int64) *rlcommonv3.RateLimitDescriptor) (measurement, error) {
	cmds0, err := redisCommands(ctx, cluster)
	if err != nil {
		return measurement{}, err
	}
	m, err := measure(ctx, pid, cs, callers, d, desc)
	if err != nil {
		return measurement{}, err
	}
	cmds1, err := redisCommands(ctx, cluster)
	if err != nil {
		return measurement{}, err
	}
	if n := m.ok + m.over; n > 0 {
		m.redisCmds = float64(cmds1-cmds0) / float64(n)
	}
	return m, nil
}

// redisCommands sums the commands clients sent to every node of the
// cluster, from INFO commandstats: the harness's own INFO calls and the
// commands floodgate's scripts run inside Redis are left out (commandstats
// counts both).
func redisCommands(ctx context.Context, cluster *redistest.Cluster) (int64, error) {
	var total int64
	for _, n := range cluster.Nodes() {
		info, err := n.Client().Info(ctx, "commandstats").Result()
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats on %s: %w", n.Addr(), err)
		}
		c, err := parseCommandStats(info)
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats on %s: %w", n.Addr(), err)
		}
		total += c
	}
	return total, nil
}

// scriptCommands are the commands floodgate's Lua scripts call
// (sidecar/store/redislayout/lua), which INFO commandstats counts beside
// the FCALL that ran them. floodgate never sends them itself;
// envoyproxy/ratelimit sends INCRBY and EXPIRE, none of these.
var scriptCommands = map[string]bool{
	"time": true, "get": true, "set": true, "pexpire": true, "zadd": true, "zcard": true,
	"zcount": true, "zrange": true, "zremrangebyscore": true, "zrevrange": true, "zrem": true, "zscore": true,
}

// parseCommandStats sums the calls= fields of INFO commandstats, except
// the INFO command's own and scriptCommands'.
func parseCommandStats(info string) (int64, error) {
	var total int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		cmd, isStat := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isStat || cmd == "info" || scriptCommands[cmd] {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				c, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%s: calls=%q: %w", name, v, err)
				}
				total += c
			}
		}
	}
	return total, nil
}

// measure runs the load for d and reads the server's CPU time around it.
func measure(ctx context.Context, pid int, cs []*grpc.ClientConn, callers int, d time.Duration, desc func(int64) *rlcommonv3.RateLimitDescriptor) (measurement, error) {
	cpu0, err := procCPU(pid)
	if err != nil {
		return measurement{}, err
	}
	t0 := time.Now()
	ok, over, errs := load(ctx, cs, callers, d, desc)
	elapsed := time.Since(t0)
	cpu1, err := procCPU(pid)
	if err != nil {
		return measurement{}, err
	}
	n := ok + over
	m := measurement{ok: ok, over: over, errors: errs, rate: float64(n) / elapsed.Seconds(), util: (cpu1 - cpu0).Seconds() / elapsed.Seconds()}
	if n > 0 {
		m.cpuMicros = float64((cpu1 - cpu0).Microseconds()) / float64(n)
	}
	return m, nil
}

// load runs callers closed-loop callers over the connections for d.
func load(ctx context.Context, cs []*grpc.ClientConn, callers int, d time.Duration, desc func(int64) *rlcommonv3.RateLimitDescriptor) (ok, over, errs int64) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var next, nOK, nOver, nErr atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for c := range callers {
		client := rlsv3.NewRateLimitServiceClient(cs[c%len(cs)])
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1)
				out, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommonv3.RateLimitDescriptor{desc(i)}})
				switch {
				case err != nil:
					// A call cut by the end of the run is not a failure;
					// gRPC may see the deadline before ctx.Err does.
					if ctx.Err() == nil && status.Code(err) != codes.DeadlineExceeded {
						if nErr.Add(1) == 1 {
							firstErr.Store(err.Error())
						}
					}
				case out.OverallCode == rlsv3.RateLimitResponse_OK:
					nOK.Add(1)
				default:
					nOver.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if e, _ := firstErr.Load().(string); e != "" {
		fmt.Fprintf(os.Stderr, "%d failed calls, the first: %s\n", nErr.Load(), e)
	}
	return nOK.Load(), nOver.Load(), nErr.Load()
}

// waitServing waits until the server answers a call.
func waitServing(ctx context.Context, c *grpc.ClientConn) error {
	client := rlsv3.NewRateLimitServiceClient(c)
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, last = client.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommonv3.RateLimitDescriptor{entry("warm", "x")}})
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return last
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times.
const clockTicks = harness.ClockTicks

// procCPU returns a process's user plus system CPU time.
func procCPU(pid int) (time.Duration, error) { return harness.ProcCPU(pid) }

// parseStatCPU reads utime and stime from a /proc/<pid>/stat line.
func parseStatCPU(s string) (time.Duration, error) { return harness.ParseStatCPU(s) }

// roundRatio returns the median over rounds of xs[i] / floor[i], skipping
// rounds without a floor.
func roundRatio(xs, floor []float64) float64 { return harness.RoundRatio(xs, floor) }

func median(xs []float64) float64 { return harness.Median(xs) }

// nullServer answers every call OK at once: the floor of a
// ShouldRateLimit server on this machine and gRPC version.
type nullServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

// ShouldRateLimit implements RateLimitServiceServer.
func (nullServer) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// serveNull serves the null server until ctx ends.
func serveNull(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, nullServer{})
	go func() {
		<-ctx.Done()
		g.Stop()
	}()
	return g.Serve(ln)
}

// Write prints the report as a table.
func (r *Report) Write(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s; load average at start %s\n", r.Machine.Pinning, r.Machine.LoadAverage)
	if r.Machine.Profiling != "" {
		fmt.Fprintf(&b, "%s\n", r.Machine.Profiling)
	}
	width := 58
	for _, c := range r.Cases {
		width = max(width, len(c.Name))
	}
	fmt.Fprintf(&b, "%-*s %12s %14s %8s %12s %14s %16s\n", width, "case", "decisions/s", "CPU µs/decision", "core", "vs null", "per round", "Redis cmds/dec")
	for _, c := range r.Cases {
		vs, vr := "1.00 (floor)", ""
		if c.Server != serverNull {
			vs, vr = fmt.Sprintf("%.2f", c.OverNull), fmt.Sprintf("%.2f", c.RoundOverNull)
		}
		fmt.Fprintf(&b, "%-*s %12.0f %14.1f %7.0f%% %12s %14s %16.4f\n", width, c.Name, c.DecisionsPerSec, c.CPUMicrosPerDecision, 100*c.CoreUtilisation, vs, vr, c.RedisCommandsPerDecision)
	}
	fmt.Fprintf(&b, "vs null: median over median; per round: median of the ratios to the null server of the same round\n")
	for _, c := range r.Cases {
		if c.Server == serverPeer {
			fmt.Fprintf(&b, "same run: %s uses %.2fx floodgate's CPU per decision (median of per-round ratios %.2fx)\n", c.Name, c.PeerOverFloodgate, c.RoundPeerOverFloodgate)
		}
		if c.Server == serverCentral {
			fmt.Fprintf(&b, "same run: %s uses %.2fx the sidecar's RLS mode CPU per decision (median of per-round ratios %.2fx)\n", c.Name, c.CentralOverSidecar, c.RoundCentralOverSidecar)
		}
	}
	for _, a := range r.Acceptance {
		fmt.Fprintf(&b, "%s: %.2f, want %s: met=%v\n", a.Name, a.Got, a.Want, a.Met)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
