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
// in one nginx with the same per-key queue, and measures each one's RSS.
func (b *bench) memoryPhase(ctx context.Context, rep *Report) error {
	n := b.o.memWaiting
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(n+1000) {
		return fmt.Errorf("the file-descriptor limit is %d: %d connections need %d (ulimit -n)", lim.Cur, n, n+1000)
	}
	if b.o.phases["memory"] {
		app, err := b.startApp(ctx)
		if err != nil {
			return err
		}
		limit := b.ruleLimit(1, "1s", time.Minute, 1)
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
		pid, base, err := b.startNginx(ctx, ng, "mem", app, "limit_req_zone $http_x_key zone=mem:10m rate=1r/s;", "limit_req zone=mem burst=59;")
		if err != nil {
			return err
		}
		b.logf("[memory] nginx, limit_req rate=1r/s burst=59 per key")
		m, err := b.waiting(ctx, pid, base, "")
		b.stop(pid)
		if err != nil {
			return err
		}
		m.Limiter = "nginx limit_req rate=1r/s burst=59 (no nodelay) on X-Key"
		rep.NginxMemory = m
	}
	return nil
}

// waiting primes every key of the memory phase through base (one request
// each, passed at once), then leaves o.memWaiting requests waiting on
// o.memKeys keys, and samples the RSS of pid.
func (b *bench) waiting(ctx context.Context, pid int, base, admin string) (*Memory, error) {
	n, keys := b.o.memWaiting, b.o.memKeys
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	addr := u.Host
	m := &Memory{Keys: keys, Target: n}
	// The primers take each key's delayAfter allowance, so that every
	// request after them waits.
	c := harness.NewClient()
	st, err := harness.OpenLoop(ctx, c, harness.Target{URLs: []string{base + "/mem"}, Header: func(dst []byte, i int64) []byte {
		return fmt.Appendf(dst, "X-Key: k%d\r\n", i)
	}}, float64(4*keys), 250*time.Millisecond, 64)
	if err != nil {
		return nil, err
	}
	c.CloseIdle()
	m.Primed = int(st.OK)
	if st.OK != int64(keys) {
		return nil, fmt.Errorf("primers: %d of %d passed (%d refused, %d errors)", st.OK, keys, st.Limited, st.Errors)
	}
	time.Sleep(time.Second)
	if m.RSSBefore, err = rss(pid); err != nil {
		return nil, err
	}
	b.logf("[memory] RSS %.1f MiB; %d connections, one request each, on %d keys", float64(m.RSSBefore)/(1<<20), n, keys)
	var written, answered, refused, failed atomic.Int64
	var conns sync.WaitGroup
	release := make(chan struct{})
	dials := make(chan struct{}, 256)
	conn := func(i int) {
		nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			<-dials
			failed.Add(1)
			return
		}
		defer func() { _ = nc.Close() }()
		_, err = fmt.Fprintf(nc, "GET /mem HTTP/1.1\r\nHost: %s\r\nX-Key: k%d\r\n\r\n", addr, i%keys)
		<-dials
		if err != nil {
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
			answered.Add(1)
			switch {
			case strings.HasPrefix(line, "HTTP/1.1 429"):
				refused.Add(1)
			case !strings.HasPrefix(line, "HTTP/1.1 2"):
				failed.Add(1)
			}
			<-release
		case <-release:
		}
	}
	// Connections are opened until n requests wait at once: the keys
	// release keys requests a second meanwhile, so more than n are sent,
	// up to 59 a key (each within maxDelay).
	var sent atomic.Int64
	spawned := make(chan struct{})
	go func() {
		defer close(spawned)
		for i := range 59 * keys {
			if written.Load()-answered.Load() >= int64(n) || ctx.Err() != nil {
				return
			}
			dials <- struct{}{}
			sent.Add(1)
			conns.Go(func() { conn(i) })
		}
	}()
	// Sample the waiting requests and the RSS until every request has been
	// written and a second has passed, keeping the sample of the most
	// waiting.
	var allWritten time.Time
	deadline := time.Now().Add(60 * time.Second)
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
			m.Answered = int(answered.Load() - refused.Load())
		}
		if allWritten.IsZero() {
			select {
			case <-spawned:
				allWritten = time.Now()
			default:
			}
		}
		if !allWritten.IsZero() && time.Since(allWritten) > time.Second {
			break
		}
	}
	if admin != "" {
		if mt, err := scrapeDelay([]string{admin}); err == nil {
			m.Metrics = mt
		}
	}
	m.Refused, m.Errors, m.Sent = int(refused.Load()), int(failed.Load()), int(sent.Load())
	// The clients go away: their slots go back, and the sidecar is stopped.
	close(release)
	conns.Wait()
	if m.Waiting > 0 {
		m.BytesPerWaiting = float64(m.RSSAt-m.RSSBefore) / float64(m.Waiting)
	}
	m.Note = fmt.Sprintf("the RSS delta over the requests waiting at the sample with the most: a connection's whole cost (socket buffers in the process, goroutine, parsed request) and what those released before it left; the keys release %d/s in all", keys)
	b.logf("[memory] %d waiting: RSS %.1f -> %.1f MiB, %.0f bytes per waiting request; %d refused, %d errors", m.Waiting,
		float64(m.RSSBefore)/(1<<20), float64(m.RSSAt)/(1<<20), m.BytesPerWaiting, m.Refused, m.Errors)
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
