package harness

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestOpenLoopCountsQueueingFromTheSchedule(t *testing.T) {
	t.Parallel()
	var served atomic.Int64
	// The closed-loop run below ends when the server has answered
	// closedRequests of it (closed is its context's cancel), not after a
	// stretch of wall time in which a busy machine may answer none.
	const closedRequests = 5
	var closedServed atomic.Int64
	var closed atomic.Pointer[context.CancelFunc]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		time.Sleep(20 * time.Millisecond)
		if r.Header.Get("X-Key") == "k1" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		if c := closed.Load(); c != nil && closedServed.Add(1) == closedRequests {
			(*c)()
		}
	}))
	t.Cleanup(srv.Close)
	c := NewClient()
	// 100 requests due within 0.5s, served one at a time in at least 20ms
	// each: request i completes at least (i+1) x 20ms after the first was
	// due and is due i x 5ms after it, so its latency is at least 20ms +
	// i x 15ms: the last one's at least 1.5s, the median's (i = 49) at
	// least 0.75s, however slow the machine. A closed-loop tool would
	// report about 20ms for every one.
	s, err := OpenLoop(context.Background(), c, Target{URLs: []string{srv.URL}, Header: keyed("k", 2)}, 200, 500*time.Millisecond, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s.Sent != 100 || s.OK != 50 || s.Limited != 50 || s.Errors != 0 || served.Load() != 100 {
		t.Errorf("stats %+v (served %d), want 100 sent, 50 ok, 50 limited", s, served.Load())
	}
	if s.Max < 1.5e6 {
		t.Errorf("max latency %.0fµs, want >= 1.5s: queueing behind a slow server must count", s.Max)
	}
	if s.P50 < 0.5e6 {
		t.Errorf("p50 %.0fµs, want >= 0.5s", s.P50)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	closed.Store(&cancel)
	cl, err := ClosedLoop(ctx, c, Target{URLs: []string{srv.URL}}, time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The server ends the run while it serves the last request, which is
	// answered and counted; the loop sends no other, having waited for
	// that answer.
	if cl.OK != closedRequests || cl.Errors != 0 {
		t.Errorf("closed loop %+v, want exactly %d answered and no errors", cl, closedRequests)
	}
	if cl.P50 < 20e3 {
		t.Errorf("closed-loop p50 %.0fµs, want >= the 20ms service time", cl.P50)
	}
}

func TestPercentiles(t *testing.T) {
	t.Parallel()
	var xs []float64
	for i := 1; i <= 1000; i++ {
		xs = append(xs, float64(i))
	}
	for q, want := range map[float64]float64{0.5: 500, 0.99: 990, 0.999: 999, 1: 1000} {
		if got := pct(xs, q); got != want {
			t.Errorf("pct(%v) = %v, want %v", q, got, want)
		}
	}
	if got := pct(nil, 0.5); got != 0 {
		t.Errorf("pct of nothing = %v", got)
	}
}

func TestScriptCalls(t *testing.T) {
	t.Parallel()
	info := strings.Join([]string{
		"# Commandstats",
		"cmdstat_evalsha:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=0",
		"cmdstat_eval:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=0",
		"cmdstat_ping:calls=77,usec=10,usec_per_call=0.13,rejected_calls=0,failed_calls=0",
		"cmdstat_cluster|slots:calls=5,usec=10",
	}, "\r\n")
	if got, want := ScriptCalls(info), int64(123); got != want {
		t.Errorf("scriptCalls = %d, want %d", got, want)
	}
}

func TestInterleavedAlternatesSlicesAndKeepsNumbering(t *testing.T) {
	t.Parallel()
	// Each server records the request numbers it saw and whether the other
	// server was mid-slice: with alternating slices the two never overlap.
	var inA, inB atomic.Int64
	var overlap atomic.Int64
	var keysA, keysB sync.Map
	handler := func(self, other *atomic.Int64, keys *sync.Map, delay time.Duration, status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			self.Add(1)
			defer self.Add(-1)
			if other.Load() > 0 {
				overlap.Add(1)
			}
			keys.Store(r.Header.Get("X-Key"), true)
			time.Sleep(delay)
			w.WriteHeader(status)
		}
	}
	// a answers 200 and b 429, so each path's counts show whose answers
	// it recorded; b's 3ms service time is in each of its latencies.
	a := httptest.NewServer(handler(&inA, &inB, &keysA, 0, http.StatusOK))
	t.Cleanup(a.Close)
	b := httptest.NewServer(handler(&inB, &inA, &keysB, 3*time.Millisecond, http.StatusTooManyRequests))
	t.Cleanup(b.Close)
	key := keyed("k", 1<<40)
	// 100/s for 0.6s per path in 0.2s slices: 60 requests each, in three
	// slices of 20.
	sa, sb, err := Interleaved(context.Background(),
		Path{Client: NewClient(), Target: Target{URLs: []string{a.URL}, Header: key}},
		Path{Client: NewClient(), Target: Target{URLs: []string{b.URL}, Header: key}},
		100, 200*time.Millisecond, 600*time.Millisecond, 8)
	if err != nil {
		t.Fatal(err)
	}
	if sa.Sent != 60 || sa.OK != 60 || sa.Limited != 0 || sb.Sent != 60 || sb.Limited != 60 || sb.OK != 0 || sa.Errors+sb.Errors != 0 {
		t.Errorf("a %+v, b %+v: want 60 sent on each path, a's all answered 200 and b's all 429", sa, sb)
	}
	// A slice ends when its last answer is in, and the server's handler
	// has left by then: a request that arrives while the other path is
	// mid-slice is a slice that did not wait for the other's end.
	if n := overlap.Load(); n != 0 {
		t.Errorf("%d requests arrived while the other path was mid-slice: the slices must alternate", n)
	}
	if sb.P50 < 3000 {
		t.Errorf("p50 of b %.0fµs: b's 3ms service time must show in its latencies", sb.P50)
	}
	// Numbering continues across slices: each path saw keys k0..k59 once.
	for _, keys := range []*sync.Map{&keysA, &keysB} {
		n := 0
		keys.Range(func(k, _ any) bool { n++; return true })
		if n != 60 {
			t.Errorf("a path saw %d distinct keys, want 60 (numbering must continue across slices)", n)
		}
	}
	if _, _, err := Interleaved(context.Background(), Path{}, Path{}, 100, 0, time.Second, 1); err == nil {
		t.Error("a zero slice was accepted")
	}
}
