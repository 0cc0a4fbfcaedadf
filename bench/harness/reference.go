package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The reference phase measures the sidecar beside nginx, the proxy users
// compare every sidecar with, in the same run and the same process layout
// (each service on CPU 0, the load generator and the backend on CPU 1),
// in alternating rounds: CPU per request at the closed-loop maximum for
// proxied requests (nginx proxy_pass) and for denied ones (nginx
// limit_req), each with its default logging of denials and without, and
// the latency each adds over the direct path, open loop.

// nginxConf is the reference nginx: one process (no master), one worker
// loop, keep-alive connections to the backend. Port 1 is proxy_pass with
// no access log (the sidecar writes none for allowed requests); port 2 is
// limit_req with nginx's default logging (every request in the access log,
// every denial in the error log); port 3 is limit_req with neither.
const nginxConf = `daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log error;
events { worker_connections 4096; }
http {
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  access_log off;
  upstream app { server %[2]s; keepalive 128; }
  limit_req_zone $http_x_key zone=hot:10m rate=1r/m;
  limit_req_status 429;
  server {
    listen 127.0.0.1:%[3]s;
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  server {
    listen 127.0.0.1:%[4]s;
    access_log %[1]s/access.log;
    error_log %[1]s/limit.log;
    location / { limit_req zone=hot; proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  server {
    listen 127.0.0.1:%[5]s;
    error_log %[1]s/limit-quiet.log crit;
    location / { limit_req zone=hot; proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
`

// Reference is the reference phase's report.
type Reference struct {
	// Nginx is `nginx -v`'s version.
	Nginx  string `json:"nginx"`
	Rounds int    `json:"rounds"`
	// Cases are the closed-loop CPU comparisons.
	Cases []RefCase `json:"cases"`
	// Latency are the open-loop comparisons.
	Latency []RefLatency `json:"latency"`
}

// RefCase compares the CPU per request of nginx and the sidecar in one
// case, closed loop.
type RefCase struct {
	Name    string  `json:"name"`
	Nginx   Measure `json:"nginx"`
	Sidecar Measure `json:"sidecar"`
	// Ratio is the sidecar's median CPU per request over nginx's;
	// RoundRatio the median of the per-round ratios.
	Ratio      float64 `json:"ratio"`
	RoundRatio float64 `json:"roundRatio"`
	// Floors are the least a Go program spends on the same requests here
	// (see floor.go), measured in the same rounds.
	Floors []Floor `json:"floors,omitempty"`
}

// Floor is one floor program's median measurement.
type Floor struct {
	Name    string  `json:"name"`
	Measure Measure `json:"measure"`
}

// Measure is a service's median over the rounds.
type Measure struct {
	CPUMicros float64   `json:"cpuMicrosPerRequest"`
	Rate      float64   `json:"ratePerSec"`
	Rounds    []float64 `json:"roundsCpuMicros"`
	Errors    int64     `json:"errors"`
}

// RefLatency compares the latency nginx and the sidecar add over the
// direct path at one open-loop rate: medians over the rounds.
type RefLatency struct {
	Label string  `json:"label"`
	Rate  float64 `json:"rateOfferedPerSec"`
	// DirectP99 and the added p50/p99 are medians over the rounds of each
	// round's difference to the direct path.
	DirectP50        float64 `json:"directP50Usec"`
	DirectP99        float64 `json:"directP99Usec"`
	NginxAddedP50    float64 `json:"nginxAddedP50Usec"`
	NginxAddedP99    float64 `json:"nginxAddedP99Usec"`
	SidecarAddedP50  float64 `json:"sidecarAddedP50Usec"`
	SidecarAddedP99  float64 `json:"sidecarAddedP99Usec"`
	NginxCPUMicros   float64 `json:"nginxCpuMicrosPerRequest"`
	SidecarCPUMicros float64 `json:"sidecarCpuMicrosPerRequest"`
	// FloorAddedP99 and FloorCPUMicros are the Go floor's bare proxy's.
	FloorAddedP99  float64 `json:"floorAddedP99Usec"`
	FloorCPUMicros float64 `json:"floorCpuMicrosPerRequest"`
	Errors         int64   `json:"errors"`
}

