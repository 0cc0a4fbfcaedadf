package events

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func count(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.Counter.GetValue()
}

func TestQueueDropsWhenFullAndNeverBlocks(t *testing.T) {
	t.Parallel()
	var buf lockedBuffer
	logged := prometheus.NewCounter(prometheus.CounterOpts{Name: "logged", Help: "h"})
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped", Help: "h"})
	q := NewQueue(2, slog.New(slog.NewJSONHandler(&buf, nil)), logged, dropped)
	// Nothing drains yet: the third and later publishes must return at
	// once, dropped.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 5 {
			ok := q.Publish(Event{Policy: "p", Rule: "r", Key: "uid:r:abc", Cost: int64(i), RetryAfter: 1500 * time.Millisecond})
			if want := i < 2; ok != want {
				t.Errorf("publish %d: %v, want %v", i, ok, want)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish blocked on a full queue")
	}
	if got := count(dropped); got != 3 {
		t.Errorf("dropped = %v, want 3", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go q.Run(ctx)
	cancel()
	<-q.Done()
	if got := count(logged); got != 2 {
		t.Errorf("logged = %v, want 2 (the queue is flushed on stop)", got)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want 2:\n%s", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["msg"] != "rate limit deny" || rec["policy"] != "p" || rec["key"] != "uid:r:abc" {
		t.Errorf("event record %v", rec)
	}
	// The wait is in seconds and says so (it was nanoseconds, unnamed).
	if rec["retryAfterSeconds"] != 1.5 || rec["retryAfter"] != nil {
		t.Errorf("event record %v: want retryAfterSeconds 1.5 and no unitless retryAfter", rec)
	}
}

func TestDenied(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		res  engine.Result
		want bool
	}{
		{engine.Result{Source: engine.NotEvaluated}, false},
		{engine.Result{Source: engine.FromStore, Decision: limiter.Decision{Allowed: true}}, false},
		{engine.Result{Source: engine.FromStore}, true},
		{engine.Result{Source: engine.FromDenyCache}, true},
		{engine.Result{Source: engine.FromFallback}, true},
		{engine.Result{Source: engine.FromFallback, Decision: limiter.Decision{Allowed: true}}, false},
		{engine.Result{Source: engine.FromNowhere}, false},
	} {
		if got := Denied(&tc.res); got != tc.want {
			t.Errorf("Denied(source %v, allowed %v) = %v, want %v", tc.res.Source, tc.res.Allowed, got, tc.want)
		}
	}
}

func TestDeny(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_700_000_000, 0)
	h := &engine.Hit{Rule: &engine.Rule{Policy: "shop", Name: "per-user", Shadow: true}, Key: "uid:per-user:abc", Cost: 3}
	res := &engine.Result{Decision: limiter.Decision{Limit: 10, RetryAfter: 1500 * time.Millisecond}, Source: engine.FromDenyCache}
	for _, tc := range []struct{ peer, client string }{
		{"192.0.2.1:5555", "192.0.2.1"},
		{"[2001:db8::1]:443", "2001:db8::1"},
		{"@", "@"}, // not host:port: kept as it is
		{"", ""},
	} {
		got := Deny(at, h, res, "POST", "/cart", tc.peer)
		want := Event{Time: at, Policy: "shop", Rule: "per-user", Key: "uid:per-user:abc", Shadow: true, Source: "local",
			Limit: 10, Cost: 3, RetryAfter: 1500 * time.Millisecond, Method: "POST", Path: "/cart", Client: tc.client}
		if got != want {
			t.Errorf("Deny(peer %q) = %+v, want %+v", tc.peer, got, want)
		}
	}
}

// A flood beyond the line budget is summed per key into one line a second,
// and the counts of all lines add up to every event published.
func TestFloodIsSummedWithExactCounts(t *testing.T) {
	t.Parallel()
	var buf lockedBuffer
	logged := prometheus.NewCounter(prometheus.CounterOpts{Name: "logged", Help: "h"})
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped", Help: "h"})
	q := NewQueue(4096, slog.New(slog.NewJSONHandler(&buf, nil)), logged, dropped)
	ctx, cancel := context.WithCancel(context.Background())
	go q.Run(ctx)
	at := time.Now()
	const n = 5000
	for i := range n {
		key := "uid:r:hot"
		if i%2 == 1 {
			key = "uid:r:other"
		}
		if !q.Publish(Event{Time: at, Policy: "p", Rule: "r", Key: key, Method: "GET", Path: "/x"}) {
			t.Fatalf("publish %d dropped", i)
		}
	}
	cancel()
	<-q.Done()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var sum, single int64
	summaries := map[string]int64{}
	for _, l := range lines {
		var rec struct {
			Msg   string `json:"msg"`
			Key   string `json:"key"`
			Count int64  `json:"count"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if rec.Msg != "rate limit deny" {
			t.Errorf("msg %q", rec.Msg)
		}
		sum += rec.Count
		if rec.Count == 1 {
			single++
		} else {
			summaries[rec.Key] += rec.Count
		}
	}
	if sum != n {
		t.Errorf("the counts of %d lines add up to %d, want %d", len(lines), sum, n)
	}
	if single != LinesPerSecond {
		t.Errorf("%d single-event lines, want the budget of %d", single, LinesPerSecond)
	}
	if len(summaries) != 2 || summaries["uid:r:hot"] != summaries["uid:r:other"] {
		t.Errorf("summaries %v, want one per key with equal counts", summaries)
	}
	if got := count(logged); got != n {
		t.Errorf("logged = %v, want %d", got, n)
	}
	if got := count(dropped); got != 0 {
		t.Errorf("dropped = %v, want 0", got)
	}
}

// Below info, events are counted as unlogged and nothing is written.
func TestEventsBelowLogLevelAreOnlyCounted(t *testing.T) {
	t.Parallel()
	var buf lockedBuffer
	unlogged := prometheus.NewCounter(prometheus.CounterOpts{Name: "unlogged", Help: "h"})
	q := NewQueue(8, slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})), nil, nil)
	q.CountUnlogged(unlogged)
	ctx, cancel := context.WithCancel(context.Background())
	go q.Run(ctx)
	for range 100 {
		q.Publish(Event{Policy: "p", Rule: "r", Key: "k"})
	}
	cancel()
	<-q.Done()
	if got := count(unlogged); got != 100 {
		t.Errorf("unlogged = %v, want 100", got)
	}
	if buf.String() != "" {
		t.Errorf("lines written at warn: %q", buf.String())
	}
}

// BenchmarkPublishFlood is the cost a denial pays for its event once the
// line budget is spent: one map update under a lock.
func BenchmarkPublishFlood(b *testing.B) {
	q := NewQueue(4096, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil, nil)
	at := time.Now()
	for range LinesPerSecond {
		q.Publish(Event{Time: at, Policy: "p", Rule: "r", Key: "k"})
	}
	e := Event{Time: at, Policy: "p", Rule: "r", Key: "uid:r:0123456789abcdef0123456789abcdef", Method: "GET", Path: "/deny"}
	b.ReportAllocs()
	for b.Loop() {
		q.Publish(e)
	}
}
