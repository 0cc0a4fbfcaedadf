package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/bench/harness"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// Report is the bench's JSON output.
type Report struct {
	Machine  Machine  `json:"machine"`
	Settings Settings `json:"settings"`
	// Floodgate and Nginx are the two limiters on the same traffic.
	Floodgate *Side `json:"floodgate,omitempty"`
	Nginx     *Side `json:"nginx,omitempty"`
	// FloodgateDeny and NginxDeny, when run, are the same traffic through
	// the same meter answering 429 at once (a burst of delayAfter; nginx
	// without burst): what each costs per request without delays.
	FloodgateDeny *Side `json:"floodgateDeny,omitempty"`
	NginxDeny     *Side `json:"nginxDeny,omitempty"`
	// CPURatio is the sidecars' CPU per delayed request over nginx's.
	CPURatio float64 `json:"cpuPerDelayedRatio,omitempty"`
	Memory   *Memory `json:"memory,omitempty"`
	// NginxMemory is the memory phase's reference: nginx with the same
	// per-key queue.
	NginxMemory *Memory               `json:"nginxMemory,omitempty"`
	Acceptance  []harness.Requirement `json:"acceptance"`
	// Skipped says which phases did not run and why.
	Skipped []string `json:"skipped,omitempty"`
}

// Machine records where the numbers came from.
type Machine struct {
	CPUs        int    `json:"cpus"`
	GoVersion   string `json:"goVersion"`
	Pinning     string `json:"pinning"`
	LoadAverage string `json:"loadAverage"`
	Started     string `json:"started"`
	Nginx       string `json:"nginx,omitempty"`
	Redis       string `json:"redis,omitempty"`
}

// Settings are the traffic and the rule.
type Settings struct {
	RatePerSec    int     `json:"ratePerSec"`
	OfferedPerSec float64 `json:"offeredPerSec"`
	Seconds       float64 `json:"seconds"`
	MaxDelay      string  `json:"maxDelay"`
	DelayAfter    int     `json:"delayAfter"`
	NginxBurst    int     `json:"nginxBurst"`
	Rule          string  `json:"rule"`
	NginxConf     string  `json:"nginxLimitReq"`
	SidecarArgs   string  `json:"sidecarArgs,omitempty"`
}

