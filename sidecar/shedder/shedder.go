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
// only once nothing else is admitted.
//
// The critical reserve is the larger of reserved.critical (a percentage of
// the limit) and what the Critical requests need: their measured
// concurrency (the Critical requests in flight and waiting, averaged over
// each window, rising at once and falling slowly) plus two standard
// deviations of a Poisson arrival process, so that a burst of them finds
// room. A percentage of a small limit is only a few slots, which a
// burst of Critical requests overflows while the lower classes hold the
// rest; the measured reserve follows the Critical load instead, and the
// lower classes get what it leaves.
//
// Critical requests are held to the limit among themselves: the lower
// requests already in flight cannot be taken back, so a Critical request
// does not wait behind them. One that finds the Critical requests alone
// filling the limit waits for the next one to leave, for at most the
// baseline latency (see AdmitWait); while one waits, no lower priority is
// admitted. It is shed only when no place frees in that time.
//
// A shed request never reaches the application: the front answers 503 with
// Retry-After.
//
// A Shedder is safe for concurrent use.
package shedder

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
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
	// inFlightBy counts inFlight by priority.
	inFlightBy [numPriorities]atomic.Int64
	// shares are the in-flight bounds of the priorities.
	shares [numPriorities]atomic.Int64
	// waiting is len(waiters), read without the lock; maxWait is how long
	// a Critical request may wait, in nanoseconds.
	waiting atomic.Int64
	maxWait atomic.Int64

	mu       sync.Mutex // guards what follows
	vegas    *Vegas
	reserves [2]int // critical, default percent
	win      windowAcc
	// demand is the Critical requests' measured concurrency.
	demand  float64
	waiters []*Waiter // Critical requests waiting for a place, oldest first

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
	critical    int64 // Critical requests in flight or waiting, summed over the answers
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

// Waiting bounds: a Critical request waits for at most the baseline
// latency, within these.
const (
	minWait     = 2 * time.Millisecond
	maxWait     = 100 * time.Millisecond
	initialWait = 10 * time.Millisecond
)

// publishLocked sets the priorities' shares from the limit in force and
// the metrics' gauges. s.mu is held.
func (s *Shedder) publishLocked() {
	limit := s.vegas.Limit()
	shares, reserve := Shares(limit, s.reserves[0], s.reserves[1], s.demand)
	for p := range numPriorities {
		s.shares[p].Store(shares[p])
	}
	wait := initialWait
	if b := s.vegas.Baseline(); b > 0 {
		wait = min(max(b, minWait), maxWait)
	}
	s.maxWait.Store(int64(wait))
	s.m.SheddingLimit.Set(limit)
	s.m.SheddingCriticalReserve.Set(reserve)
	s.m.SheddingInFlight.Set(float64(s.inFlight.Load()))
	s.m.SheddingBaseline.Set(s.vegas.Baseline().Seconds())
	s.m.SheddingLatency.Set(s.vegas.Latest().Seconds())
}

// Shares returns the in-flight bound of each priority, indexed by
// Priority, under limit, and the critical reserve: the larger of
// criticalPct percent of the limit and demand, the Critical requests'
// measured concurrency, with room for its bursts (two standard deviations
// of a Poisson count of that mean, plus one). Critical may fill the limit;
// Default the limit less the critical reserve; Sheddable that less
// defaultPct percent of the limit. The bounds never increase from Critical
// down to Sheddable, which is what makes a lower priority shed first; only
// Critical's is at least 1. It is a pure function.
func Shares(limit float64, criticalPct, defaultPct int, demand float64) (shares [3]int64, criticalReserve float64) {
	limit = math.Max(1, limit)
	criticalReserve = limit * float64(criticalPct) / 100
	if demand > 0 {
		criticalReserve = math.Max(criticalReserve, demand+2*math.Sqrt(demand)+1)
	}
	crit := math.Floor(limit)
	deflt := math.Min(crit, math.Max(0, math.Floor(limit-criticalReserve)))
	shed := math.Min(deflt, math.Max(0, math.Floor(limit-criticalReserve-limit*float64(defaultPct)/100)))
	return [3]int64{Sheddable: int64(shed), Default: int64(deflt), Critical: int64(crit)}, criticalReserve
}

