// Package bench is floodgate's load harness: an open-loop load generator
// that measures latency from each request's scheduled send time (so a slow
// server cannot hide its queueing delay by slowing the generator down, the
// "coordinated omission" of closed-loop tools), a closed-loop generator for
// maximum throughput, and the scenarios that cmd/floodgate-bench runs
// against real floodgate-sidecar, backend and Redis Cluster processes.
package harness

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Target describes the requests of a run: request i is a GET of
// URLs[i%len(URLs)] with the extra header lines that Header(dst, i) appends
// to dst (none when Header is nil). Each line ends in CRLF.
type Target struct {
	URLs   []string
	Header func(dst []byte, i int64) []byte
}

// Stats summarise a run.
type Stats struct {
	// Sent counts requests started; OK those answered 2xx; Limited those
	// answered 429; Errors transport errors and other statuses.
	Sent, OK, Limited, Errors int64
	// Elapsed is the run's wall time; Rate is completed requests per
	// second over it.
	Elapsed time.Duration
	Rate    float64
	// Latency percentiles in microseconds. For an open-loop run they are
	// measured from each request's scheduled send time.
	P50, P90, P99, P999, Max float64
	// CPUMicros is the CPU time the path's process (Path.PID) spent per
	// completed request, when it was measured.
	CPUMicros float64 `json:",omitempty"`
}

type recorder struct {
	ok, limited, errors atomic.Int64
	mu                  sync.Mutex
	lat                 []float64 // microseconds
	// records, when not nil, receives each open-loop request's Record at
	// its request number (OpenLoopRecords).
	records []Record
}

// Record is one open-loop request's outcome: when it was due (its
// scheduled send time), when a worker took it up to send (later than Due
// when every worker was busy or the generator was descheduled), when its
// answer was read, and its status (0 for a transport error).
type Record struct {
	Due, Sent, Done time.Time
	Status          int
}

func (r *recorder) add(local []float64) {
	r.mu.Lock()
	r.lat = append(r.lat, local...)
	r.mu.Unlock()
}

func (r *recorder) stats(sent int64, elapsed time.Duration) Stats {
	slices.Sort(r.lat)
	s := Stats{Sent: sent, OK: r.ok.Load(), Limited: r.limited.Load(), Errors: r.errors.Load(), Elapsed: elapsed}
	s.Rate = float64(len(r.lat)) / elapsed.Seconds()
	s.P50, s.P90, s.P99, s.P999 = pct(r.lat, 0.50), pct(r.lat, 0.90), pct(r.lat, 0.99), pct(r.lat, 0.999)
	if n := len(r.lat); n > 0 {
		s.Max = r.lat[n-1]
	}
	return s
}

