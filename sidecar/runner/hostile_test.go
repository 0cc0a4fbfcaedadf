package runner

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// injectedMemoryLimit is the memory limit the injector gives the sidecar
// container (controllers/injection/options.go).
const injectedMemoryLimit = 256 << 20

// TestHostileConnectionsRSS runs the floodgate-sidecar binary, with its
// default budgets, as the injector runs it (its Go memory limit at
// DefaultMemoryLimitRatio of the container's 256Mi, its binary not in the
// page cache), on each front, and holds against it: 10,000 connections
// with partial heads that fit in each connection's 4 KiB; then 10,000
// with partial heads of 60 KB, which the head budget refuses once spent;
// then 1,000 connections trickling request bodies to the application;
// then, through the lean core's handoff, 5,000 idle h2c connections,
// which count as 10,000 (proxy.H2ConnWeight). With each held, it reads
// the process's resident memory from /proc and sends a request from
// another client, which must be answered 200 within 5 seconds.
//
// The limit must hold what the process needs resident: its anonymous
// memory at its peak (sampled every 20ms), the binary's pages it touched
// to start, and the kernel's memory for its sockets. Where the test may
// make a memory cgroup (as root), the process runs in one limited to the
// container's 256Mi, which is charged what the container's is (anonymous
// memory, page cache, the kernel's sockets) and kills past it: the
// kernel must kill nothing, and its kernel-memory figure is counted.
// Elsewhere the kernel's part is not known and counts 0.
func TestHostileConnectionsRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 10,000 connections to a sidecar process")
	}
	// Not parallel: 10,000 connections are a load of their own.
	bin := filepath.Join(t.TempDir(), "floodgate-sidecar")
	build := exec.Command("go", "build", "-o", bin, "./cmd/floodgate-sidecar")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, front := range fronts {
		t.Run(front.name, func(t *testing.T) {
			// Where it can, the test holds the process to the limit
			// as its container is held, by a memory cgroup: the
			// kernel then counts everything the limit counts, and
			// kills the process if it goes past.
			cg, err := newMemoryCgroup(t, injectedMemoryLimit)
			if err != nil {
				t.Logf("no memory cgroup (%v): the limit is checked against the anonymous memory only", err)
			}
			h := startHostile(t, bin, cg, front.args...)

			h.partialHeads(t, 10000, 4000)
			h.report(t, "10,000 partial heads of 4,000 bytes")
			h.closeAll(t)

			h.partialHeads(t, 10000, 60000)
			t.Logf("  head budget: %.0f bytes held", h.metric(t, "floodgate_sidecar_pending_head_bytes"))
			h.report(t, "10,000 partial heads of 60,000 bytes")
			h.closeAll(t)

			h.slowBodies(t, 1000)
			h.report(t, "1,000 bodies trickling")
			h.closeAll(t)

			if front.args == nil {
				h.idleH2C(t, 5000)
				h.report(t, "5,000 idle h2c connections")
				h.closeAll(t)
			}

			t.Logf("  peak: anonymous %.1f MiB, all resident %.1f MiB", mib(h.anonPeak.Load()), mib(h.memory(t).hwm))
			if peak := h.anonPeak.Load(); peak >= injectedMemoryLimit {
				t.Errorf("peak anonymous resident memory %.1f MiB, past the container's limit of %d MiB", mib(peak), injectedMemoryLimit>>20)
			}
			// What the process needs resident: its anonymous memory
			// at its peak, the binary's pages it had touched once
			// started, and the kernel's memory for its sockets
			// (measured by the cgroup, where there is one). The
			// limit must hold all of it, so that the kernel never
			// takes the sidecar's own code from under it to make room.
			need, kernel := h.anonPeak.Load()+h.startFile, int64(0)
			if cg != nil {
				kills, reached := cg.ooms()
				kernel = max(cg.kernelPeak(), 0)
				need += kernel
				t.Logf("  memory cgroup of %d MiB: peak charge %.1f MiB (page cache included; kernel memory %.1f MiB), limit reached %d times, out-of-memory kills %d",
					injectedMemoryLimit>>20, mib(cg.peak()), mib(kernel), reached, kills)
				if kills != 0 {
					t.Errorf("the out-of-memory killer killed %d processes in the sidecar's cgroup of %d MiB", kills, injectedMemoryLimit>>20)
				}
			}
			t.Logf("  needed resident: %.1f MiB (anonymous peak %.1f, the binary's pages at start %.1f, kernel %.1f)",
				mib(need), mib(h.anonPeak.Load()), mib(h.startFile), mib(kernel))
			if need >= injectedMemoryLimit {
				t.Errorf("the sidecar needs %.1f MiB resident (anonymous peak %.1f, binary %.1f, kernel %.1f), past the container's limit of %d MiB",
					mib(need), mib(h.anonPeak.Load()), mib(h.startFile), mib(kernel), injectedMemoryLimit>>20)
			}
		})
	}
}

