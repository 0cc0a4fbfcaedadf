// Command floodgate-shedbench measures the priority load shedder against
// an overloaded application, in `make bench`.
//
// The application is a worker pool of -workers workers with a fixed service
// time (-service): its capacity C is workers/service requests a second.
// Requests beyond the workers wait in its queue, and it serves every
// request it dequeues, whether or not its client is still there (as most
// applications do). One floodgate-sidecar (the real binary, memory store)
// stands in front of it. An open-loop Poisson load offers -load times C,
// of which -critical are marked critical (header X-Class: critical); a
// client gives up after -timeout. Three arms run one after the other, each
// with a fresh sidecar and a fresh application:
//
//   - shedder: the policy has loadShedding and a rule that makes
//     X-Class: critical requests Critical;
//   - none: the same rule without loadShedding, so nothing is shed;
//   - static cap: a concurrency rule caps all requests in flight at the
//     worker count, the best static setting, without priorities.
//
// Before them, critical requests at a tenth of C through the shedder's
// sidecar give the idle p99 that the overloaded critical p99 is compared
// with. Figures: per class the requests sent, answered 200 in time, shed
// (503), refused (429) and timed out; latency percentiles of the 200s; the
// goodput (200s in time per second) against C; what the application
// served per second, the part beyond the goodput being work whose client
// had given up.
//
// Where taskset exists and there are two CPUs, the sidecar runs on CPU 0
// and the application and the load on CPU 1 (-pin=false turns that off);
// the report gives the pinning and the machine's load average.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "floodgate-shedbench:", err)
		os.Exit(1)
	}
}

// options are the bench's settings.
type options struct {
	sidecar  string
	workers  int
	service  time.Duration
	load     float64
	critical float64
	timeout  time.Duration
	warmup   time.Duration
	duration time.Duration
	idle     time.Duration
	out      string
	pin      bool

	reserveCritical, reserveDefault int
}

func run(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet("floodgate-shedbench", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.sidecar, "sidecar", "", "floodgate-sidecar binary (default: go build it)")
	fs.IntVar(&o.workers, "workers", 16, "the application's workers")
	fs.DurationVar(&o.service, "service", 25*time.Millisecond, "the application's service time per request")
	fs.Float64Var(&o.load, "load", 3, "offered load, in multiples of the application's capacity")
	fs.Float64Var(&o.critical, "critical", 0.2, "share of the load marked critical")
	fs.DurationVar(&o.timeout, "timeout", time.Second, "a client gives up after this long")
	fs.DurationVar(&o.warmup, "warmup", 5*time.Second, "overload before the measurement, not counted")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each arm's measurement")
	fs.DurationVar(&o.idle, "idle", 5*time.Second, "length of the idle measurement")
	fs.StringVar(&o.out, "out", "", "write the JSON report here too")
	fs.BoolVar(&o.pin, "pin", true, "pin the sidecar to CPU 0 and the application and load to CPU 1 with taskset, where it exists")
	fs.IntVar(&o.reserveCritical, "reserve-critical", 20, "the shedder's reserved.critical, percent (the policy's default 20)")
	fs.IntVar(&o.reserveDefault, "reserve-default", 10, "the shedder's reserved.default, percent (the policy's default 10)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.workers < 1 || o.service <= 0 || o.load <= 0 || o.critical < 0 || o.critical > 1 || o.timeout <= 0 || o.duration <= 0 {
		return errors.New("-workers, -service, -load, -timeout and -duration must be positive and -critical within 0..1")
	}
	rep, err := bench(ctx, o)
	if err != nil {
		return err
	}
	rep.table(os.Stdout)
	if o.out != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.out, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("write the report: %w", err)
		}
	}
	return nil
}

// The policies of the arms: %d is the static cap.
const (
	criticalRule = `
  - name: critical
    match: {headers: [{name: X-Class, value: critical}]}
    priority: Critical`
	policyHead = `apiVersion: floodgate.dev/sidecar-config/v1
revision: shedbench
policies:
- name: shedbench
  uid: shedbench-%s
  replicas: 1
`
	shedderPolicy = policyHead + "  loadShedding: {reserved: {critical: %d, default: %d}}\n  rules:" + criticalRule + "\n"
	nonePolicy    = policyHead + "  rules:" + criticalRule + "\n"
	capPolicy     = policyHead + `  rules:
  - name: cap
    key: []
    concurrency: {max: %d}` + criticalRule + "\n"
)