// FindNginx returns the nginx binary to compare with: path when given,
// else nginx on $PATH or /usr/sbin/nginx; "" when there is none.
func FindNginx(path string) string {
	if path != "" {
		return path
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	return ""
}

// nginx is a running reference nginx.
type nginx struct {
	pid                 int
	proxy, limit, quiet string // base URLs
	version, dir        string
}

func (h *harness) startNginx(ctx context.Context) (*nginx, error) {
	n := &nginx{dir: filepath.Join(h.dir, "nginx")}
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return nil, err
	}
	ports := make([]string, 3)
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	conf := filepath.Join(n.dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, n.dir, h.backend, ports[0], ports[1], ports[2]), 0o600); err != nil {
		return nil, err
	}
	out, err := exec.Command(h.o.Nginx, "-v").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s -v: %w: %s", h.o.Nginx, err, out)
	}
	n.version = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "nginx version: "))
	if err := h.start(ctx, 0, nil, h.o.Nginx, "-p", n.dir, "-c", conf); err != nil {
		return nil, err
	}
	n.pid = h.procs[len(h.procs)-1].Process.Pid
	n.proxy, n.limit, n.quiet = "http://127.0.0.1:"+ports[0], "http://127.0.0.1:"+ports[1], "http://127.0.0.1:"+ports[2]
	if err := WaitHTTP(ctx, n.proxy+"/", 200); err != nil {
		b, _ := os.ReadFile(filepath.Join(n.dir, "error.log"))
		return nil, fmt.Errorf("nginx not serving: %w: %s", err, b)
	}
	return n, nil
}

// rounds is how many alternated rounds the reference phase runs.
const refRounds = 3

