package envoyrls

import (
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// headers builds the response fields of the call's binding rule, as the
// HTTP proxy sets them (package ratelimitheaders): the first enforced rule
// that denies every call when one matched, else the engine's binding hit;
// only those its mode (responseHeaders) sends.
func (s *Server) headers(sc *scratch, v *engine.Verdict, blocked bool, now time.Time) []*corev3.HeaderValue {
	var b ratelimitheaders.Binding
	switch {
	case blocked:
		found := false
		for _, bh := range sc.blocks {
			if !bh.rule.Shadow {
				b, found = blockBinding(bh.rule, now), true
				break
			}
		}
		if !found {
			// Only a rejected request: no rule to describe.
			return nil
		}
	case v.Binding >= 0:
		r := sc.hrule[v.Binding]
		b = ratelimitheaders.Bind(r.PolicyName, r.Limit, r.Fields, v.Results[v.Binding].Decision, v.Outcome != engine.Allow)
	default:
		return nil
	}
	vals := ratelimitheaders.Format(&b)
	// The values share one string, the header values one array.
	lo, hi := vals.Span()
	if lo == hi {
		return nil
	}
	hv := make([]corev3.HeaderValue, hi-lo)
	out := make([]*corev3.HeaderValue, hi-lo)
	for i := range hv {
		f := lo + ratelimitheaders.Field(i)
		hv[i].Key, hv[i].Value = ratelimitheaders.Names[f], vals.Get(f)
		out[i] = &hv[i]
	}
	return out
}

// blockBinding is the binding of a rule that denies every call: nothing
// remains until the end of its window.
func blockBinding(r *ruleset.DescriptorRule, now time.Time) ratelimitheaders.Binding {
	left := windowLeft(r, now)
	return ratelimitheaders.Bind(r.PolicyName, r.Limit, r.Fields,
		limiter.Decision{Limit: r.Limit.Capacity(), ResetAfter: left, RetryAfter: left}, true)
}
