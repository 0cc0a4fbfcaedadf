package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/client"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

type options struct {
	clients   int
	limit     int
	duration  time.Duration
	naiveWait time.Duration
	sidecar   string
}

// Report is the JSON report.
type Report struct {
	Clients  int    `json:"clients"`
	Limit    int    `json:"limitPerSecond"`
	Duration string `json:"duration"`
	Client   Run    `json:"client"`
	Naive    Run    `json:"naive"`
}

// Run is one run's figures. "After the first second" figures leave out
// second 0, when callers know nothing yet.
type Run struct {
	Name string `json:"name"`
	// Seconds has one entry per second of the run.
	Seconds []Second `json:"seconds"`
	// SentPerSecond, AdmittedPerSecond: means after the first second.
	SentPerSecond     float64 `json:"sentPerSecond"`
	AdmittedPerSecond float64 `json:"admittedPerSecond"`
	// DeniedShare is denied / sent after the first second; WorstSecond the
	// highest share of any one second after the first.
	DeniedShare float64 `json:"deniedShare"`
	WorstSecond float64 `json:"worstSecondDeniedShare"`
	// SidecarCPUSeconds is the CPU the sidecar process used in the run.
	SidecarCPUSeconds float64 `json:"sidecarCPUSeconds"`
	Pass              bool    `json:"pass"`
	Verdict           string  `json:"verdict"`
}

// Second is one second of a run.
type Second struct {
	Sent     int64 `json:"sent"`
	Admitted int64 `json:"admitted"`
	Denied   int64 `json:"denied"`
}

func (r *Report) write(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func bench(ctx context.Context, o options, log io.Writer) (*Report, error) {
	if o.clients < 1 || o.limit < 1 || o.duration < 2*time.Second {
		return nil, errors.New("need -clients >= 1, -limit >= 1 and -duration >= 2s")
	}
	dir, err := os.MkdirTemp("", "floodgate-clientbench")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if o.sidecar == "" {
		_, _ = fmt.Fprintln(log, "building floodgate-sidecar...")
		if o.sidecar, err = simnode.BuildSidecar(ctx, ".", dir); err != nil {
			return nil, err
		}
	}
	rep := &Report{Clients: o.clients, Limit: o.limit, Duration: o.duration.String()}
	for _, r := range []struct {
		run  *Run
		name string
		loop func(hc *http.Client, ctx context.Context, url string) error
	}{
		{&rep.Client, "floodgate client (Pace)", clientLoop},
		{&rep.Naive, "naive retry loop", naiveLoop(o.naiveWait)},
	} {
		_, _ = fmt.Fprintf(log, "\n%s: %d clients on one key limited to %d/s, for %v\n", r.name, o.clients, o.limit, o.duration)
		res, err := measure(ctx, o, dir, r.name, r.loop)
		if err != nil {
			return nil, err
		}
		*r.run = res
		table(log, res)
	}
	judge(rep)
	_, _ = fmt.Fprintf(log, "\nclient: %s\nnaive:  %s\n", rep.Client.Verdict, rep.Naive.Verdict)
	return rep, nil
}

// judge applies the targets: after the first second the application gets
// the limit within 10%, and at most 5% of what is sent is denied.
func judge(rep *Report) {
	for _, r := range []*Run{&rep.Client, &rep.Naive} {
		admittedOK := r.AdmittedPerSecond >= 0.9*float64(rep.Limit) && r.AdmittedPerSecond <= 1.1*float64(rep.Limit)
		r.Pass = admittedOK && r.DeniedShare <= 0.05
		r.Verdict = fmt.Sprintf("sent %.1f/s, admitted %.1f/s (limit %d/s), denied %.2f%% of sent after the first second (worst second %.1f%%), sidecar CPU %.2fs: ",
			r.SentPerSecond, r.AdmittedPerSecond, rep.Limit, 100*r.DeniedShare, 100*r.WorstSecond, r.SidecarCPUSeconds)
		if r.Pass {
			r.Verdict += "meets the targets (admitted within 10% of the limit, at most 5% denied)"
		} else {
			r.Verdict += "misses the targets (admitted within 10% of the limit, at most 5% denied)"
		}
	}
}

// tally counts, per second of a run, what the clients sent, what the
// sidecar denied, and what reached the application.
type tally struct {
	start              time.Time
	sent, denied, hits []atomic.Int64
}

func newTally(secs int) *tally {
	return &tally{sent: make([]atomic.Int64, secs), denied: make([]atomic.Int64, secs), hits: make([]atomic.Int64, secs)}
}

func (t *tally) second(now time.Time) int {
	s := int(now.Sub(t.start) / time.Second)
	if s < 0 || s >= len(t.sent) {
		return -1
	}
	return s
}

func (t *tally) count(c []atomic.Int64, now time.Time) {
	if s := t.second(now); s >= 0 {
		c[s].Add(1)
	}
}

// counter is the clients' base transport: it counts every attempt that
// reaches the sidecar, and its 429s.
type counter struct {
	base http.RoundTripper
	t    *tally
}

func (c counter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.t.count(c.t.sent, time.Now())
	resp, err := c.base.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		c.t.count(c.t.denied, time.Now())
	}
	return resp, err
}