// Report is the bench's result.
type Report struct {
	Workers        int     `json:"workers"`
	ServiceMS      float64 `json:"serviceMs"`
	Capacity       float64 `json:"capacityPerSecond"`
	Offered        float64 `json:"offeredPerSecond"`
	CriticalShare  float64 `json:"criticalShare"`
	TimeoutMS      float64 `json:"clientTimeoutMs"`
	DurationS      float64 `json:"durationSeconds"`
	IdleCriticalMS Quant   `json:"idleCriticalMs"`
	Arms           []Arm   `json:"arms"`
	// Pinning says where the processes ran; LoadAverage is /proc/loadavg
	// at the start and at the end of the run.
	Pinning     string   `json:"pinning"`
	LoadAverage []string `json:"loadAverage"`
}

// Arm is one arm's figures.
type Arm struct {
	Name string `json:"name"`
	// Classes are the figures of critical and other requests.
	Critical Class `json:"critical"`
	Other    Class `json:"other"`
	// Goodput is the requests answered 200 in time per second.
	Goodput float64 `json:"goodputPerSecond"`
	// Served is what the application served per second: the part of it
	// beyond the goodput is work whose client had given up.
	Served float64 `json:"servedPerSecond"`
	// Limit is the shedder's adaptive limit at the end, when it has one,
	// and CriticalReserve the part of it only Critical requests may use.
	Limit           float64 `json:"shedderLimit,omitempty"`
	CriticalReserve float64 `json:"criticalReserve,omitempty"`
	// Acceptance is the bar, for the shedder arm.
	Acceptance []Check `json:"acceptance,omitempty"`
}

// Class is one request class's figures in an arm.
type Class struct {
	Sent     int     `json:"sent"`
	OK       int     `json:"ok"`
	Shed     int     `json:"shed"`
	Refused  int     `json:"refused"`
	TimedOut int     `json:"timedOut"`
	Other    int     `json:"other"`
	Success  float64 `json:"success"`
	Latency  Quant   `json:"latencyMs"`
}

// Quant are latency percentiles of the 200s, in milliseconds.
type Quant struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Check is one acceptance figure.
type Check struct {
	What string  `json:"what"`
	Got  float64 `json:"got"`
	Want string  `json:"want"`
	Met  bool    `json:"met"`
}

// result is one request's outcome.
type result struct {
	critical bool
	status   int // 0: timed out or failed
	timedOut bool
	latency  time.Duration
}

func bench(ctx context.Context, o options) (*Report, error) {
	dir, err := os.MkdirTemp("", "floodgate-shedbench-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	bin := o.sidecar
	if bin == "" {
		bin = filepath.Join(dir, "floodgate-sidecar")
		logf("building floodgate-sidecar")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/floodgate-dev/floodgate/cmd/floodgate-sidecar")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build floodgate-sidecar: %w: %s", err, out)
		}
	}
	taskset := ""
	if _, err := exec.LookPath("taskset"); err == nil && o.pin && runtime.NumCPU() >= 2 {
		// The load and the application share CPU 1; the sidecar has CPU 0.
		if out, err := exec.Command("taskset", "-a", "-p", "-c", "1", strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("pin the application and the load: %w: %s", err, out)
		}
		taskset = "0"
	}
	capacity := float64(o.workers) / o.service.Seconds()
	rep := &Report{Workers: o.workers, ServiceMS: ms(o.service), Capacity: capacity, Offered: o.load * capacity,
		CriticalShare: o.critical, TimeoutMS: ms(o.timeout), DurationS: o.duration.Seconds()}
	rep.Pinning = "none"
	if taskset != "" {
		rep.Pinning = "sidecar on CPU 0; application and load on CPU 1 (taskset)"
	}
	rep.LoadAverage = append(rep.LoadAverage, loadAverage())
	defer func() { rep.LoadAverage = append(rep.LoadAverage, loadAverage()) }()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8192, IdleConnTimeout: 30 * time.Second,
		DialContext: (&net.Dialer{Timeout: time.Second}).DialContext}}

	arms := []struct{ name, policy string }{
		{"shedder", fmt.Sprintf(shedderPolicy, "%s", o.reserveCritical, o.reserveDefault)},
		{"static cap", fmt.Sprintf(capPolicy, "%s", o.workers)},
		{"none", nonePolicy},
	}
	for i, a := range arms {
		app, err := newApp(o.workers, o.service)
		if err != nil {
			return nil, err
		}
		sc, err := startSidecar(ctx, bin, taskset, dir, app.addr, fmt.Sprintf(a.policy, strconv.Itoa(i)))
		if err != nil {
			app.close()
			return nil, err
		}
		if i == 0 {
			logf("idle: critical requests at %.0f/s for %s", capacity/10, o.idle)
			res := offer(ctx, client, sc.url, capacity/10, 1, o.timeout, 0, o.idle)
			rep.IdleCriticalMS = quantiles(okLatencies(res, true))
		}
		logf("%s: %.0f/s (%.0f%% critical) against a capacity of %.0f/s, %s warm-up and %s measured", a.name,
			o.load*capacity, 100*o.critical, capacity, o.warmup, o.duration)
		served0 := app.served.Load()
		t0 := time.Now()
		res := offer(ctx, client, sc.url, o.load*capacity, o.critical, o.timeout, o.warmup, o.duration)
		// The application's counts over the measured part are approximated
		// by its counts over the whole run less the warm-up's share.
		el := time.Since(t0).Seconds()
		arm := summarize(a.name, res, o.duration)
		frac := o.duration.Seconds() / el
		arm.Served = float64(app.served.Load()-served0) * frac / o.duration.Seconds()
		if a.name == "shedder" {
			if l := sc.gauge("floodgate_sidecar_shedding_limit"); !math.IsNaN(l) {
				arm.Limit = l
			}
			if r := sc.gauge("floodgate_sidecar_shedding_critical_reserve"); !math.IsNaN(r) {
				arm.CriticalReserve = r
			}
			arm.Acceptance = acceptance(arm, rep.IdleCriticalMS, capacity)
		}
		rep.Arms = append(rep.Arms, arm)
		sc.stop()
		app.close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return rep, nil
}