// hostile is a sidecar process under attack, and its application.
type hostile struct {
	cmd    *exec.Cmd
	proxy  string
	admin  string
	bodies atomic.Int64 // request bodies the application is reading
	stderr *syncBuffer

	// the attack under way: its connections, how many of them the
	// sidecar holds, and what stops their writes
	conns   []net.Conn
	held    int
	refused float64 // refusals (of both reasons) before the attack
	stop    func()

	anonPeak  atomic.Int64 // the most anonymous resident memory sampled
	startFile int64        // the binary's resident pages once started

	cg *memoryCgroup // the process's memory cgroup, or nil
}

// startHostile starts the sidecar; inside cg unless it is nil.
func startHostile(t *testing.T, bin string, cg *memoryCgroup, args ...string) *hostile {
	t.Helper()
	h := &hostile{stderr: &syncBuffer{}, cg: cg}
	be := newBackend(t, func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			h.bodies.Add(1)
			defer h.bodies.Add(-1)
			_, _ = io.Copy(io.Discard, r.Body)
		}
		_, _ = io.WriteString(w, "ok")
	})
	pf := filepath.Join(t.TempDir(), "policy.yaml")
	writeAtomic(t, pf, policyDoc("r1", `limit: {requests: 1000000, per: 1s}`))
	// --admin-pprof only serves the profiles, which report reads the
	// live heap through.
	// The head and body timeouts are long: an attack holds its
	// connections only as long as the timeouts let it (it opens new
	// ones as they are cut), and here every connection stays held until
	// the test has measured, however slowly a busy machine opens them.
	h.cmd = exec.Command(bin, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--upstream", be.URL, "--policy-file", pf, "--admin-pprof",
		"--read-header-timeout", "10m", "--body-timeout", "10m"}, args...)...)
	// What the sidecar sets from the container's limit with its
	// default --memory-limit-ratio; this process's cgroup gives it none.
	// (A variable: a ratio whose product is not a whole number of bytes
	// would not convert as a constant.)
	ratio := DefaultMemoryLimitRatio
	h.cmd.Env = append(os.Environ(), "GOMEMLIMIT="+strconv.FormatInt(int64(injectedMemoryLimit*ratio), 10))
	// A container's image is not in the page cache before it starts:
	// the binary's pages that the process touches are faulted in (and,
	// in a cgroup, charged to it).
	if err := dropFromPageCache(bin); err != nil {
		t.Fatalf("drop %s from the page cache: %v", bin, err)
	}
	if cg != nil {
		h.cmd = cg.command(h.cmd)
	}
	pr, pw := io.Pipe()
	h.cmd.Stderr = pw
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = h.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = h.cmd.Process.Kill()
			<-done
		}
		_ = pw.Close()
		if t.Failed() {
			t.Logf("sidecar logs:\n%s", h.stderr.String())
		}
	})
	// The sidecar says where it listens.
	serving := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			_, _ = h.stderr.Write(append(sc.Bytes(), '\n'))
			var line struct{ Msg, Listen, Admin string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
				serving <- [2]string{line.Listen, line.Admin}
			}
		}
	}()
	select {
	case a := <-serving:
		h.proxy, h.admin = a[0], "http://"+a[1]
	case <-time.After(30 * time.Second):
		t.Fatalf("the sidecar did not start; logs:\n%s", h.stderr.String())
	}
	waitFor(t, 30*time.Second, "the sidecar to be ready", func() bool {
		res, err := http.Get(h.admin + "/readyz")
		if err != nil {
			return false
		}
		_ = res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	m := h.memory(t)
	h.startFile = m.file
	t.Logf("%s: resident memory at start %.1f MiB (%.1f MiB anonymous, %.1f MiB file)%s", strings.Join(args, " "), mib(m.rss), mib(m.anon), mib(m.file), h.charged())
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if m, err := readProcMemory(h.cmd.Process.Pid); err == nil && m.anon > h.anonPeak.Load() {
					h.anonPeak.Store(m.anon)
				}
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-sampled })
	return h
}

// dial opens a connection and sends raw; nil when the sidecar refused it
// meanwhile. A write that cannot go on within a second is left as it is.
func (h *hostile) dial(t *testing.T, raw string) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", h.proxy, 10*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(nc, raw)
	return nc
}

// partialHeads opens n connections that each send a partial head of
// size bytes, and waits until the sidecar has taken them all in (held or
// refused).
func (h *hostile) partialHeads(t *testing.T, n, size int) {
	t.Helper()
	head := "GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", size-34)
	h.refused = h.refusals(t)
	for range n {
		h.conns = append(h.conns, h.dial(t, head))
	}
	waitFor(t, 60*time.Second, "the sidecar to take the connections in", func() bool {
		return h.metric(t, "floodgate_sidecar_connections_open")+h.refusals(t)-h.refused >= float64(n)
	})
	h.held = int(h.metric(t, "floodgate_sidecar_connections_open"))
}