func measure(ctx context.Context, o options, dir, name string, loop func(*http.Client, context.Context, string) error) (Run, error) {
	secs := int(o.duration / time.Second)
	t := newTally(secs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Run{}, err
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.count(t.hits, time.Now())
		_, _ = io.WriteString(w, "ok")
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = app.Serve(ln) }()
	defer func() { _ = app.Close() }()

	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: bench
  uid: bench-1
  rules:
  - name: per-key
    key: [{header: X-API-Key}]
    limit: {requests: %d, per: 1s}
`, o.limit)), 0o600); err != nil {
		return Run{}, err
	}
	runDir, err := os.MkdirTemp(dir, "run")
	if err != nil {
		return Run{}, err
	}
	sc, err := simnode.StartStandalone(ctx, o.sidecar, runDir, "--policy-file", policy, "--store", "memory",
		"--upstream", "http://"+ln.Addr().String())
	if err != nil {
		return Run{}, err
	}
	defer sc.Stop(5 * time.Second)
	cpu0, err := cpuSeconds(sc.Pid())
	if err != nil {
		return Run{}, err
	}

	t.start = time.Now()
	// The run ends by cancellation, not by a deadline on the requests: a
	// deadline would cut the client's waits short near the end.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := time.AfterFunc(o.duration, cancel)
	defer stop.Stop()
	var wg sync.WaitGroup
	errs := make(chan error, o.clients)
	for range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}
			defer base.CloseIdleConnections()
			hc := &http.Client{Transport: counter{base: base, t: t}}
			if err := loop(hc, runCtx, sc.URL+"/api/orders"); err != nil && runCtx.Err() == nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return Run{}, fmt.Errorf("%s: %w", name, err)
	}
	if ctx.Err() != nil {
		return Run{}, ctx.Err()
	}
	cpu1, err := cpuSeconds(sc.Pid())
	if err != nil {
		return Run{}, err
	}

	res := Run{Name: name, SidecarCPUSeconds: cpu1 - cpu0}
	var sent, denied, hits int64
	for i := range secs {
		s := Second{Sent: t.sent[i].Load(), Admitted: t.hits[i].Load(), Denied: t.denied[i].Load()}
		res.Seconds = append(res.Seconds, s)
		if i == 0 {
			continue
		}
		sent, denied, hits = sent+s.Sent, denied+s.Denied, hits+s.Admitted
		if s.Sent > 0 {
			res.WorstSecond = max(res.WorstSecond, float64(s.Denied)/float64(s.Sent))
		}
	}
	after := float64(secs - 1)
	res.SentPerSecond, res.AdmittedPerSecond = float64(sent)/after, float64(hits)/after
	if sent > 0 {
		res.DeniedShare = float64(denied) / float64(sent)
	}
	return res, nil
}

// clientLoop sends as fast as the client package lets it: the Transport
// paces the requests and retries the 429s.
func clientLoop(hc *http.Client, ctx context.Context, url string) error {
	hc.Transport = client.NewTransport(client.Options{Base: hc.Transport, Pace: true})
	for ctx.Err() == nil {
		err := get(ctx, hc, url)
		var pe *client.PacedError
		switch {
		case errors.As(err, &pe):
			// The next slot is further away than the client waits for
			// one request: wait for it, then try again.
			select {
			case <-ctx.Done():
			case <-time.After(pe.Wait):
			}
		case err != nil:
			return err
		}
	}
	return nil
}

// naiveLoop sends as fast as it can and, on a 429, tries again after wait,
// whatever the answer said.
func naiveLoop(wait time.Duration) func(*http.Client, context.Context, string) error {
	return func(hc *http.Client, ctx context.Context, url string) error {
		for ctx.Err() == nil {
			if err := get(ctx, hc, url); err != nil {
				return err
			}
			if wait > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
			}
		}
		return nil
	}
}

func get(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", "shared")
	resp, err := hc.Do(req)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil //nolint:nilerr // the run ended while the request was out
	case err != nil:
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// cpuSeconds reads a process's user and system CPU time from /proc.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command (in parentheses, which may hold
	// spaces): utime and stime are the 12th and 13th of them.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (ut + st) / 100, nil // USER_HZ is 100 on Linux
}

func table(w io.Writer, r Run) {
	_, _ = fmt.Fprintf(w, "%6s %9s %9s %9s %8s\n", "second", "sent", "admitted", "denied", "denied%")
	for i, s := range r.Seconds {
		share := 0.0
		if s.Sent > 0 {
			share = 100 * float64(s.Denied) / float64(s.Sent)
		}
		_, _ = fmt.Fprintf(w, "%6d %9d %9d %9d %7.1f%%\n", i, s.Sent, s.Admitted, s.Denied, share)
	}
}