// nextDemand is the Critical demand after a window whose mean Critical
// concurrency was mean: it rises at once and falls by a fifth of the gap
// per window, so a lull does not give the reserve away before a burst.
func nextDemand(demand, mean float64) float64 {
	if mean >= demand {
		return mean
	}
	return demand - (demand-mean)/5
}

// Current returns the in-flight bound of each priority, indexed by
// Priority, and the requests in flight.
func (s *Shedder) Current() (shares [3]int64, inFlight int64) {
	for p := range numPriorities {
		shares[p] = s.shares[p].Load()
	}
	return shares, s.inFlight.Load()
}

// Admits reports whether a request of priority p could be admitted now,
// counting nothing: the check a front makes before it spends anything on
// the request's rules. It is true while the shedder is off or in Shadow
// mode, and for Critical, which may wait for a place (AdmitWait).
func (s *Shedder) Admits(p Priority) bool {
	if !s.enabled.Load() || s.shadow.Load() || p >= Critical {
		return true
	}
	return admits(p, s.inFlight.Load(), s.inFlightBy[Critical].Load(), s.shares[p].Load(), s.waiting.Load())
}

// admits is the admission rule: a request below Critical goes in while the
// requests in flight, all priorities together, are under its share and no
// Critical request waits; a Critical request while the Critical requests
// in flight are under the limit (its share), whatever the lower ones hold:
// the lower requests already in flight cannot be taken back, so a
// Critical request never waits behind them. It is a pure function.
func admits(p Priority, inFlight, critical, share, waiting int64) bool {
	if p >= Critical {
		return critical < share
	}
	return inFlight < share && waiting == 0
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
	prio     Priority
	held     bool
}

// Held reports whether the ticket holds a place that Done must give back.
func (t Ticket) Held() bool { return t.held }

// Admit admits a request of priority p, or sheds it, without waiting: ok
// is false when the requests in flight reach p's share (or, below
// Critical, a Critical request waits). A shed request is counted; an
// admitted one holds a place until Done. In Shadow mode every request is
// admitted, and those that would have been shed are counted as such.
func (s *Shedder) Admit(p Priority) (t Ticket, ok bool) {
	if !s.enabled.Load() || p >= numPriorities {
		return Ticket{}, true
	}
	t, ok = s.admitNow(p)
	if !ok {
		s.shed[p][0].Inc()
	}
	return t, ok
}

// admitNow takes a place for p when admits says so, or always in Shadow
// mode; it counts admissions, not refusals.
func (s *Shedder) admitNow(p Priority) (Ticket, bool) {
	share := s.shares[p].Load()
	shadow := s.shadow.Load()
	for {
		cur, crit := s.inFlight.Load(), s.inFlightBy[Critical].Load()
		over := !admits(p, cur, crit, share, s.waiting.Load())
		if over && !shadow {
			return Ticket{}, false
		}
		// Critical is held to its own count, the others to the total.
		ok := false
		if p >= Critical {
			if ok = s.inFlightBy[Critical].CompareAndSwap(crit, crit+1); ok {
				cur = s.inFlight.Add(1) - 1
			}
		} else if ok = s.inFlight.CompareAndSwap(cur, cur+1); ok {
			s.inFlightBy[p].Add(1)
		}
		if ok {
			if over {
				s.shed[p][1].Inc()
			}
			return s.took(p, cur+1), true
		}
	}
}

// took counts an admission of p, in flight with inFlight others, and
// returns its ticket.
func (s *Shedder) took(p Priority, inFlight int64) Ticket {
	s.admitted[p].Inc()
	return Ticket{start: s.now(), inFlight: inFlight, prio: p, held: true}
}

