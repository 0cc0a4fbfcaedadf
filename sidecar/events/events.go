// Package events carries deny events from the decision path to a JSON log
// through a bounded queue. Publishing never blocks: when the queue is full
// the event is dropped and counted.
//
// Events are written one line each up to LinesPerSecond. Beyond that rate
// the events of each (policy, rule, key, shadow) are added up and written
// once a second as one line whose "count" field says how many events it
// stands for, with the first event's fields as the sample. Every line has
// a count, so the sum of the counts is the number of events logged, and
// deny_events_total counts every event once whichever way it went: a
// flood of denials costs a map update per event instead of a JSON line.
// When the logger does not write info lines, events are only counted.
package events

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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
	ch       chan Event
	log      *slog.Logger
	logged   prometheus.Counter
	dropped  prometheus.Counter
	unlogged prometheus.Counter
	enabled  bool
	capacity int
	done     chan struct{}

	mu     sync.Mutex
	tokens float64   // line budget left
	last   time.Time // when tokens was last refilled
	agg    map[aggKey]aggregate
}

// LinesPerSecond is the rate of deny events written one line each; more
// are summed into one line per key and second.
const LinesPerSecond = 100

// aggKey identifies the events one summary line stands for.
type aggKey struct {
	policy, rule, key string
	shadow            bool
}

// aggregate is the summary of one key's events within a second.
type aggregate struct {
	first Event
	count int64
}

// NewQueue returns a queue of the given capacity that writes to log and
// counts into logged and dropped (either may be nil).
func NewQueue(capacity int, log *slog.Logger, logged, dropped prometheus.Counter) *Queue {
	if capacity < 1 {
		capacity = 1
	}
	return &Queue{ch: make(chan Event, capacity), log: log, logged: logged, dropped: dropped, done: make(chan struct{}),
		enabled: log.Enabled(context.Background(), slog.LevelInfo), capacity: capacity,
		tokens: LinesPerSecond, agg: map[aggKey]aggregate{}}
}

// Logging reports whether published events are written; when not, a
// publisher may pass an empty Event, which is only counted.
func (q *Queue) Logging() bool { return q.enabled }

// CountUnlogged sets the counter of the events not written because the
// logger does not write info lines. Call it before the first Publish.
func (q *Queue) CountUnlogged(c prometheus.Counter) { q.unlogged = c }

// Publish hands e to the log: queued as a line of its own while the line
// budget lasts, else added to its key's summary of this second. It drops
// e, and counts it, when the queue or the summary table is full. It
// reports whether e was kept. e's strings may alias memory the caller
// reuses: those kept are copied.
func (q *Queue) Publish(e Event) bool {
	if !q.enabled {
		if q.unlogged != nil {
			q.unlogged.Inc()
		}
		return true
	}
	q.mu.Lock()
	if q.allow(e.Time) {
		q.mu.Unlock()
		select {
		case q.ch <- e.clone():
			return true
		default:
			q.drop()
			return false
		}
	}
	k := aggKey{policy: e.Policy, rule: e.Rule, key: e.Key, shadow: e.Shadow}
	if a, ok := q.agg[k]; ok {
		a.count++
		q.agg[k] = a
		q.mu.Unlock()
		return true
	}
	if len(q.agg) >= q.capacity {
		q.mu.Unlock()
		q.drop()
		return false
	}
	e = e.clone()
	q.agg[aggKey{policy: e.Policy, rule: e.Rule, key: e.Key, shadow: e.Shadow}] = aggregate{first: e, count: 1}
	q.mu.Unlock()
	return true
}

func (q *Queue) drop() {
	if q.dropped != nil {
		q.dropped.Inc()
	}
}

// allow takes one line from the budget, refilled at LinesPerSecond up to
// one second's worth. The caller holds q.mu.
func (q *Queue) allow(now time.Time) bool {
	if now.IsZero() {
		now = time.Now()
	}
	if dt := now.Sub(q.last); dt > 0 {
		q.tokens = min(LinesPerSecond, q.tokens+dt.Seconds()*LinesPerSecond)
		q.last = now
	}
	if q.tokens >= 1 {
		q.tokens--
		return true
	}
	return false
}

// clone copies the strings of e that may alias a caller's buffer, the
// client-chosen ones (method and path) clipped to MaxLogged bytes.
func (e Event) clone() Event {
	e.Policy, e.Rule, e.Key = strings.Clone(e.Policy), strings.Clone(e.Rule), strings.Clone(e.Key)
	e.Source, e.Method = strings.Clone(e.Source), strings.Clone(Clip(e.Method))
	e.Path, e.Client = strings.Clone(Clip(e.Path)), strings.Clone(e.Client)
	return e
}

// MaxLogged bounds what the sidecar logs of a value the client chose (a
// path, a method): a request can carry tens of kilobytes of them, and a
// client that is being refused must not be able to write that much log
// per request.
const MaxLogged = 256

// Clip returns s, or its first MaxLogged bytes (cut at a UTF-8 character
// boundary) followed by "...".
func Clip(s string) string {
	if len(s) <= MaxLogged {
		return s
	}
	n := MaxLogged
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// Run writes events until ctx ends, then writes those still queued and
// returns. Call it once.
func (q *Queue) Run(ctx context.Context) {
	defer close(q.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case e := <-q.ch:
			q.write(e, 1)
		case <-tick.C:
			q.flush()
		case <-ctx.Done():
			for {
				select {
				case e := <-q.ch:
					q.write(e, 1)
				default:
					q.flush()
					return
				}
			}
		}
	}
}

// flush writes the summaries of the second that ended.
func (q *Queue) flush() {
	q.mu.Lock()
	if len(q.agg) == 0 {
		q.mu.Unlock()
		return
	}
	agg := q.agg
	q.agg = make(map[aggKey]aggregate, len(agg))
	q.mu.Unlock()
	for _, a := range agg {
		q.write(a.first, a.count)
	}
}

// Done is closed when Run has returned.
func (q *Queue) Done() <-chan struct{} { return q.done }

func (q *Queue) write(e Event, count int64) {
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
		slog.Int64("count", count),
	)
	if q.logged != nil {
		q.logged.Add(float64(count))
	}
}
