package engine

import (
	"errors"
	"fmt"
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
	// Limit with Requests and Burst divided by the replica count.
	Fallback limiter.Limit
	// FailClosed makes the request Unavailable, instead of using Fallback,
	// while the store is unavailable.
	FailClosed bool
	// Shadow rules are counted and reported but never deny.
	Shadow bool

	params   *limiter.Params
	interval time.Duration // Period / Requests: the refill spacing
	m        *metrics.Rule
	// Set by Spread: whether hot keys take leases, the sub-counters of a
	// split rule, and the lease and split metrics.
	leases bool
	split  *splitRule
	lm     *metrics.LeaseRule
}

// NewRule validates a rule's limit and derives its fallback limit for the
// given replica count (values below 1 count as 1).
func NewRule(policy, name string, lim limiter.Limit, replicas int32, failClosed, shadow bool, m *metrics.Metrics) (*Rule, error) {
	p, err := limiter.NewParams(lim)
	if err != nil {
		return nil, err
	}
	fb := lim
	if replicas > 1 {
		fb.Requests = max(1, lim.Requests/int64(replicas))
		if lim.Burst > 0 {
			fb.Burst = max(1, lim.Burst/int64(replicas))
		}
		if err := fb.Validate(); err != nil {
			return nil, fmt.Errorf("fallback limit %v for %d replicas: %w", fb, replicas, err)
		}
	}
	if m == nil {
		return nil, errors.New("engine: nil metrics")
	}
	return &Rule{Policy: policy, Name: name, Limit: lim, Fallback: fb, FailClosed: failClosed, Shadow: shadow,
		params: p, interval: lim.Period / time.Duration(lim.Requests), m: m.ForRule(policy, name)}, nil
}

// Hit is a rule that matched a request, with the request's counter key and
// cost under that rule.
type Hit struct {
	Rule *Rule
	Key  string
	Cost int64
}