// Side is one limiter's run.
type Side struct {
	Name     string `json:"name"`
	Rule     string `json:"rule"`
	Limiters int    `json:"limiters"`
	Apps     int    `json:"apps"`
	Counts
	// DelayedBy says how a delayed request was told from one passed at
	// once.
	DelayedBy string `json:"delayedBy"`
	// Delay is the delayed requests' arrival at the application less
	// their scheduled send; Latency all the 2xx answers' latency from
	// their scheduled send.
	Delay   Dist `json:"delay"`
	Latency Dist `json:"latency2xx"`
	// Held is the delayed requests' arrival less their actual send (a
	// worker took them up): the delay without the load generator's own
	// lateness, which a busy CPU 1 adds.
	Held Dist `json:"heldFromSend"`
	// PerSecond are the applications' arrivals in each second from the
	// first request's scheduled send; Bar the check of the full seconds
	// of the offer after the first.
	PerSecond []int   `json:"arrivalsPerSecond"`
	Bar       RateBar `json:"bar"`
	// CPUSeconds is the limiting processes' CPU time (user + system) over
	// the offer and its drain; per delayed request and per request sent.
	CPUSeconds          float64 `json:"cpuSeconds"`
	CPUPerDelayedMicros float64 `json:"cpuPerDelayedMicros"`
	CPUPerSentMicros    float64 `json:"cpuPerSentMicros"`
	// IdleCPUPerSec is the limiters' CPU seconds per second while idle,
	// measured just before; CPUAboveIdlePerDelayedMicros the CPU per
	// delayed request less that idle cost over the offer (OfferSeconds,
	// with the drain).
	IdleCPUPerSec                float64 `json:"idleCpuPerSec"`
	OfferSeconds                 float64 `json:"offerSeconds"`
	CPUAboveIdlePerDelayedMicros float64 `json:"cpuAboveIdlePerDelayedMicros"`
	// DelayedReported is the sidecars' own count of the requests they
	// released after a wait (floodgate_sidecar_delayed_total released);
	// when there is one, the CPU per delayed request is divided by it.
	DelayedReported int64 `json:"delayedReported,omitempty"`
	// Fallback is the sidecars' decisions made without the store (a call
	// over --redis-timeout, 50ms by default, on a busy machine): those
	// never delay, and admit on the replica's share of the rate.
	Fallback int64 `json:"fallbackDecisions"`
	// Metrics are the sidecars' metric families about delays and
	// waiting, summed over the sidecars.
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// Memory is the memory phase.
type Memory struct {
	Limiter string `json:"limiter"`
	Keys    int    `json:"keys"`
	Primed  int    `json:"primed"`
	// Target is the requests meant to wait at once; Sent those sent to
	// get there while the keys released some.
	Target  int `json:"target"`
	Sent    int `json:"sent"`
	Refused int `json:"refused"`
	Errors  int `json:"errors"`
	// Waiting is the requests sent and not answered at the sample of the
	// most waiting; RSSBefore the sidecar's RSS before they were sent
	// (after the primers), RSSAt its RSS at that sample, RSSMax the most.
	Waiting         int     `json:"waiting"`
	RSSBefore       int64   `json:"rssBeforeBytes"`
	RSSAt           int64   `json:"rssAtPeakWaitingBytes"`
	RSSMax          int64   `json:"rssMaxBytes"`
	BytesPerWaiting float64 `json:"bytesPerWaiting"`
	// Answered were answered (released, refused) before the sample.
	Answered int `json:"answeredDuring"`
	// Metrics are the sidecar's delay and waiting metrics at the sample.
	Metrics map[string]float64 `json:"metrics,omitempty"`
	Note    string             `json:"note"`
}

// bench holds the processes of a run.
type bench struct {
	o       options
	dir     string
	bin     string
	pin     bool
	procs   []*exec.Cmd
	cluster *redistest.Cluster
	self    string
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func runBench(ctx context.Context, o options) (rep *Report, err error) {
	dir, err := os.MkdirTemp("", "floodgate-delaybench-")
	if err != nil {
		return nil, err
	}
	b := &bench{o: o, dir: dir}
	defer b.close()
	rep = &Report{
		Machine: Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Started: time.Now().UTC().Format(time.RFC3339)},
		Settings: Settings{RatePerSec: o.rate, OfferedPerSec: o.offered, Seconds: o.duration.Seconds(), MaxDelay: o.maxDelay.String(),
			DelayAfter: o.delayAfter, NginxBurst: o.nginxBurst, Rule: b.ruleLimit(o.rate, "1s", o.maxDelay, o.delayAfter),
			NginxConf:   fmt.Sprintf("limit_req_zone $http_x_key rate=%dr/s; limit_req burst=%d (no nodelay); limit_req_status 429", o.rate, o.nginxBurst),
			SidecarArgs: strings.Join(o.sidecarArg, " ")},
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		rep.Machine.LoadAverage = strings.TrimSpace(string(la))
	}
	if err := b.setup(ctx); err != nil {
		return rep, err
	}
	if b.pin {
		rep.Machine.Pinning = "sidecars and nginx on CPU 0 (sidecars with GOMAXPROCS=1, nginx one worker loop); load generator, applications and Redis on CPU 1 (taskset)"
	} else {
		rep.Machine.Pinning = "none (taskset missing, -pin=false or fewer than 2 CPUs); sidecars with GOMAXPROCS=1"
	}
	defer b.accept(rep)
	if o.phases["delay"] || o.phases["memory"] {
		if err := b.startRedis(rep); err != nil {
			return rep, err
		}
	}
	if o.phases["delay"] {
		if rep.Floodgate, err = b.delayPhase(ctx, false); err != nil {
			return rep, fmt.Errorf("delay phase: %w", err)
		}
	}
	if o.phases["deny"] {
		if rep.FloodgateDeny, err = b.delayPhase(ctx, true); err != nil {
			return rep, fmt.Errorf("deny phase: %w", err)
		}
	}
	if ng := harness.FindNginx(o.nginx); o.nginx != "off" && ng != "" {
		if out, err := exec.Command(ng, "-v").CombinedOutput(); err == nil {
			rep.Machine.Nginx = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "nginx version: "))
		}
	}
	if o.phases["nginx"] {
		if ng := harness.FindNginx(o.nginx); o.nginx != "off" && ng != "" {
			if rep.Nginx, err = b.nginxPhase(ctx, ng, false); err != nil {
				return rep, fmt.Errorf("nginx phase: %w", err)
			}
		} else {
			rep.Skipped = append(rep.Skipped, "nginx: not found or -nginx off (hack/app-servers.sh or hack/bench.sh installs it)")
		}
	}
	if rep.Floodgate != nil && rep.Nginx != nil && rep.Nginx.CPUPerDelayedMicros > 0 {
		rep.CPURatio = rep.Floodgate.CPUPerDelayedMicros / rep.Nginx.CPUPerDelayedMicros
	}
	if ng := harness.FindNginx(o.nginx); o.phases["nginx-deny"] && o.nginx != "off" && ng != "" {
		if rep.NginxDeny, err = b.nginxPhase(ctx, ng, true); err != nil {
			return rep, fmt.Errorf("nginx deny phase: %w", err)
		}
	}
	if o.phases["memory"] || o.phases["nginx-memory"] {
		if err := b.memoryPhase(ctx, rep); err != nil {
			return rep, fmt.Errorf("memory phase: %w", err)
		}
	}
	return rep, nil
}

