// Package events carries deny events from the decision path to a JSON log
// through a bounded queue. Publishing never blocks: when the queue is full
// the event is dropped and counted.
package events

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
)

// Event is one denied (or, in shadow mode, would-be denied) request. It
// holds no raw descriptor values: Key is the hashed counter key.
type Event struct {
	Time       time.Time
	Policy     string
	Rule       string
	Key        string
	Shadow     bool
	Source     string // "store", "local" or "fallback" (engine.Source)
	Limit      int64
	Cost       int64
	RetryAfter time.Duration
	Method     string
	Path       string
	Client     string // the peer's address, without its port
}

// Denied reports whether res is a denial that makes an event: the store,
// the local deny cache or the fail-open fallback refused the hit, in
// shadow mode too. A hit that was not evaluated, or whose fail-closed rule
// could not reach its store, is not one: nothing was over its limit.
func Denied(res *engine.Result) bool {
	return !res.Allowed && res.Source != engine.NotEvaluated && res.Source != engine.FromNowhere
}

// Deny returns the event of hit h, which res denied, at time at. method
// and path say what was asked, as the front saw it: the HTTP method and
// path, or "ShouldRateLimit" and no path. peer is the connection's peer
// address, host:port; the event's Client is its host. It is the one
// constructor of deny events, for both fronts.
func Deny(at time.Time, h *engine.Hit, res *engine.Result, method, path, peer string) Event {
	client := peer
	if host, _, err := net.SplitHostPort(peer); err == nil {
		client = host
	}
	return Event{
		Time: at, Policy: h.Rule.Policy, Rule: h.Rule.Name, Key: h.Key,
		Shadow: h.Rule.Shadow, Source: res.Source.String(), Limit: res.Limit, Cost: h.Cost,
		RetryAfter: res.RetryAfter, Method: method, Path: path, Client: client,
	}
}

// Queue is a bounded asynchronous event queue. Publish is safe for
// concurrent use and never blocks; Run drains the queue until its context
// ends and then flushes what is left.
type Queue struct {
	ch      chan Event
	log     *slog.Logger
	logged  prometheus.Counter
	dropped prometheus.Counter
	done    chan struct{}
}

// NewQueue returns a queue of the given capacity that writes to log and
// counts into logged and dropped (either may be nil).
func NewQueue(capacity int, log *slog.Logger, logged, dropped prometheus.Counter) *Queue {
	if capacity < 1 {
		capacity = 1
	}
	return &Queue{ch: make(chan Event, capacity), log: log, logged: logged, dropped: dropped, done: make(chan struct{})}
}

// Publish enqueues e, or drops it when the queue is full. It reports
// whether e was enqueued.
func (q *Queue) Publish(e Event) bool {
	select {
	case q.ch <- e:
		return true
	default:
		if q.dropped != nil {
			q.dropped.Inc()
		}
		return false
	}
}

// Run writes events until ctx ends, then writes those still queued and
// returns. Call it once.
func (q *Queue) Run(ctx context.Context) {
	defer close(q.done)
	for {
		select {
		case e := <-q.ch:
			q.write(e)
		case <-ctx.Done():
			for {
				select {
				case e := <-q.ch:
					q.write(e)
				default:
					return
				}
			}
		}
	}
}

// Done is closed when Run has returned.
func (q *Queue) Done() <-chan struct{} { return q.done }

func (q *Queue) write(e Event) {
	msg := "rate limit deny"
	if e.Shadow {
		msg = "rate limit shadow deny"
	}
	q.log.LogAttrs(context.Background(), slog.LevelInfo, msg,
		slog.Time("at", e.Time),
		slog.String("policy", e.Policy),
		slog.String("rule", e.Rule),
		slog.String("key", e.Key),
		slog.Bool("shadow", e.Shadow),
		slog.String("source", e.Source),
		slog.Int64("limit", e.Limit),
		slog.Int64("cost", e.Cost),
		// In seconds, and named so: a bare duration is nanoseconds in
		// JSON, which no reader of a deny log expects.
		slog.Float64("retryAfterSeconds", e.RetryAfter.Seconds()),
		slog.String("method", e.Method),
		slog.String("path", e.Path),
		slog.String("client", e.Client),
	)
	if q.logged != nil {
		q.logged.Inc()
	}
}
