// Package shedder is floodgate-sidecar's priority load shedder: it keeps
// the requests in flight to the application under an adaptive limit and,
// past it, sheds the least important requests first.
//
// # The limit
//
// The sidecar sees every request its application serves, so it measures
// the application from outside: the requests in flight to it, and the time
// from sending each request to receiving its response head. Over sampling
// windows (100ms and at least 10 answers) a Vegas controller (vegas.go)
// moves the limit so that a short queue forms in the application and no
// more: the application stays busy, and its latency stays near the
// baseline it learns. A request counts as in flight from its admission to
// its response head, as in Envoy's adaptive-concurrency filter: a
// WebSocket or a stream is the application's work until it answers, not
// for as long as it stays open.
//
// # Classes
//
// Every request has a priority, Critical, Default or Sheddable (rules
// assign them; the rest are Default). Each priority may fill the limit up
// to its own share: Critical all of it, Default all but the critical
// reserve, Sheddable all but the critical and default reserves. A request
// is shed when the requests in flight already reach its priority's share.
// The shares are ordered, so at any instant a request of a higher priority
// is shed only when every lower one would be too: under overload the
// Sheddable requests go first, then the Default ones, and Critical ones
// only once nothing else is admitted. The reserves are also the headroom
// that keeps Critical requests in while the lower classes fill the rest.
//
// A shed request never reaches the application: the front answers 503 with
// Retry-After.
//
// A Shedder is safe for concurrent use.
package shedder

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// Priority is a request class, from the least to the most important.
type Priority uint8

// The priorities.
const (
	Sheddable Priority = iota
	Default
	Critical
	numPriorities
)

// String returns the priority's name, as policies write it.
func (p Priority) String() string {
	switch p {
	case Sheddable:
		return metrics.PrioritySheddable
	case Default:
		return metrics.PriorityDefault
	case Critical:
		return metrics.PriorityCritical
	}
	return fmt.Sprintf("Priority(%d)", uint8(p))
}

// ParsePriority returns the priority a policy names; "" is Default.
func ParsePriority(s string) (Priority, error) {
	switch s {
	case "", metrics.PriorityDefault:
		return Default, nil
	case metrics.PriorityCritical:
		return Critical, nil
	case metrics.PrioritySheddable:
		return Sheddable, nil
	}
	return 0, fmt.Errorf("unknown priority %q: want Critical, Default or Sheddable", s)
}

// RetryAfter is the Retry-After of a shed request.
const RetryAfter = time.Second

// Config configures a Shedder.
type Config struct {
	// Shadow counts the requests that would be shed and sheds none.
	Shadow bool
	// CriticalReserve is the percentage of the limit only Critical
	// requests may use; DefaultReserve the further percentage Sheddable
	// requests may not use. Their sum is at most 90.
	CriticalReserve, DefaultReserve int
	// MinLimit and MaxLimit bound the adaptive limit.
	MinLimit, MaxLimit int
}

// Sampling windows: a window closes at the first answer after it has
// lasted windowLength and holds windowSamples answers.
const (
	windowLength  = 100 * time.Millisecond
	windowSamples = 10
)

// Shedder is a priority load shedder. The zero value is not usable; create
// one with New. Until Configure gives it a Config it admits everything and
// measures nothing.
type Shedder struct {
	now func() time.Time

	enabled  atomic.Bool
	shadow   atomic.Bool
	inFlight atomic.Int64
	// shares are the in-flight bounds of the priorities.
	shares [numPriorities]atomic.Int64

	mu       sync.Mutex // guards what follows
	vegas    *Vegas
	reserves [2]int // critical, default percent
	win      windowAcc

	m        *metrics.Metrics
	shed     [numPriorities][2]prometheus.Counter // enforce, shadow
	admitted [numPriorities]prometheus.Counter
}

// windowAcc accumulates the current window.
type windowAcc struct {
	start       time.Time
	n           int
	latency     time.Duration
	inFlight    int64
	maxInFlight int64
}

// New returns a Shedder that reports to m. now is its clock; nil means
// time.Now.
func New(m *metrics.Metrics, now func() time.Time) *Shedder {
	if now == nil {
		now = time.Now
	}
	s := &Shedder{now: now, m: m}
	for p := range numPriorities {
		s.shed[p][0] = m.ShedTotal.WithLabelValues(p.String(), "enforce")
		s.shed[p][1] = m.ShedTotal.WithLabelValues(p.String(), "shadow")
		s.admitted[p] = m.ShedderAdmittedTotal.WithLabelValues(p.String())
	}
	return s
}

