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
			ok := q.Publish(Event{Policy: "p", Rule: "r", Key: "uid:r:abc", Cost: int64(i)})
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
}