func (b *bench) setup(ctx context.Context) error {
	_, err := exec.LookPath("taskset")
	b.pin = b.o.pin && err == nil && runtime.NumCPU() >= 2
	if b.pin {
		if out, err := exec.Command("taskset", "-a", "-p", "-c", "1", strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
			return fmt.Errorf("pin the load generator: %w: %s", err, out)
		}
		// One P on one CPU (see the harness's setup).
		runtime.GOMAXPROCS(1)
	}
	if b.self, err = os.Executable(); err != nil {
		return err
	}
	b.bin = b.o.sidecar
	if b.bin == "" && (b.o.phases["delay"] || b.o.phases["memory"]) {
		b.bin = filepath.Join(b.dir, "floodgate-sidecar")
		b.logf("building floodgate-sidecar")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.bin, "github.com/floodgate-dev/floodgate/cmd/floodgate-sidecar")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build floodgate-sidecar: %w: %s", err, out)
		}
	}
	return nil
}

func (b *bench) startRedis(rep *Report) error {
	b.logf("starting a 3-master Redis Cluster")
	var err error
	if b.cluster, err = redistest.NewCluster(redistest.Options{Masters: 3}); err != nil {
		return err
	}
	if b.pin {
		for _, n := range b.cluster.Nodes() {
			_ = exec.Command("taskset", "-a", "-p", "-c", "1", strconv.Itoa(n.Pid())).Run()
		}
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		rep.Machine.Redis = strings.TrimSpace(string(out))
	}
	return nil
}