// Configure applies c; nil turns the shedder off. What the shedder has
// learned (the limit, the baseline) is kept across changes.
func (s *Shedder) Configure(c *Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c == nil {
		s.enabled.Store(false)
		return
	}
	if s.vegas == nil {
		s.vegas = NewVegas(VegasConfig{MinLimit: float64(c.MinLimit), MaxLimit: float64(c.MaxLimit),
			Jitter: func() float64 { return 0.9 + 0.2*rand.Float64() }})
	} else {
		s.vegas.SetBounds(float64(c.MinLimit), float64(c.MaxLimit))
	}
	s.reserves = [2]int{c.CriticalReserve, c.DefaultReserve}
	s.shadow.Store(c.Shadow)
	s.publishLocked()
	s.enabled.Store(true)
}

// Enabled reports whether a Config is in force.
func (s *Shedder) Enabled() bool { return s.enabled.Load() }

// publishLocked sets the priorities' shares from the limit in force and
// the metrics' gauges. s.mu is held.
func (s *Shedder) publishLocked() {
	limit := s.vegas.Limit()
	critical, deflt := float64(s.reserves[0])/100, float64(s.reserves[1])/100
	shares := [numPriorities]int64{
		Critical:  int64(math.Max(1, math.Floor(limit))),
		Default:   int64(math.Max(1, math.Floor(limit*(1-critical)))),
		Sheddable: int64(math.Max(1, math.Floor(limit*(1-critical-deflt)))),
	}
	for p := range numPriorities {
		s.shares[p].Store(shares[p])
	}
	s.m.SheddingLimit.Set(limit)
	s.m.SheddingInFlight.Set(float64(s.inFlight.Load()))
	s.m.SheddingBaseline.Set(s.vegas.Baseline().Seconds())
	s.m.SheddingLatency.Set(s.vegas.Latest().Seconds())
}

// Shares returns the in-flight bound of each priority, indexed by
// Priority, and the requests in flight.
func (s *Shedder) Shares() (shares [3]int64, inFlight int64) {
	for p := range numPriorities {
		shares[p] = s.shares[p].Load()
	}
	return shares, s.inFlight.Load()
}

// Admits reports whether a request of priority p would be admitted now,
// counting nothing: the check a front makes before it spends anything on
// the request's rules. It is true while the shedder is off or in Shadow
// mode.
func (s *Shedder) Admits(p Priority) bool {
	if !s.enabled.Load() || s.shadow.Load() {
		return true
	}
	return s.inFlight.Load() < s.shares[p].Load()
}

// CountShed counts a request of priority p that a front shed after Admits
// said no.
func (s *Shedder) CountShed(p Priority) {
	if p < numPriorities {
		s.shed[p][0].Inc()
	}
}

// Ticket is an admitted request's place in flight. The zero Ticket is
// that of a request admitted while the shedder was off.
type Ticket struct {
	start    time.Time
	inFlight int64 // in flight at admission, this request included
	held     bool
}

// Held reports whether the ticket holds a place that Done must give back.
func (t Ticket) Held() bool { return t.held }

// Admit admits a request of priority p, or sheds it: ok is false when the
// requests in flight reach p's share. A shed request is counted; an
// admitted one holds a place until Done. In Shadow mode every request is
// admitted, and those that would have been shed are counted as such.
func (s *Shedder) Admit(p Priority) (t Ticket, ok bool) {
	if !s.enabled.Load() || p >= numPriorities {
		return Ticket{}, true
	}
	limit := s.shares[p].Load()
	shadow := s.shadow.Load()
	for {
		cur := s.inFlight.Load()
		over := cur >= limit
		if over && !shadow {
			s.shed[p][0].Inc()
			return Ticket{}, false
		}
		if s.inFlight.CompareAndSwap(cur, cur+1) {
			if over {
				s.shed[p][1].Inc()
			}
			s.admitted[p].Inc()
			return Ticket{start: s.now(), inFlight: cur + 1, held: true}, true
		}
	}
}

// Done ends an admitted request: its response head arrived (answered), or
// it ended without one (the application failed, the client went away).
// Only answered requests are latency samples. Done on a ticket that holds
// nothing does nothing.
func (s *Shedder) Done(t *Ticket, answered bool) {
	if !t.held {
		return
	}
	t.held = false
	s.inFlight.Add(-1)
	if !answered {
		return
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vegas == nil {
		return
	}
	w := &s.win
	if w.start.IsZero() {
		w.start = now
	}
	w.n++
	w.latency += now.Sub(t.start)
	w.inFlight += t.inFlight
	w.maxInFlight = max(w.maxInFlight, t.inFlight)
	if w.n < windowSamples || now.Sub(w.start) < windowLength {
		return
	}
	s.vegas.Update(Window{End: now, Samples: w.n, MeanLatency: w.latency / time.Duration(w.n),
		MeanInFlight: float64(w.inFlight) / float64(w.n), MaxInFlight: w.maxInFlight})
	*w = windowAcc{start: now}
	s.publishLocked()
}

// Limit returns the limit in force and the baseline latency.
func (s *Shedder) Limit() (limit float64, baseline time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vegas == nil {
		return 0, 0
	}
	return s.vegas.Limit(), s.vegas.Baseline()
}
