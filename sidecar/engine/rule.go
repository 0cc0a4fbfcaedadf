package engine

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// Rule is one rule as the engine applies it. It is immutable once built.
type Rule struct {
	// Policy and Name identify the rule in metrics, events and headers.
	Policy, Name string
	// Limit is the shared limit.
	Limit limiter.Limit
	// Fallback is the local limit used while the store is unavailable:
	// this replica's share of Limit among the replicas (limiter.Share), so
	// that the replicas together admit at most Limit, however small it is
	// beside their number.
	Fallback limiter.Limit
	// FailClosed makes the request Unavailable, instead of using Fallback,
	// while the store is unavailable.
	FailClosed bool
	// Shadow rules are counted and reported but never deny.
	Shadow bool
	// Quiet rules keep their numbers out of the answers they bind (their
	// responseHeaders is RetryAfter or None). An admitted request's
	// binding hit is a quiet one only when no enforced rule that is not
	// quiet matched it, so that the answer shows the numbers of a rule
	// that shows them, whatever the quiet rules' counts. Set it before
	// the rule decides.
	Quiet bool
	// Waiting counts the requests of this rule that wait for a delayed
	// slot (Limit.MaxDelay) in this sidecar; the front bounds it.
	Waiting atomic.Int64

	params   *limiter.Params
	interval time.Duration // Period / Requests: the refill spacing
	m        *metrics.Rule
	dm       *metrics.DelayRule // a delaying rule's series, or nil
	// Set by Spread: whether hot keys take leases, the sub-counters of a
	// split rule, and the lease and split metrics.
	leases bool
	split  *splitRule
	lm     *metrics.LeaseRule
}

// NewRule validates a rule's limit and derives its fallback limit for the
// given replica count (values below 1 count as 1), as replica 0. Use
// NewSharedRule when the replica knows its place.
func NewRule(policy, name string, lim limiter.Limit, replicas int32, failClosed, shadow bool, m *metrics.Metrics) (*Rule, error) {
	return NewSharedRule(policy, name, lim, limiter.Share{Of: replicas}, failClosed, shadow, m)
}

// NewSharedRule validates a rule's limit and derives its fallback limit:
// replica share.Index's share of lim among share.Of replicas (see
// limiter.Share; Of below 2 means the whole limit).
func NewSharedRule(policy, name string, lim limiter.Limit, share limiter.Share, failClosed, shadow bool, m *metrics.Metrics) (*Rule, error) {
	p, err := limiter.NewParams(lim)
	if err != nil {
		return nil, err
	}
	if lim.Shared() {
		return nil, fmt.Errorf("engine: rule limit %v is already a share", lim)
	}
	fb := lim
	// The fallback never delays (limiter.Share refuses MaxDelay): while
	// the store is unreachable, a delaying rule denies past its share.
	fb.MaxDelay = 0
	if share.Of > 1 {
		fb.Share = share
		if err := fb.Validate(); err != nil {
			return nil, fmt.Errorf("fallback share %d of %d: %w", share.Index, share.Of, err)
		}
	}
	if m == nil {
		return nil, errors.New("engine: nil metrics")
	}
	r := &Rule{Policy: policy, Name: name, Limit: lim, Fallback: fb, FailClosed: failClosed, Shadow: shadow,
		params: p, interval: lim.Period / time.Duration(lim.Requests), m: m.ForRule(policy, name)}
	if r.Delays() {
		r.dm = m.ForDelayRule(policy, name)
	}
	return r, nil
}

// Delays reports whether the rule delays requests over its limit instead
// of denying them (Limit.MaxDelay; a rule's onExceed: Delay).
func (r *Rule) Delays() bool { return r.Limit.MaxDelay > 0 }

// Hit is a rule that matched a request, with the request's counter key and
// cost under that rule.
type Hit struct {
	Rule *Rule
	Key  string
	Cost int64
}