// start runs a process, pinned to cpu when pinning, and returns its pid
// (taskset execs the program, so the pid is the program's).
func (b *bench) start(ctx context.Context, cpu int, env []string, name string, args ...string) (int, error) {
	if b.pin {
		args = append([]string{"-c", strconv.Itoa(cpu), name}, args...)
		name = "taskset"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.Create(filepath.Join(b.dir, fmt.Sprintf("proc-%d.log", len(b.procs))))
	if err != nil {
		return 0, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", name, err)
	}
	b.procs = append(b.procs, cmd)
	return cmd.Process.Pid, nil
}

// stop ends one process the bench started.
func (b *bench) stop(pid int) {
	for _, p := range b.procs {
		if p.Process != nil && p.Process.Pid == pid && p.ProcessState == nil {
			_ = p.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { _ = p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = p.Process.Kill()
				<-done
			}
		}
	}
}

func (b *bench) close() {
	for _, p := range b.procs {
		if p.Process != nil && p.ProcessState == nil {
			_ = p.Process.Signal(os.Interrupt)
		}
	}
	for _, p := range b.procs {
		if p.ProcessState != nil {
			continue
		}
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	if b.cluster != nil {
		b.cluster.Close()
	}
	if os.Getenv("DELAYBENCH_KEEP") == "" {
		_ = os.RemoveAll(b.dir)
	} else {
		b.logf("kept %s", b.dir)
	}
}

// startApp starts an application on CPU 1 and returns its address.
func (b *bench) startApp(ctx context.Context) (string, error) {
	port, err := harness.FreePort()
	if err != nil {
		return "", err
	}
	addr := "127.0.0.1:" + port
	if _, err := b.start(ctx, 1, nil, b.self, "app", "-listen", addr); err != nil {
		return "", err
	}
	if err := harness.WaitHTTP(ctx, "http://"+addr+"/__arrivals", 200); err != nil {
		return "", fmt.Errorf("application: %w", err)
	}
	return addr, nil
}

// ruleLimit is the rule's limit in the sidecar config document.
func (b *bench) ruleLimit(rate int, per string, maxDelay time.Duration, delayAfter int) string {
	if b.o.limit != "" {
		return b.o.limit
	}
	return fmt.Sprintf("{requests: %d, per: %s, algorithm: GCRA, onExceed: Delay, maxDelay: %s, delayAfter: %d}", rate, per, maxDelay, delayAfter)
}

// policy writes the sidecar config document of n replicas named
// prefix-0.. with one delaying rule on path and returns its file.
func (b *bench) policy(prefix string, n int, path, limit string) (string, []string, error) {
	pods := make([]string, n)
	places := make([]string, n)
	for i := range n {
		pods[i] = fmt.Sprintf("%s-%d", prefix, i) // sorted for n <= 10
		places[i] = strconv.Itoa(i)
	}
	doc := fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
revision: delaybench
pods: [%s]
policies:
- name: delaybench
  uid: %s-%d
  replicas: %d
  replicaPods: [%s]
  rules:
  - name: %s
    match: {path: {type: Prefix, value: %s}}
    key: [{header: X-Key}]
    limit: %s
`, strings.Join(pods, ", "), prefix, time.Now().UnixNano(), n, strings.Join(places, ", "), prefix, path, limit)
	f := filepath.Join(b.dir, prefix+"-policy.yaml")
	return f, pods, os.WriteFile(f, []byte(doc), 0o600)
}

// sidecar starts one sidecar on CPU 0 on the Redis store in front of app,
// and returns its pid, proxy URL and admin URL.
func (b *bench) sidecar(ctx context.Context, policy, pod, app string, extra ...string) (int, string, string, error) {
	lp, err := harness.FreePort()
	if err != nil {
		return 0, "", "", err
	}
	ap, err := harness.FreePort()
	if err != nil {
		return 0, "", "", err
	}
	args := []string{"--listen", "127.0.0.1:" + lp, "--admin-listen", "127.0.0.1:" + ap,
		"--upstream", "http://" + app, "--policy-file", policy, "--store", "redis",
		"--redis-addrs", strings.Join(b.cluster.Addrs(), ","), "--log-level", "warn", "--pod-name", pod}
	args = append(append(args, b.o.sidecarArg...), extra...)
	pid, err := b.start(ctx, 0, []string{"GOMAXPROCS=1"}, b.bin, args...)
	if err != nil {
		return 0, "", "", err
	}
	if err := harness.WaitHTTP(ctx, "http://127.0.0.1:"+ap+"/readyz", 200); err != nil {
		log, _ := os.ReadFile(filepath.Join(b.dir, fmt.Sprintf("proc-%d.log", len(b.procs)-1)))
		return 0, "", "", fmt.Errorf("sidecar not ready: %w: %s", err, log)
	}
	return pid, "http://127.0.0.1:" + lp, "http://127.0.0.1:" + ap, nil
}

// header is the load's headers: the key and the request's number.
func header(key string) func([]byte, int64) []byte {
	return func(dst []byte, i int64) []byte {
		dst = append(dst, "X-Key: "...)
		dst = append(dst, key...)
		dst = append(dst, "\r\nX-Req: "...)
		dst = strconv.AppendInt(dst, i, 10)
		return append(dst, "\r\n"...)
	}
}

// warm sends a second of light traffic on another key through urls, so
// that connections to Redis and the applications exist before the
// measurement; the applications do not log it (no X-Req).
func (b *bench) warm(ctx context.Context, urls []string) error {
	t := harness.Target{URLs: urls, Header: func(dst []byte, i int64) []byte { return append(dst, "X-Key: warm\r\n"...) }}
	_, err := harness.OpenLoop(ctx, harness.NewClient(), t, 50, time.Second, 64)
	return err
}

// offer runs the measured load through urls and returns the load
// generator's records and the CPU time pids spent meanwhile.
func (b *bench) offer(ctx context.Context, urls []string, pids []int) ([]outcome, harness.Stats, time.Duration, float64, error) {
	// The limiters' CPU while idle first: what they spend whatever the
	// traffic (runtime, timers, store health checks).
	i0, err := cpuOf(pids)
	if err != nil {
		return nil, harness.Stats{}, 0, 0, err
	}
	t0 := time.Now()
	time.Sleep(idleWindow)
	i1, err := cpuOf(pids)
	if err != nil {
		return nil, harness.Stats{}, 0, 0, err
	}
	idle := (i1 - i0).Seconds() / time.Since(t0).Seconds()
	cpu0, err := cpuOf(pids)
	if err != nil {
		return nil, harness.Stats{}, 0, 0, err
	}
	c := harness.NewClient()
	st, recs, err := harness.OpenLoopRecords(ctx, c, harness.Target{URLs: urls, Header: header("one")}, b.o.offered, b.o.duration, b.o.workers)
	if err != nil {
		return nil, st, 0, 0, err
	}
	cpu1, err := cpuOf(pids)
	if err != nil {
		return nil, st, 0, 0, err
	}
	c.CloseIdle()
	out := make([]outcome, len(recs))
	for i, r := range recs {
		out[i] = outcome{Due: r.Due, Sent: r.Sent, Done: r.Done, Status: r.Status}
	}
	return out, st, cpu1 - cpu0, idle, nil
}

// idleWindow is how long the limiters' idle CPU is measured.
const idleWindow = 4 * time.Second

func cpuOf(pids []int) (time.Duration, error) {
	var sum time.Duration
	for _, p := range pids {
		c, err := harness.ProcCPU(p)
		if err != nil {
			return 0, err
		}
		sum += c
	}
	return sum, nil
}

// arrivals fetches and merges the applications' arrival logs.
func arrivals(apps []string) ([]arrival, error) {
	var all []arrival
	for _, a := range apps {
		res, err := http.Get("http://" + a + "/__arrivals")
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if err != nil {
			return nil, err
		}
		as, err := parseArrivals(string(body))
		if err != nil {
			return nil, err
		}
		all = append(all, as...)
	}
	return all, nil
}

// summarise fills a Side from a run's records and arrivals.
func (b *bench) summarise(s *Side, recs []outcome, arr []arrival, cpu time.Duration, idle float64, elapsed time.Duration, delayed func(string, time.Duration) bool) {
	var delays, held, lats []time.Duration
	var times []time.Time
	s.Counts, delays, held, lats, times = classify(recs, arr, delayed)
	s.Delay, s.Held, s.Latency = dist(delays), dist(held), dist(lats)
	var t0 time.Time
	if len(recs) > 0 {
		t0 = recs[0].Due
	}
	s.PerSecond = perSecond(t0, times)
	// The full seconds of the offer after the first: 1 .. D-1.
	s.Bar = checkRate(s.PerSecond, 1, int(b.o.duration/time.Second)-1, float64(b.o.rate), 0.02)
	s.CPUSeconds = cpu.Seconds()
	s.IdleCPUPerSec = idle
	s.OfferSeconds = elapsed.Seconds()
	if s.Sent > 0 {
		s.CPUPerSentMicros = float64(cpu.Microseconds()) / float64(s.Sent)
	}
	s.perDelayed(s.Delayed)
}

// perDelayed sets the CPU per delayed request, with n delayed.
func (s *Side) perDelayed(n int64) {
	if n <= 0 {
		return
	}
	s.CPUPerDelayedMicros = s.CPUSeconds * 1e6 / float64(n)
	s.CPUAboveIdlePerDelayedMicros = max(s.CPUSeconds-s.IdleCPUPerSec*s.OfferSeconds, 0) * 1e6 / float64(n)
}

// delayPhase is 3 sidecars on the Redis Cluster, each before its own
// application.
func (b *bench) delayPhase(ctx context.Context, deny bool) (*Side, error) {
	const n = 3
	limit, prefix := b.ruleLimit(b.o.rate, "1s", b.o.maxDelay, b.o.delayAfter), "delay"
	if deny {
		// The same meter answering 429 at once: a burst of delayAfter.
		limit, prefix = fmt.Sprintf("{requests: %d, per: 1s, algorithm: GCRA, burst: %d}", b.o.rate, b.o.delayAfter), "deny"
	}
	pf, pods, err := b.policy(prefix, n, "/delay", limit)
	if err != nil {
		return nil, err
	}
	var apps, urls, admins []string
	var pids []int
	var extra []string
	if b.o.profile != "" {
		extra = []string{"--admin-pprof"}
	}
	for i := range n {
		app, err := b.startApp(ctx)
		if err != nil {
			return nil, err
		}
		pid, url, admin, err := b.sidecar(ctx, pf, pods[i], app, extra...)
		if err != nil {
			return nil, err
		}
		apps, urls, admins, pids = append(apps, app), append(urls, url+"/delay"), append(admins, admin), append(pids, pid)
	}
	b.logf("[floodgate] %d sidecars on Redis, rule %s; warm-up on another key", n, limit)
	if err := b.warm(ctx, urls); err != nil {
		return nil, err
	}
	before, err := scrapeDelay(admins)
	if err != nil {
		return nil, err
	}
	b.logf("[floodgate] offering %.0f/s for %v on one key over %d sidecars", b.o.offered, b.o.duration, n)
	var prof chan error
	if b.o.profile != "" {
		prof = make(chan error, 1)
		go func() { prof <- b.cpuProfile(ctx, admins[0], b.o.duration-time.Second) }()
	}
	recs, st, cpu, idle, err := b.offer(ctx, urls, pids)
	if err != nil {
		return nil, err
	}
	arr, err := arrivals(apps)
	if err != nil {
		return nil, err
	}
	after, err := scrapeDelay(admins)
	if err != nil {
		return nil, err
	}
	for k, v := range before {
		// Counters over the run; gauges as they are at its end.
		name, _, _ := strings.Cut(k, "{")
		if strings.HasSuffix(name, "_total") || strings.HasSuffix(name, "_count") || strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_bucket") {
			after[k] -= v
		}
	}
	s := &Side{Name: fmt.Sprintf("floodgate: %d sidecars on a 3-master Redis Cluster", n), Limiters: n, Apps: n, Metrics: after, Rule: limit}
	marked := false
	for _, a := range arr {
		if a.Mark != "" {
			marked = true
			break
		}
	}
	delayed := func(mark string, d time.Duration) bool { return mark != "" }
	s.DelayedBy = "the sidecar's delay header on the forwarded request"
	if !marked {
		delayed = func(_ string, d time.Duration) bool { return d >= delayThreshold }
		s.DelayedBy = fmt.Sprintf("arrival at the application at least %v after the request was sent (the sidecar forwards a delayed request unchanged; its exact count is delayed_total{result=\"released\"})", delayThreshold)
	}
	b.summarise(s, recs, arr, cpu, idle, st.Elapsed, delayed)
	// The sidecars count the requests they released after a wait: the
	// exact number delayed, which the CPU is divided by.
	for k, v := range s.Metrics {
		if strings.HasPrefix(k, "floodgate_sidecar_delayed_total{") && strings.Contains(k, `result="released"`) {
			s.DelayedReported += int64(v)
		}
	}
	if s.DelayedReported > 0 {
		s.perDelayed(s.DelayedReported)
	}
	for k, v := range s.Metrics {
		if strings.HasPrefix(k, "floodgate_sidecar_fallback_decisions_total{") {
			s.Fallback += int64(v)
		}
	}
	if prof != nil {
		if err := <-prof; err != nil {
			return nil, fmt.Errorf("CPU profile: %w", err)
		}
		b.logf("[floodgate] CPU profile of the first sidecar in %s", b.o.profile)
	}
	b.logf("[floodgate] sent %d (%.0f/s achieved), 2xx %d (delayed %d), 429 %d, errors %d", st.Sent, st.Rate, s.OK, s.Delayed, s.Refused, s.Errors)
	return s, nil
}

// cpuProfile fetches a CPU profile of the sidecar at admin over d into
// the -profile file.
func (b *bench) cpuProfile(ctx context.Context, admin string, d time.Duration) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", admin, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != 200 {
		return fmt.Errorf("%s", res.Status)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(b.o.profile, body, 0o644)
}

// delayThreshold tells a delayed request from one passed at once when the
// limiter does not mark it: a request passed at once reaches the
// application well within it on loopback.
const delayThreshold = 5 * time.Millisecond

// scrapeDelay sums, per metric family, the samples of the sidecars'
// families about delays and waiting.
func scrapeDelay(admins []string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, a := range admins {
		res, err := http.Get(a + "/metrics")
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(body), "\n") {
			if line == "" || line[0] == '#' {
				continue
			}
			name := line
			if i := strings.IndexAny(name, "{ "); i >= 0 {
				name = name[:i]
			}
			l := strings.ToLower(name)
			if !strings.Contains(l, "delay") && !strings.Contains(l, "wait") && !strings.Contains(l, "queue") && !strings.Contains(l, "fallback") &&
				!strings.HasPrefix(l, "floodgate_sidecar_store_operations_total") &&
				l != "go_memstats_heap_inuse_bytes" && l != "go_goroutines" {
				continue
			}
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				continue
			}
			// Keep the label text of the families with labels.
			key := name
			if i := strings.IndexByte(line, '{'); i >= 0 {
				if j := strings.LastIndexByte(line, '}'); j > i {
					key = line[:j+1]
				}
			}
			out[key] += v
		}
	}
	return out, nil
}

// nginxConf is nginx in the reference layout of floodgate-bench (one
// process, one worker loop, kept upstream connections), with a limit_req
// zone (%[4]s) and limit_req (%[5]s) on X-Key, 429 past the burst, no
// logging of delays or refusals (error_log at error; the sidecars run
// with --log-level warn), and $limit_req_status passed to the
// application.
const nginxConf = `daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 30000;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log error;
events { worker_connections 16384; }
http {
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  access_log off;
  upstream app { server %[2]s; keepalive 128; }
  %[4]s
  limit_req_status 429;
  server {
    listen 127.0.0.1:%[3]s;
    location / {
      %[5]s
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Limit-Req $limit_req_status;
    }
  }
}
`

// startNginx starts an nginx on CPU 0 in front of app with a limit_req
// zone and directive, and returns its pid and base URL.
func (b *bench) startNginx(ctx context.Context, bin, name, app, zone, limit string) (int, string, error) {
	nd := filepath.Join(b.dir, "nginx-"+name)
	if err := os.MkdirAll(nd, 0o755); err != nil {
		return 0, "", err
	}
	port, err := harness.FreePort()
	if err != nil {
		return 0, "", err
	}
	conf := filepath.Join(nd, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, nd, app, port, zone, limit), 0o600); err != nil {
		return 0, "", err
	}
	pid, err := b.start(ctx, 0, nil, bin, "-p", nd, "-c", conf)
	if err != nil {
		return 0, "", err
	}
	url := "http://127.0.0.1:" + port
	if err := harness.WaitHTTP(ctx, url+"/", 200); err != nil {
		log, _ := os.ReadFile(filepath.Join(nd, "error.log"))
		return 0, "", fmt.Errorf("nginx not serving: %w: %s", err, log)
	}
	return pid, url, nil
}

func (b *bench) nginxPhase(ctx context.Context, bin string, deny bool) (*Side, error) {
	app, err := b.startApp(ctx)
	if err != nil {
		return nil, err
	}
	name, limit := "delay", fmt.Sprintf("limit_req zone=delay burst=%d;", b.o.nginxBurst)
	if deny {
		name, limit = "deny", "limit_req zone=delay;"
	}
	pid, url, err := b.startNginx(ctx, bin, name, app, fmt.Sprintf("limit_req_zone $http_x_key zone=delay:10m rate=%dr/s;", b.o.rate), limit)
	if err != nil {
		return nil, err
	}
	b.logf("[nginx] %s; warm-up on another key", limit)
	urls := []string{url + "/delay"}
	if err := b.warm(ctx, urls); err != nil {
		return nil, err
	}
	b.logf("[nginx] offering %.0f/s for %v on one key", b.o.offered, b.o.duration)
	recs, st, cpu, idle, err := b.offer(ctx, urls, []int{pid})
	if err != nil {
		return nil, err
	}
	arr, err := arrivals([]string{app})
	if err != nil {
		return nil, err
	}
	s := &Side{Name: "nginx limit_req", Limiters: 1, Apps: 1, DelayedBy: "$limit_req_status = DELAYED, passed to the application", Rule: limit}
	b.summarise(s, recs, arr, cpu, idle, st.Elapsed, func(mark string, _ time.Duration) bool { return mark == "DELAYED" })
	b.logf("[nginx] sent %d (%.0f/s achieved), 2xx %d (delayed %d), 429 %d, errors %d", st.Sent, st.Rate, s.OK, s.Delayed, s.Refused, s.Errors)
	b.stop(pid)
	return s, nil
}

// serveApp is the application: it answers every request with a small 200
// and logs the number (X-Req) and arrival time of each numbered request,
// with nginx's X-Limit-Req or any header about a delay the sidecar put on
// it; GET /__arrivals returns the log.
func serveApp(ctx context.Context, addr string) error {
	var mu sync.Mutex
	var log []byte
	srv := &http.Server{
		Addr: addr,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			now := time.Now()
			if r.URL.Path == "/__arrivals" {
				mu.Lock()
				b := append([]byte(nil), log...)
				mu.Unlock()
				_, _ = w.Write(b)
				return
			}
			if id := r.Header.Get("X-Req"); id != "" {
				mark := r.Header.Get("X-Limit-Req")
				if mark == "" {
					mark = delayHeaders(r.Header)
				}
				mu.Lock()
				log = fmt.Appendf(log, "%s %d %s\n", id, now.UnixNano(), mark)
				mu.Unlock()
			}
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "ok\n")
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// delayHeaders returns the request headers whose name speaks of a delay or
// a wait, as "Name=value" joined by ";" ("" for none).
func delayHeaders(h http.Header) string {
	var names []string
	for k := range h {
		l := strings.ToLower(k)
		if strings.Contains(l, "delay") || strings.Contains(l, "wait") {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, k := range names {
		parts = append(parts, k+"="+strings.Join(h[k], ","))
	}
	return strings.Join(parts, ";")
}
