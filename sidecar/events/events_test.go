package events

import (
	"bytes"
	"context"
	"encoding/json"
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