// pct returns the q-quantile of sorted samples (nearest rank).
func pct(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// compiled is a Target with its URLs parsed.
type compiled struct {
	eps    []endpoint
	header func([]byte, int64) []byte
}

func compile(t Target) (compiled, error) {
	if len(t.URLs) == 0 {
		return compiled{}, fmt.Errorf("target: no URLs")
	}
	c := compiled{header: t.Header}
	for _, u := range t.URLs {
		ep, err := parseEndpoint(u)
		if err != nil {
			return compiled{}, err
		}
		c.eps = append(c.eps, ep)
	}
	return c, nil
}

func do(ctx context.Context, c *Client, t compiled, i int64, rec *recorder) (int, bool) {
	var hdr func([]byte) []byte
	if t.header != nil {
		hdr = func(dst []byte) []byte { return t.header(dst, i) }
	}
	status, err := c.do(t.eps[i%int64(len(t.eps))], hdr)
	if err != nil {
		if ctx.Err() == nil {
			rec.errors.Add(1)
		}
		return 0, false
	}
	switch {
	case status/100 == 2:
		rec.ok.Add(1)
	case status == http.StatusTooManyRequests:
		rec.limited.Add(1)
	default:
		rec.errors.Add(1)
	}
	return status, true
}

// OpenLoop sends requests at a fixed rate for d, whatever the server does:
// request i is due at start + i/rate, and its latency is counted from that
// instant, so time spent waiting for a free worker (because the server is
// slow) counts against the server. workers bounds the requests in flight.
func OpenLoop(ctx context.Context, c *Client, t Target, rate float64, d time.Duration, workers int) (Stats, error) {
	rec := &recorder{}
	sent, elapsed, err := openLoop(ctx, c, t, rate, d, workers, 0, rec)
	if err != nil {
		return Stats{}, err
	}
	return rec.stats(sent, elapsed), nil
}

// OpenLoopRecords is OpenLoop that also returns every request's Record,
// indexed by request number (rate*d of them; a request never sent keeps
// a zero Record). Target.Header sees the same numbers, so a header can
// carry the number for the server to log.
func OpenLoopRecords(ctx context.Context, c *Client, t Target, rate float64, d time.Duration, workers int) (Stats, []Record, error) {
	rec := &recorder{records: make([]Record, int64(rate*d.Seconds()))}
	sent, elapsed, err := openLoop(ctx, c, t, rate, d, workers, 0, rec)
	if err != nil {
		return Stats{}, nil, err
	}
	return rec.stats(sent, elapsed), rec.records, nil
}

// Path is one side of an interleaved comparison: a target and the client
// that sends to it.
type Path struct {
	Client *Client
	Target Target
	// PID, when set, is the process whose CPU time per request the
	// comparison reports (the service the path goes through).
	PID int
}

// Interleaved compares two paths at the same open-loop rate. It runs them
// in alternating slices (a, b, a, b, ...) until each has run for total, so
// that the load generator carries one stream at a time (running both at
// once would double its load) while whatever else the machine does weighs
// on both alike. Request numbering continues across slices, so keyed
// targets see the same keys on both paths.
func Interleaved(ctx context.Context, a, b Path, rate float64, slice, total time.Duration, workers int) (Stats, Stats, error) {
	st, err := InterleavedN(ctx, []Path{a, b}, rate, slice, total, workers)
	if err != nil {
		return Stats{}, Stats{}, err
	}
	return st[0], st[1], nil
}

// InterleavedN is Interleaved over any number of paths, in turn. For a
// path with a PID it also reports that process's CPU time per request,
// read from /proc around each of the path's slices.
func InterleavedN(ctx context.Context, paths []Path, rate float64, slice, total time.Duration, workers int) ([]Stats, error) {
	if slice <= 0 || total < slice {
		return nil, fmt.Errorf("interleaved: slice must be positive and at most the total")
	}
	recs := make([]recorder, len(paths))
	sent := make([]int64, len(paths))
	elapsed := make([]time.Duration, len(paths))
	cpu := make([]time.Duration, len(paths))
	for done := time.Duration(0); done < total; done += slice {
		d := min(slice, total-done)
		for i, p := range paths {
			var c0 time.Duration
			if p.PID > 0 {
				var err error
				if c0, err = ProcCPU(p.PID); err != nil {
					return nil, err
				}
			}
			n, e, err := openLoop(ctx, p.Client, p.Target, rate, d, workers, sent[i], &recs[i])
			if err != nil {
				return nil, err
			}
			if p.PID > 0 {
				c1, err := ProcCPU(p.PID)
				if err != nil {
					return nil, err
				}
				cpu[i] += c1 - c0
			}
			sent[i] += n
			elapsed[i] += e
		}
	}
	out := make([]Stats, len(paths))
	for i := range paths {
		out[i] = recs[i].stats(sent[i], elapsed[i])
		if n := len(recs[i].lat); n > 0 && paths[i].PID > 0 {
			out[i].CPUMicros = float64(cpu[i].Microseconds()) / float64(n)
		}
	}
	return out, nil
}

// openLoop is one open-loop run into rec; requests are numbered from first.
// It returns the requests sent and the run's wall time. A dispatcher
// releases each request at its due instant (see Pacer) to the first free
// worker; when every worker is busy the request waits, and that wait is
// part of its latency.
func openLoop(ctx context.Context, c *Client, t Target, rate float64, d time.Duration, workers int, first int64, rec *recorder) (int64, time.Duration, error) {
	if rate <= 0 || d <= 0 || workers <= 0 {
		return 0, 0, fmt.Errorf("open loop: rate, duration and workers must be positive")
	}
	ct, err := compile(t)
	if err != nil {
		return 0, 0, err
	}
	pc, err := NewPacer()
	if err != nil {
		return 0, 0, fmt.Errorf("open loop: %w", err)
	}
	defer pc.Close()
	total := int64(rate * d.Seconds())
	interval := float64(time.Second) / rate
	start := time.Now().Add(10 * time.Millisecond)
	due := func(i int64) time.Time { return start.Add(time.Duration(float64(i) * interval)) }
	ctx, cancel := context.WithTimeout(ctx, d+10*time.Second)
	defer cancel()
	queue := make(chan int64, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			local := make([]float64, 0, total/int64(workers)+16)
			defer func() { rec.add(local) }()
			for i := range queue {
				if ctx.Err() != nil {
					continue
				}
				sentAt := time.Now()
				status, ok := do(ctx, c, ct, first+i, rec)
				if ok {
					local = append(local, float64(time.Since(due(i)).Microseconds()))
				}
				if rec.records != nil && i < int64(len(rec.records)) {
					rec.records[i] = Record{Due: due(i), Sent: sentAt, Done: time.Now(), Status: status}
				}
			}
		})
	}
	var sent int64
	for ; sent < total && ctx.Err() == nil; sent++ {
		pc.Sleep(time.Until(due(sent)))
		select {
		case queue <- sent:
		case <-ctx.Done():
		}
	}
	close(queue)
	wg.Wait()
	return sent, time.Since(start), nil
}

// ClosedLoop runs conns workers that each send the next request as soon as
// the last one is answered, for d: the server's maximum throughput at that
// concurrency. Its latencies are service times, not open-loop latencies.
func ClosedLoop(ctx context.Context, c *Client, t Target, d time.Duration, conns int) (Stats, error) {
	if d <= 0 || conns <= 0 {
		return Stats{}, fmt.Errorf("closed loop: duration and conns must be positive")
	}
	ct, err := compile(t)
	if err != nil {
		return Stats{}, err
	}
	rec := &recorder{}
	var next atomic.Int64
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			var local []float64
			defer func() { rec.add(local) }()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				t0 := time.Now()
				if _, ok := do(ctx, c, ct, i, rec); ok {
					local = append(local, float64(time.Since(t0).Microseconds()))
				}
			}
		})
	}
	wg.Wait()
	return rec.stats(next.Load(), time.Since(start)), nil
}
