package engine

import (
	"context"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// fallBack decides c, whose store call has failed, by the rule's failure
// mode: a rule that fails closed makes the request Unavailable; any other
// takes from its local fallback, Rule.Fallback (this replica's share of
// the limit).
func (e *Engine) fallBack(ctx context.Context, h *Hit, c *call) {
	r := h.Rule
	if r.FailClosed {
		c.res = Result{Decision: limiter.Decision{Limit: r.Limit.Capacity(), RetryAfter: UnavailableRetryAfter}, Source: FromNowhere}
		return
	}
	d, _, err := e.o.Fallback.Take(ctx, limiter.Request{Key: h.Key, Limit: r.Fallback, Cost: c.cost})
	if err != nil {
		// The local store failing is a bug; admit rather than block on it.
		c.res = Result{Decision: limiter.Decision{Allowed: true, Limit: r.Limit.Capacity()}, Source: FromFallback}
		return
	}
	c.res = Result{Decision: d, Source: FromFallback, Taken: d.Allowed && c.cost > 0}
	if c.cost > 0 {
		if d.Allowed {
			r.m.FallbackAllowed.Inc()
		} else {
			r.m.FallbackDenied.Inc()
		}
	}
}