// reference runs the reference phase.
func (h *harness) reference(ctx context.Context, rep *Report) error {
	ng, err := h.startNginx(ctx)
	if err != nil {
		return err
	}
	scURLs, _, err := h.sidecars(ctx, storeMemory, 1, "--log-level", "info")
	if err != nil {
		return err
	}
	quietURLs, _, err := h.sidecars(ctx, storeMemory, 1, "--log-level", "warn")
	if err != nil {
		return err
	}
	scPIDs := []int{h.procs[len(h.procs)-2].Process.Pid, h.procs[len(h.procs)-1].Process.Pid}
	floors, err := h.startFloors(ctx)
	if err != nil {
		return err
	}
	ref := &Reference{Nginx: ng.version, Rounds: refRounds}
	type side struct {
		url string
		pid int
	}
	cases := []struct {
		name           string
		path           string
		header         func([]byte, int64) []byte
		nginx, sidecar side
		floors         []int // indexes into floors
	}{
		{"allowed (proxied), closed-loop max: nginx proxy_pass vs sidecar", "/lat", keyed("user-", 1000),
			side{ng.proxy, ng.pid}, side{scURLs[0], scPIDs[0]}, []int{2}},
		{"denied, default logging: nginx limit_req (access and error log) vs sidecar (--log-level info)", "/deny", keyed("abuser", 1),
			side{ng.limit, ng.pid}, side{scURLs[0], scPIDs[0]}, nil},
		{"denied, no logging: nginx limit_req (no logs) vs sidecar (--log-level warn)", "/deny", keyed("abuser", 1),
			side{ng.quiet, ng.pid}, side{quietURLs[0], scPIDs[1]}, []int{0, 1}},
	}
	type sample struct {
		cpu, rate float64
		errors    int64
	}
	res := make([][2][]sample, len(cases))
	floorRes := make([][][]sample, len(cases))
	c := NewClient()
	for round := range refRounds {
		for ci, tc := range cases {
			order := []int{0, 1}
			if round%2 == 1 {
				order = []int{1, 0}
			}
			for _, who := range order {
				s := tc.nginx
				name := "nginx"
				if who == 1 {
					s, name = tc.sidecar, "sidecar"
				}
				t := Target{URLs: []string{s.url + tc.path}, Header: tc.header}
				if _, err := ClosedLoop(ctx, c, t, time.Second, h.o.Conns); err != nil {
					return err
				}
				st, cpu, err := measureClosed(ctx, s.pid, c, t, h.o.Duration, h.o.Conns)
				if err != nil {
					return err
				}
				h.logf("[reference] round %d: %s: %s: %.0f req/s, %.1f µs CPU per request, %d errors", round+1, tc.name, name, st.Rate, cpu, st.Errors)
				res[ci][who] = append(res[ci][who], sample{cpu, st.Rate, st.Errors})
			}
			if floorRes[ci] == nil {
				floorRes[ci] = make([][]sample, len(tc.floors))
			}
			for k, fi := range tc.floors {
				f := floors[fi]
				t := Target{URLs: []string{f.url + tc.path}, Header: tc.header}
				if _, err := ClosedLoop(ctx, c, t, time.Second, h.o.Conns); err != nil {
					return err
				}
				st, cpu, err := measureClosed(ctx, f.pid, c, t, h.o.Duration, h.o.Conns)
				if err != nil {
					return err
				}
				h.logf("[reference] round %d: %s: %s: %.0f req/s, %.1f µs CPU per request, %d errors", round+1, tc.name, f.name, st.Rate, cpu, st.Errors)
				floorRes[ci][k] = append(floorRes[ci][k], sample{cpu, st.Rate, st.Errors})
			}
		}
	}
	for ci, tc := range cases {
		var m [2]Measure
		for who := range 2 {
			var cpu, rate []float64
			for _, s := range res[ci][who] {
				cpu, rate = append(cpu, s.cpu), append(rate, s.rate)
				m[who].Errors += s.errors
			}
			m[who].CPUMicros, m[who].Rate, m[who].Rounds = Median(cpu), Median(rate), cpu
		}
		rc := RefCase{Name: tc.name, Nginx: m[0], Sidecar: m[1], RoundRatio: RoundRatio(m[1].Rounds, m[0].Rounds)}
		if m[0].CPUMicros > 0 {
			rc.Ratio = m[1].CPUMicros / m[0].CPUMicros
		}
		for k, fi := range tc.floors {
			var fm Measure
			var cpu, rate []float64
			for _, s := range floorRes[ci][k] {
				cpu, rate = append(cpu, s.cpu), append(rate, s.rate)
				fm.Errors += s.errors
			}
			fm.CPUMicros, fm.Rate, fm.Rounds = Median(cpu), Median(rate), cpu
			rc.Floors = append(rc.Floors, Floor{Name: floors[fi].name, Measure: fm})
		}
		ref.Cases = append(ref.Cases, rc)
	}

	// Latency, open loop: a fixed 2000/s and shares of the sidecar's
	// maximum, each rate in rounds of alternating 1s slices over the
	// direct path, nginx and the sidecar.
	maxRate := ref.Cases[0].Sidecar.Rate
	direct := Path{Client: NewClient(), Target: Target{URLs: []string{"http://" + h.backend + "/lat"}, Header: keyed("user-", 1000)}}
	viaNginx := Path{Client: NewClient(), Target: Target{URLs: []string{ng.proxy + "/lat"}, Header: keyed("user-", 1000)}, PID: ng.pid}
	viaSidecar := Path{Client: NewClient(), Target: Target{URLs: []string{scURLs[0] + "/lat"}, Header: keyed("user-", 1000)}, PID: scPIDs[0]}
	viaFloor := Path{Client: NewClient(), Target: Target{URLs: []string{floors[2].url + "/lat"}, Header: keyed("user-", 1000)}, PID: floors[2].pid}
	loads := []struct {
		label string
		rate  float64
	}{{"2000/s", 2000}}
	for _, l := range latencyLoads {
		loads = append(loads, struct {
			label string
			rate  float64
		}{fmt.Sprintf("%.0f%% of the sidecar's max", 100*l), l * maxRate})
	}
	for _, l := range loads {
		h.logf("[reference] latency at %s (%.0f/s): direct, nginx, sidecar and the Go floor proxy in alternating 1s slices, %d rounds", l.label, l.rate, refRounds)
		paths := []Path{direct, viaNginx, viaSidecar, viaFloor}
		if _, err := InterleavedN(ctx, paths, l.rate, time.Second, time.Second, h.o.Workers); err != nil {
			return err
		}
		var dp50, dp99, na50, na99, sa50, sa99, ncpu, scpu, fa99, fcpu []float64
		var errs int64
		for range refRounds {
			st, err := InterleavedN(ctx, paths, l.rate, time.Second, h.o.Duration, h.o.Workers)
			if err != nil {
				return err
			}
			dp50, dp99 = append(dp50, st[0].P50), append(dp99, st[0].P99)
			na50, na99 = append(na50, st[1].P50-st[0].P50), append(na99, st[1].P99-st[0].P99)
			sa50, sa99 = append(sa50, st[2].P50-st[0].P50), append(sa99, st[2].P99-st[0].P99)
			ncpu, scpu = append(ncpu, st[1].CPUMicros), append(scpu, st[2].CPUMicros)
			fa99, fcpu = append(fa99, st[3].P99-st[0].P99), append(fcpu, st[3].CPUMicros)
			errs += st[0].Errors + st[1].Errors + st[2].Errors + st[3].Errors
		}
		ref.Latency = append(ref.Latency, RefLatency{Label: l.label, Rate: l.rate, DirectP50: Median(dp50), DirectP99: Median(dp99),
			NginxAddedP50: Median(na50), NginxAddedP99: Median(na99), SidecarAddedP50: Median(sa50), SidecarAddedP99: Median(sa99),
			NginxCPUMicros: Median(ncpu), SidecarCPUMicros: Median(scpu), FloorAddedP99: Median(fa99), FloorCPUMicros: Median(fcpu), Errors: errs})
	}
	rep.Reference = ref
	return nil
}