// slowBodies opens n connections that each send a request with a body of
// 1 GB, 1 KiB of it at once, and then one byte per connection every 100
// milliseconds, spread over the connections, until closed; it waits
// until the application reads all n bodies.
func (h *hostile) slowBodies(t *testing.T, n int) {
	t.Helper()
	h.refused = h.refusals(t)
	for range n {
		h.conns = append(h.conns, h.dial(t, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"+strings.Repeat("b", 1024)))
	}
	conns := h.conns
	waitFor(t, 60*time.Second, fmt.Sprintf("the application to read %d bodies", n), func() bool { return h.bodies.Load() >= int64(n) })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond / time.Duration(n))
		defer tick.Stop()
		for i := 0; ; i = (i + 1) % n {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = conns[i].SetWriteDeadline(time.Now().Add(time.Second))
				_, _ = conns[i].Write([]byte{'b'})
			}
		}
	}()
	h.stop = func() { close(stop); wg.Wait() }
	h.held = int(h.metric(t, "floodgate_sidecar_connections_open"))
}

// idleH2C opens n connections that each send the h2c preface and an
// empty SETTINGS frame and wait, and waits until the sidecar has taken
// them all in (held or refused).
func (h *hostile) idleH2C(t *testing.T, n int) {
	t.Helper()
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"
	h.refused = h.refusals(t)
	for range n {
		h.conns = append(h.conns, h.dial(t, preface))
	}
	waitFor(t, 60*time.Second, "the sidecar to take the connections in", func() bool {
		return h.metric(t, "floodgate_sidecar_connections_open")/2+h.refusals(t)-h.refused >= float64(n)
	})
	h.held = int(h.metric(t, "floodgate_sidecar_connections_open")) / 2
}

// closeAll ends the attack and waits until the sidecar has closed its
// ends of the connections.
func (h *hostile) closeAll(t *testing.T) {
	t.Helper()
	if h.stop != nil {
		h.stop()
		h.stop = nil
	}
	for _, c := range h.conns {
		_ = c.Close()
	}
	h.conns = nil
	waitFor(t, 60*time.Second, "the sidecar to close the connections", func() bool {
		return h.metric(t, "floodgate_sidecar_connections_open") == 0 && h.bodies.Load() == 0
	})
}

// report logs the sidecar's memory with the connections held, and
// checks that another client is served meanwhile.
func (h *hostile) report(t *testing.T, what string) {
	t.Helper()
	m := h.memory(t)
	start := time.Now()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := client.Get("http://" + h.proxy + "/normal")
	took := time.Since(start)
	status := "error"
	if err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		status = res.Status
	}
	// A heap profile with gc=1 collects first: what the heap holds
	// then is live.
	if res, err := http.Get(h.admin + "/debug/pprof/heap?gc=1"); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
	}
	t.Logf("  %s: %d of %d connections held, %.0f refused; resident %.1f MiB (%.1f anonymous, peak %.1f)%s, live heap %.1f MiB, stacks %.1f MiB; another client: %s in %v",
		what, h.held, len(h.conns), h.refusals(t)-h.refused, mib(m.rss), mib(m.anon), mib(m.hwm), h.charged(), h.metric(t, "go_memstats_heap_alloc_bytes")/(1<<20),
		h.metric(t, "go_memstats_stack_inuse_bytes")/(1<<20), status, took.Round(time.Millisecond))
	if err != nil || res.StatusCode != http.StatusOK {
		t.Errorf("%s: another client got %s %v, want 200 within 5s", what, status, err)
	}
	if m.anon >= injectedMemoryLimit {
		t.Errorf("%s: anonymous resident memory %.1f MiB, past the container's limit of %d MiB", what, mib(m.anon), injectedMemoryLimit>>20)
	}
}

// charged says what the memory cgroup is charged, if there is one.
func (h *hostile) charged() string {
	if h.cg == nil {
		return ""
	}
	all, cache := h.cg.charged()
	return fmt.Sprintf("; cgroup charged %.1f MiB (%.1f page cache)", mib(all), mib(cache))
}

// procMemory is a process's resident memory: all of it now, and its
// anonymous and file-backed parts, and all of it at its peak.
type procMemory struct{ rss, anon, file, hwm int64 }

func (h *hostile) memory(t *testing.T) procMemory {
	t.Helper()
	m, err := readProcMemory(h.cmd.Process.Pid)
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	return m
}

func readProcMemory(pid int) (procMemory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMemory{}, err
	}
	var m procMemory
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			m.rss = kb << 10
		case "VmHWM:":
			m.hwm = kb << 10
		case "RssAnon:":
			m.anon = kb << 10
		case "RssFile:":
			m.file = kb << 10
		}
	}
	return m, nil
}

// refusals returns the connections refused so far, for either reason.
func (h *hostile) refusals(t *testing.T) float64 {
	t.Helper()
	return h.metric(t, `floodgate_sidecar_connections_refused_total{reason="head_budget"}`) +
		h.metric(t, `floodgate_sidecar_connections_refused_total{reason="max_connections"}`)
}

func (h *hostile) metric(t *testing.T, sample string) float64 {
	t.Helper()
	return metricOf(t, h.admin, sample)
}

// metricOf returns the value of one sample of the /metrics at admin.
func metricOf(t *testing.T, admin, sample string) float64 {
	t.Helper()
	for _, line := range strings.Split(metricsText(t, admin), "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("parse %q: %v", line, err)
			}
			return v
		}
	}
	return 0
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
