package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/floodgate-dev/floodgate/bench/harness"
)

// memoryPhase leaves o.memWaiting requests waiting in one sidecar and
// measures its RSS.
func (b *bench) memoryPhase(ctx context.Context) (*Memory, error) {
	n, keys := b.o.memWaiting, b.o.memKeys
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(n+1000) {
		return nil, fmt.Errorf("the file-descriptor limit is %d: %d connections need %d (ulimit -n)", lim.Cur, n, n+1000)
	}
	app, err := b.startApp(ctx)
	if err != nil {
		return nil, err
	}
	limit := b.ruleLimit(1, "1s", time.Minute, 1)
	pf, pods, err := b.policy("mem", 1, "/mem", limit)
	if err != nil {
		return nil, err
	}
	pid, base, admin, err := b.sidecar(ctx, pf, pods[0], app)
	if err != nil {
		return nil, err
	}
	defer b.stop(pid)
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	addr := u.Host
	m := &Memory{Keys: keys, Sent: n}
	b.logf("[memory] one sidecar, rule %s; %d primers (one per key, passed at once)", limit, keys)
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
	dials := make(chan struct{}, 128)
	for i := range n {
		conns.Go(func() {
			dials <- struct{}{}
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
		})
	}
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
		if allWritten.IsZero() && written.Load()+failed.Load() >= int64(n) {
			allWritten = time.Now()
		}
		if !allWritten.IsZero() && time.Since(allWritten) > time.Second {
			break
		}
	}
	if mt, err := scrapeDelay([]string{admin}); err == nil {
		m.Metrics = mt
	}
	m.Refused, m.Errors = int(refused.Load()), int(failed.Load())
	// The clients go away: their slots go back, and the sidecar is stopped.
	close(release)
	conns.Wait()
	if m.Waiting > 0 {
		m.BytesPerWaiting = float64(m.RSSAt-m.RSSBefore) / float64(m.Waiting)
	}
	m.Note = fmt.Sprintf("rule %s per key; the RSS delta over the requests waiting at the sample with the most, so a connection's whole cost (socket, buffers, goroutine) and the garbage of those released before it; keys release %d/s between them", limit, keys)
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