// acceptance is the bar for the shedder.
func acceptance(a Arm, idle Quant, capacity float64) []Check {
	return []Check{
		{What: "critical success", Got: a.Critical.Success, Want: ">= 0.995", Met: a.Critical.Success >= 0.995},
		{What: "critical p99 / idle p99", Got: a.Critical.Latency.P99 / idle.P99, Want: "<= 2", Met: a.Critical.Latency.P99 <= 2*idle.P99},
		{What: "goodput / capacity", Got: a.Goodput / capacity, Want: ">= 0.9", Met: a.Goodput >= 0.9*capacity},
	}
}

// summarize counts an arm's results.
func summarize(name string, res []result, d time.Duration) Arm {
	a := Arm{Name: name}
	for _, r := range res {
		c := &a.Other
		if r.critical {
			c = &a.Critical
		}
		c.Sent++
		switch {
		case r.timedOut:
			c.TimedOut++
		case r.status == http.StatusOK:
			c.OK++
		case r.status == http.StatusServiceUnavailable:
			c.Shed++
		case r.status == http.StatusTooManyRequests:
			c.Refused++
		default:
			c.Other++
		}
	}
	for _, c := range []*Class{&a.Critical, &a.Other} {
		if c.Sent > 0 {
			c.Success = float64(c.OK) / float64(c.Sent)
		}
	}
	a.Critical.Latency = quantiles(okLatencies(res, true))
	a.Other.Latency = quantiles(okLatencies(res, false))
	a.Goodput = float64(a.Critical.OK+a.Other.OK) / d.Seconds()
	return a
}

func okLatencies(res []result, critical bool) []time.Duration {
	var out []time.Duration
	for _, r := range res {
		if r.critical == critical && r.status == http.StatusOK {
			out = append(out, r.latency)
		}
	}
	return out
}

// quantiles are the nearest-rank percentiles of ls, in milliseconds.
func quantiles(ls []time.Duration) Quant {
	if len(ls) == 0 {
		return Quant{}
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i] < ls[j] })
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(ls)))) - 1
		return ms(ls[max(i, 0)])
	}
	return Quant{P50: at(0.5), P99: at(0.99), Max: ms(ls[len(ls)-1])}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// offer sends an open-loop Poisson load of rate requests a second to url
// for warmup+d, critical's share of them critical, and returns the
// outcomes of those sent after the warm-up.
func offer(ctx context.Context, client *http.Client, url string, rate, critical float64, timeout, warmup, d time.Duration) []result {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	start := time.Now()
	measureFrom, end := start.Add(warmup), start.Add(warmup+d)
	var mu sync.Mutex
	var out []result
	var wg sync.WaitGroup
	next := start
	for next.Before(end) && ctx.Err() == nil {
		if w := time.Until(next); w > 0 {
			time.Sleep(w)
		}
		counted := !next.Before(measureFrom)
		crit := rng.Float64() < critical
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := do(ctx, client, url, crit, timeout)
			if counted {
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
			}
		}()
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
	}
	wg.Wait()
	return out
}

// do sends one request and reads its answer within timeout.
func do(ctx context.Context, client *http.Client, url string, critical bool, timeout time.Duration) result {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r := result{critical: critical}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/work", nil)
	if err != nil {
		return r
	}
	if critical {
		req.Header.Set("X-Class", "critical")
	}
	t0 := time.Now()
	res, err := client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
	}
	r.latency = time.Since(t0)
	if err != nil {
		r.timedOut = errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil
		return r
	}
	r.status = res.StatusCode
	return r
}

// app is the application: a pool of workers with a fixed service time and
// an unbounded queue in front of them.
type app struct {
	srv     *http.Server
	addr    string
	workers chan struct{}
	served  atomic.Int64
}

