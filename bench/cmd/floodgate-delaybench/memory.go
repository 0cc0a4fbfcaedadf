package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/floodgate-dev/floodgate/bench/harness"
)

// memoryPhase leaves o.memWaiting requests waiting in one sidecar, and then
// in one nginx with the same queue, and measures each one's RSS.
//
// Each waiting request has a key of its own, limited to 1 a minute with
// delayAfter 1 and maxDelay 60s: a primer per key passes at once, and the
// key's next request then waits for the rest of the minute. So none is
// released while the phase runs (it ends well within the minute), and the
// requests waiting are exactly the requests sent. (At 1/s on fewer keys,
// as at first, at most 59 wait per key and the keys release requests
// throughout, which the RSS would mix in.)
func (b *bench) memoryPhase(ctx context.Context, rep *Report) error {
	n := b.o.memWaiting
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(n+1000) {
		return fmt.Errorf("the file-descriptor limit is %d: %d connections need %d (ulimit -n)", lim.Cur, n, n+1000)
	}
	if float64(2*n)/b.o.memRate > 40 {
		return fmt.Errorf("-mem-rate %.0f: %d primers and %d waiting requests take more than 40s, and the first waiting ones would be released within the phase", b.o.memRate, n, n)
	}
	if b.o.phases["memory"] {
		app, err := b.startApp(ctx)
		if err != nil {
			return err
		}
		limit := b.ruleLimit(1, "1m", time.Minute, 1)
		pf, pods, err := b.policy("mem", 1, "/mem", limit)
		if err != nil {
			return err
		}
		// The sidecar's bound on the requests waiting per rule
		// (--max-delayed, 10,000 by default) is raised above the target,
		// where the sidecar has it.
		var extra []string
		if help, _ := exec.CommandContext(ctx, b.bin, "--help").CombinedOutput(); strings.Contains(string(help), "-max-delayed") {
			extra = []string{"--max-delayed", strconv.Itoa(2 * n)}
		}
		pid, base, admin, err := b.sidecar(ctx, pf, pods[0], app, extra...)
		if err != nil {
			return err
		}
		b.logf("[memory] one sidecar %s, rule %s per key", strings.Join(extra, " "), limit)
		m, err := b.waiting(ctx, pid, base, admin)
		b.stop(pid)
		if err != nil {
			return err
		}
		m.Limiter = "floodgate-sidecar (Redis store) " + strings.Join(extra, " ") + ", rule " + limit + " on X-Key"
		rep.Memory = m
	}
	if ng := harness.FindNginx(b.o.nginx); b.o.phases["nginx-memory"] && b.o.nginx != "off" && ng != "" {
		app, err := b.startApp(ctx)
		if err != nil {
			return err
		}
		pid, base, err := b.startNginx(ctx, ng, "mem", app, "limit_req_zone $http_x_key zone=mem:10m rate=1r/m;", "limit_req zone=mem burst=1;")
		if err != nil {
			return err
		}
		b.logf("[memory] nginx, limit_req rate=1r/m burst=1 per key")
		m, err := b.waiting(ctx, pid, base, "")
		b.stop(pid)
		if err != nil {
			return err
		}
		m.Limiter = "nginx limit_req rate=1r/m burst=1 (no nodelay) on X-Key"
		rep.NginxMemory = m
	}
	return nil
}

