package limiter

import (
	"fmt"
	"sync"
	"time"
)

// Limiter applies one Limit to a single key, in the style of
// golang.org/x/time/rate.Limiter: time is a parameter. It is what the
// stores do per key, without a key index. The methods of a Limiter are safe
// for concurrent use.
type Limiter struct {
	mu sync.Mutex
	p  *Params // the limit in force
	sp *Params // the limit s was written under
	s  State
	lg Log
}

// New returns a Limiter for l with a full (unused) state.
func New(l Limit) (*Limiter, error) {
	p, err := NewParams(l)
	if err != nil {
		return nil, err
	}
	return &Limiter{p: p, sp: p}, nil
}

// Limit returns the limit in force.
func (lim *Limiter) Limit() Limit {
	lim.mu.Lock()
	defer lim.mu.Unlock()
	return lim.p.Limit
}

// SetLimit changes the limit and keeps the state, converting it as
// ALGORITHMS.md describes (counters survive limit edits). A change of
// algorithm starts afresh.
func (lim *Limiter) SetLimit(l Limit) error {
	p, err := NewParams(l)
	if err != nil {
		return err
	}
	lim.mu.Lock()
	defer lim.mu.Unlock()
	if l.Algorithm != lim.p.Limit.Algorithm {
		lim.s, lim.lg, lim.sp = State{}, Log{}, p
	}
	lim.p = p
	return nil
}

// Allow is AllowN(t, 1).
func (lim *Limiter) Allow(t time.Time) (Decision, error) {
	return lim.AllowN(t, 1)
}

// AllowN decides a request of cost n at time t. A cost of 0 is a peek: it
// is allowed exactly when a cost of 1 would be (on a deny it reports the
// wait a cost of 1 would get), and it changes nothing. An error is
// returned only for a negative cost or a time outside [the epoch, 2^53 µs
// after it).
func (lim *Limiter) AllowN(t time.Time, n int64) (Decision, error) {
	lim.mu.Lock()
	defer lim.mu.Unlock()
	var d Decision
	var err error
	if lim.p.Limit.Algorithm == SlidingLog && !lim.p.Limit.Shared() {
		d, _, err = lim.p.TakeLog(&lim.lg, Micros(t), n)
	} else {
		var write bool
		d, write, err = lim.p.Take(&lim.s, lim.sp, Micros(t), n)
		if write {
			lim.sp = lim.p
		}
	}
	if err != nil {
		return Decision{}, fmt.Errorf("allow %d at %v: %w", n, t, err)
	}
	return d, nil
}