// floorProc is a running floor program.
type floorProc struct {
	name, url string
	pid       int
}

// startFloors starts the floor programs (re-execs of this binary) on CPU
// 0: the goroutine answer, the epoll answer and the goroutine proxy.
func (h *harness) startFloors(ctx context.Context) ([]floorProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	specs := []struct {
		name string
		args []string
	}{
		{"Go floor: fixed 429, goroutine per connection", []string{"floor-answer"}},
		{"Go floor: fixed 429, one raw epoll loop", []string{"floor-answer", "-epoll"}},
		{"Go floor: bare proxy, goroutine per connection", []string{"floor-proxy", "-upstream", h.backend}},
	}
	var out []floorProc
	for _, sp := range specs {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		args := append(sp.args, "-listen", "127.0.0.1:"+port)
		if err := h.start(ctx, 0, []string{"GOMAXPROCS=1"}, exe, args...); err != nil {
			return nil, err
		}
		f := floorProc{name: sp.name, url: "http://127.0.0.1:" + port, pid: h.procs[len(h.procs)-1].Process.Pid}
		if err := WaitHTTP(ctx, f.url+"/lat", 0); err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// measureClosed runs a closed loop and returns its stats and the CPU time
// process pid spent per completed request over it, in microseconds.
func measureClosed(ctx context.Context, pid int, c *Client, t Target, d time.Duration, conns int) (Stats, float64, error) {
	cpu0, err := ProcCPU(pid)
	if err != nil {
		return Stats{}, 0, err
	}
	st, err := ClosedLoop(ctx, c, t, d, conns)
	if err != nil {
		return Stats{}, 0, err
	}
	cpu1, err := ProcCPU(pid)
	if err != nil {
		return Stats{}, 0, err
	}
	var us float64
	if n := st.OK + st.Limited; n > 0 {
		us = float64((cpu1 - cpu0).Microseconds()) / float64(n)
	}
	return st, us, nil
}

// acceptReference adds the reference phase's criteria.
func (h *harness) acceptReference(rep *Report) {
	ref := rep.Reference
	if ref == nil {
		return
	}
	for i, c := range ref.Cases {
		bar := 1.0
		name := "CPU per denied request <= nginx limit_req's"
		if i == 0 {
			bar, name = 1.2, "CPU per allowed request at the closed-loop max <= 1.2 x nginx proxy_pass"
		}
		if i == 1 {
			name += " (both with their default logging)"
		}
		if i == 2 {
			name += " (both without logging)"
		}
		rep.Acceptance = append(rep.Acceptance, Requirement{Name: name,
			Measured: fmt.Sprintf("%.1f µs vs %.1f µs: %.2fx (median of per-round ratios %.2fx)", c.Sidecar.CPUMicros, c.Nginx.CPUMicros, c.Ratio, c.RoundRatio),
			Pass:     c.Ratio <= bar && c.Sidecar.Errors == 0})
	}
	for _, l := range ref.Latency {
		if l.Rate != 2000 {
			continue
		}
		rep.Acceptance = append(rep.Acceptance, Requirement{Name: "added p99 at 2000/s <= nginx proxy_pass's added p99",
			Measured: fmt.Sprintf("sidecar +%.0f µs, nginx +%.0f µs (direct p99 %.0f µs)", l.SidecarAddedP99, l.NginxAddedP99, l.DirectP99),
			Pass:     l.SidecarAddedP99 <= l.NginxAddedP99 && l.Errors == 0})
	}
}

// tableReference prints the reference phase.
func (h *harness) tableReference(rep *Report) {
	ref := rep.Reference
	if ref == nil {
		return
	}
	printf := func(format string, args ...any) { _, _ = fmt.Fprintf(h.o.Log, format, args...) }
	printf("\nBeside nginx %s (same run, same layout; medians of %d alternated rounds; CPU of the service process per request)\n", ref.Nginx, ref.Rounds)
	printf("  %-92s %9s %9s %9s %9s %7s %7s\n", "case", "nginx/s", "µs", "sidecar/s", "µs", "ratio", "rounds")
	for _, c := range ref.Cases {
		printf("  %-92s %9.0f %9.1f %9.0f %9.1f %6.2fx %6.2fx\n", c.Name, c.Nginx.Rate, c.Nginx.CPUMicros, c.Sidecar.Rate, c.Sidecar.CPUMicros, c.Ratio, c.RoundRatio)
		for _, f := range c.Floors {
			printf("      %-60s %9.0f/s %7.1f µs; nginx / floor %.2fx, sidecar / floor %.2fx\n", f.Name, f.Measure.Rate, f.Measure.CPUMicros,
				c.Nginx.CPUMicros/f.Measure.CPUMicros, c.Sidecar.CPUMicros/f.Measure.CPUMicros)
		}
	}
	printf("  open loop, added over the direct path (µs) and CPU per request (µs)\n")
	printf("  %-36s %9s %9s | %10s %10s %8s | %10s %10s %8s | %7s | %10s %8s\n", "rate", "dir p50", "dir p99", "nginx +p50", "nginx +p99", "cpu", "sc +p50", "sc +p99", "cpu", "p99 x", "floor +p99", "cpu")
	for _, l := range ref.Latency {
		ratio := 0.0
		if l.NginxAddedP99 > 0 {
			ratio = l.SidecarAddedP99 / l.NginxAddedP99
		}
		printf("  %-36s %9.0f %9.0f | %10.0f %10.0f %8.1f | %10.0f %10.0f %8.1f | %6.2fx | %10.0f %8.1f\n", fmt.Sprintf("%s (%.0f/s)", l.Label, l.Rate),
			l.DirectP50, l.DirectP99, l.NginxAddedP50, l.NginxAddedP99, l.NginxCPUMicros, l.SidecarAddedP50, l.SidecarAddedP99, l.SidecarCPUMicros, ratio,
			l.FloorAddedP99, l.FloorCPUMicros)
	}
}

// ProcCPU returns a process's user plus system CPU time.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time of %d: %w", pid, err)
	}
	return ParseStatCPU(string(b))
}

// ClockTicks is USER_HZ, the unit of /proc/<pid>/stat's times; 100 on
// Linux on every architecture Go supports.
const ClockTicks = 100

// ParseStatCPU reads utime and stime (fields 14 and 15) from a
// /proc/<pid>/stat line. The command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func ParseStatCPU(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command field")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after the command", len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("proc stat: %w", err)
	}
	return time.Duration(ut+st) * time.Second / ClockTicks, nil
}

// Median returns the median of xs (0 for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// RoundRatio returns the median over rounds of xs[i] / base[i], skipping
// rounds without a base.
func RoundRatio(xs, base []float64) float64 {
	var rs []float64
	for i := range min(len(xs), len(base)) {
		if base[i] > 0 {
			rs = append(rs, xs[i]/base[i])
		}
	}
	return Median(rs)
}