func newApp(workers int, service time.Duration) (*app, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &app{addr: ln.Addr().String(), workers: make(chan struct{}, workers)}
	a.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.workers <- struct{}{} // the queue: goroutines wait here in order
		time.Sleep(service)
		<-a.workers
		a.served.Add(1)
		_, _ = io.WriteString(w, "done\n")
	})}
	go func() { _ = a.srv.Serve(ln) }()
	return a, nil
}

// close stops accepting; requests still queued finish on their own.
func (a *app) close() { _ = a.srv.Close() }

// sidecar is a running floodgate-sidecar.
type sidecar struct {
	cmd        *exec.Cmd
	url, admin string
}

func startSidecar(ctx context.Context, bin, cpu, dir, upstream, policy string) (*sidecar, error) {
	f, err := os.CreateTemp(dir, "policy-*.yaml")
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteString(policy); err != nil {
		_ = f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	lp, err := freePort()
	if err != nil {
		return nil, err
	}
	ap, err := freePort()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(f.Name() + ".log")
	if err != nil {
		return nil, err
	}
	args := []string{"--listen", "127.0.0.1:" + lp, "--admin-listen", "127.0.0.1:" + ap,
		"--upstream", "http://" + upstream, "--policy-file", f.Name(), "--store", "memory", "--log-level", "warn"}
	name := bin
	if cpu != "" {
		name, args = "taskset", append([]string{"-c", cpu, bin}, args...)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start floodgate-sidecar: %w", err)
	}
	s := &sidecar{cmd: cmd, url: "http://127.0.0.1:" + lp, admin: "http://127.0.0.1:" + ap}
	if err := waitReady(ctx, s.admin+"/readyz"); err != nil {
		s.stop()
		out, _ := os.ReadFile(log.Name())
		return nil, fmt.Errorf("floodgate-sidecar not ready: %w: %s", err, out)
	}
	return s, nil
}

// loadAverage is the first three fields of /proc/loadavg, or "unknown".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func (s *sidecar) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// gauge reads an unlabelled gauge from the sidecar's metrics; NaN when it
// cannot.
func (s *sidecar) gauge(name string) float64 {
	res, err := http.Get(s.admin + "/metrics")
	if err != nil {
		return math.NaN()
	}
	defer func() { _ = res.Body.Close() }()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return math.NaN()
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

func waitReady(ctx context.Context, url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if res, err := http.Get(url); err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return errors.New("timed out")
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	_, p, err := net.SplitHostPort(l.Addr().String())
	return p, err
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "floodgate-shedbench: "+format+"\n", args...)
}

// table prints the report.
func (r *Report) table(w io.Writer) {
	_, _ = fmt.Fprintf(w, "application: %d workers x %.0fms = capacity C %.0f/s; offered %.0f/s (%.1f C), %.0f%% critical; clients give up after %.0fms\n",
		r.Workers, r.ServiceMS, r.Capacity, r.Offered, r.Offered/r.Capacity, 100*r.CriticalShare, r.TimeoutMS)
	_, _ = fmt.Fprintf(w, "pinning: %s; load average %s\n", r.Pinning, strings.Join(r.LoadAverage, ", then "))
	_, _ = fmt.Fprintf(w, "idle critical latency: p50 %.1fms p99 %.1fms\n\n", r.IdleCriticalMS.P50, r.IdleCriticalMS.P99)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "arm\tcritical ok\tcritical shed/timeout\tcritical p50\tcritical p99\tother ok\tother shed/429/timeout/error\tgoodput\tgoodput/C\tserved/s\tlimit")
	for _, a := range r.Arms {
		_, _ = fmt.Fprintf(tw, "%s\t%.2f%%\t%d/%d\t%.1fms\t%.1fms\t%.2f%%\t%d/%d/%d/%d\t%.0f/s\t%.2f\t%.0f\t%s\n", a.Name,
			100*a.Critical.Success, a.Critical.Shed, a.Critical.TimedOut, a.Critical.Latency.P50, a.Critical.Latency.P99, 100*a.Other.Success,
			a.Other.Shed, a.Other.Refused, a.Other.TimedOut, a.Other.Other, a.Goodput, a.Goodput/r.Capacity, a.Served, limitText(a.Limit, a.CriticalReserve))
	}
	_ = tw.Flush()
	for _, a := range r.Arms {
		for _, c := range a.Acceptance {
			verdict := "met"
			if !c.Met {
				verdict = "NOT met"
			}
			_, _ = fmt.Fprintf(w, "%s: %s %.3f (want %s): %s\n", a.Name, c.What, c.Got, c.Want, verdict)
		}
	}
}

func limitText(l, reserve float64) string {
	if l == 0 || math.IsNaN(l) {
		return "-"
	}
	return fmt.Sprintf("%.0f (%.1f)", l, reserve)
}