// waiting primes o.memWaiting keys through base (one request each, passed
// at once), then sends one request on each key over a connection of its
// own, paced at o.memRate, and samples the RSS of pid until they are all
// sent and a second more.
func (b *bench) waiting(ctx context.Context, pid int, base, admin string) (*Memory, error) {
	n := b.o.memWaiting
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	addr := u.Host
	m := &Memory{Keys: n, Target: n}
	run := time.Now().UnixNano()
	key := func(dst []byte, i int64) []byte { return fmt.Appendf(dst, "X-Key: m%d-%d\r\n", run, i) }
	c := harness.NewClient()
	st, err := harness.OpenLoop(ctx, c, harness.Target{URLs: []string{base + "/mem"}, Header: key}, b.o.memRate, time.Duration(float64(n)/b.o.memRate*float64(time.Second)), 256)
	if err != nil {
		return nil, err
	}
	c.CloseIdle()
	m.Primed = int(st.OK)
	if st.OK != int64(n) {
		return nil, fmt.Errorf("primers: %d of %d passed (%d refused, %d errors)", st.OK, n, st.Limited, st.Errors)
	}
	time.Sleep(time.Second)
	if m.RSSBefore, err = rss(pid); err != nil {
		return nil, err
	}
	b.logf("[memory] RSS %.1f MiB after %d primers; %d connections at %.0f/s, one request each", mib(m.RSSBefore), n, n, b.o.memRate)
	var written, answered, refused, failed atomic.Int64
	var conns sync.WaitGroup
	release := make(chan struct{})
	conn := func(i int) {
		nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			failed.Add(1)
			return
		}
		defer func() { _ = nc.Close() }()
		req := append(fmt.Appendf(nil, "GET /mem HTTP/1.1\r\nHost: %s\r\n", addr), key(nil, int64(i))...)
		if _, err := nc.Write(append(req, "\r\n"...)); err != nil {
			failed.Add(1)
			return
		}
		written.Add(1)
		read := make(chan string, 1)
		go func() {
			line, _ := bufio.NewReaderSize(nc, 256).ReadString('\n')
			read <- line
		}()
		select {
		case line := <-read:
			// Answered while the others wait: the connection closes.
			answered.Add(1)
			switch {
			case strings.HasPrefix(line, "HTTP/1.1 429"):
				refused.Add(1)
			case !strings.HasPrefix(line, "HTTP/1.1 2"):
				failed.Add(1)
			}
		case <-release:
		}
	}
	spawned := make(chan struct{})
	go func() {
		defer close(spawned)
		start := time.Now()
		for i := range n {
			if ctx.Err() != nil {
				return
			}
			if d := time.Until(start.Add(time.Duration(float64(i) * float64(time.Second) / b.o.memRate))); d > 0 {
				time.Sleep(d)
			}
			conns.Go(func() { conn(i) })
		}
	}()
	// Sample the requests waiting and the RSS, keeping the sample of the
	// most waiting.
	var allSent time.Time
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		r, err := rss(pid)
		if err != nil {
			break
		}
		m.RSSMax = max(m.RSSMax, r)
		w := int(written.Load() - answered.Load())
		if w >= m.Waiting {
			m.Waiting, m.RSSAt = w, r
			m.Answered = int(answered.Load())
		}
		if allSent.IsZero() {
			select {
			case <-spawned:
				allSent = time.Now()
			default:
			}
		}
		if !allSent.IsZero() && time.Since(allSent) > time.Second {
			break
		}
	}
	if admin != "" {
		if mt, err := scrapeDelay([]string{admin}); err == nil {
			m.Metrics = mt
		}
	}
	m.Sent = int(written.Load())
	m.Refused, m.Errors = int(refused.Load()), int(failed.Load())
	// The clients go away (their slots go back), then the limiter stops.
	close(release)
	conns.Wait()
	if m.Waiting > 0 {
		m.BytesPerWaiting = float64(m.RSSAt-m.RSSBefore) / float64(m.Waiting)
	}
	m.Note = "the RSS delta over the requests waiting at the sample with the most: each one's whole cost (its connection's socket and buffers, goroutine or event, parsed request, timer)"
	b.logf("[memory] %d waiting: RSS %.1f -> %.1f MiB, %.0f bytes per waiting request; %d answered before the sample (%d refused), %d errors", m.Waiting,
		mib(m.RSSBefore), mib(m.RSSAt), m.BytesPerWaiting, m.Answered, m.Refused, m.Errors)
	return m, nil
}

// rss returns a process's resident set size (VmRSS) in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseVmRSS(string(b))
}

// parseVmRSS reads VmRSS from /proc/<pid>/status text, in bytes.
func parseVmRSS(s string) (int64, error) {
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS")
}