// Waiter is a Critical request waiting for a place. Its channel Ready is
// closed when Done hands it one; Cancel ends the wait.
type Waiter struct {
	ready  chan struct{}
	ticket Ticket
	handed bool // guarded by the Shedder's mu
}

// Ready is closed once the waiter holds a place.
func (w *Waiter) Ready() <-chan struct{} { return w.ready }

// Enqueue queues a Critical request that Admit refused: the next request
// to leave hands it its place, before any lower priority can take it.
// When a place is free already, the returned Waiter holds it (Ready is
// closed). Only Critical requests wait; for another priority Enqueue
// returns nil.
func (s *Shedder) Enqueue(p Priority) *Waiter {
	if p != Critical || !s.enabled.Load() {
		return nil
	}
	w := &Waiter{ready: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.admitNow(p); ok {
		w.ticket, w.handed = t, true
		close(w.ready)
		return w
	}
	s.waiters = append(s.waiters, w)
	s.waiting.Store(int64(len(s.waiters)))
	return w
}

// Cancel ends w's wait. It returns the ticket and true when w was handed a
// place (which the caller then holds until Done), or false when it was
// not: the request is shed, and counted.
func (s *Shedder) Cancel(w *Waiter) (Ticket, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.handed {
		return w.ticket, true
	}
	if i := slices.Index(s.waiters, w); i >= 0 {
		s.waiters = slices.Delete(s.waiters, i, i+1)
		s.waiting.Store(int64(len(s.waiters)))
	}
	s.shed[Critical][0].Inc()
	return Ticket{}, false
}

// handOffLocked gives the places free under Critical's share to the
// waiters, oldest first. s.mu is held.
func (s *Shedder) handOffLocked() {
	share := s.shares[Critical].Load()
	for len(s.waiters) > 0 {
		crit := s.inFlightBy[Critical].Load()
		if crit >= share {
			return
		}
		if !s.inFlightBy[Critical].CompareAndSwap(crit, crit+1) {
			continue
		}
		cur := s.inFlight.Add(1)
		w := s.waiters[0]
		s.waiters[0] = nil
		s.waiters = s.waiters[1:]
		s.waiting.Store(int64(len(s.waiters)))
		w.ticket, w.handed = s.took(Critical, cur), true
		close(w.ready)
	}
}

// AdmitWait admits a request of priority p as Admit does, except that a
// Critical request that finds no place waits for one, for at most the
// baseline latency (2ms to 100ms; 10ms before the first window) or until
// ctx ends, and is shed only then.
func (s *Shedder) AdmitWait(ctx context.Context, p Priority) (Ticket, bool) {
	if !s.enabled.Load() || p >= numPriorities {
		return Ticket{}, true
	}
	if t, ok := s.admitNow(p); ok {
		return t, true
	}
	w := s.Enqueue(p)
	if w == nil {
		s.shed[p][0].Inc()
		return Ticket{}, false
	}
	select {
	case <-w.ready:
		return s.Cancel(w)
	default:
	}
	timer := time.NewTimer(time.Duration(s.maxWait.Load()))
	defer timer.Stop()
	select {
	case <-w.ready:
	case <-timer.C:
	case <-ctx.Done():
	}
	return s.Cancel(w)
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
	s.inFlightBy[t.prio].Add(-1)
	if !answered {
		if s.waiting.Load() > 0 {
			s.mu.Lock()
			s.handOffLocked()
			s.mu.Unlock()
		}
		return
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handOffLocked()
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
	w.critical += s.inFlightBy[Critical].Load() + int64(len(s.waiters))
	if w.n < windowSamples || now.Sub(w.start) < windowLength {
		return
	}
	s.vegas.Update(Window{End: now, Samples: w.n, MeanLatency: w.latency / time.Duration(w.n),
		MeanInFlight: float64(w.inFlight) / float64(w.n), MaxInFlight: w.maxInFlight})
	s.demand = nextDemand(s.demand, float64(w.critical)/float64(w.n))
	*w = windowAcc{start: now}
	s.publishLocked()
	s.handOffLocked()
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
