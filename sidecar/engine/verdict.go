package engine

import (
	"fmt"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// Outcome is a request's verdict.
type Outcome uint8

// Outcomes.
const (
	Allow Outcome = iota
	Deny
	// Unavailable means a fail-closed rule could not reach the store.
	Unavailable
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	case Unavailable:
		return "unavailable"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Source says where a hit's decision came from.
type Source uint8

// Sources.
const (
	// NotEvaluated: the request was decided before this hit was checked.
	NotEvaluated Source = iota
	// FromStore: the counter store decided.
	FromStore
	// FromDenyCache: the local deny cache denied without a store call.
	FromDenyCache
	// FromFallback: the local fallback bucket decided (store unavailable).
	FromFallback
	// FromNowhere: the store was unavailable and the rule fails closed.
	FromNowhere
	// FromLease: admitted against the key's local lease, tokens already
	// taken from the store, without a store call.
	FromLease
)

// String returns the source's name, as deny events report it.
func (s Source) String() string {
	return [...]string{"none", "store", "local", "fallback", "unavailable", "lease"}[s]
}

// Result is the decision on one hit.
type Result struct {
	limiter.Decision
	Source Source
	// Taken reports that the hit's cost was spent.
	Taken bool
}

// Verdict is the decision on a request.
type Verdict struct {
	Outcome Outcome
	// Results has one entry per hit, in the order of the hits.
	Results []Result
	// Binding is the index of the hit the response headers describe, or -1
	// when no enforced hit was evaluated.
	Binding int
	// RetryAfter is how long the client should wait when the outcome is
	// not Allow.
	RetryAfter time.Duration
	// Wait is, when the outcome is Allow, how long the request waits for
	// the slots its delaying rules reserved (the longest of their
	// Decision.Wait) before it goes on; see Engine.Await.
	Wait time.Duration

	scratch []call // reused store calls
}

func (v *Verdict) reset(n int) {
	v.Outcome, v.Binding, v.RetryAfter, v.Wait = Allow, -1, 0, 0
	if cap(v.Results) < n {
		v.Results = make([]Result, n)
	}
	v.Results = v.Results[:n]
	clear(v.Results)
}

// count records the decisions of the evaluated calls in metrics.
func (e *Engine) count(hits []Hit, v *Verdict) {
	for i, r := range v.Results {
		if r.Source == NotEvaluated || r.Source == FromDenyCache {
			continue
		}
		rm := hits[i].Rule.m
		switch {
		case r.Source == FromNowhere:
			rm.Unavailable.Inc()
		case r.Allowed:
			rm.Allowed.Inc()
		case hits[i].Rule.Shadow:
			rm.ShadowDenied.Inc()
		default:
			rm.Denied.Inc()
		}
	}
}

// conclude sets the outcome and the binding hit from the results.
func (e *Engine) conclude(hits []Hit, v *Verdict) {
	for i, r := range v.Results {
		if hits[i].Rule.Shadow || r.Source == NotEvaluated {
			continue
		}
		switch {
		case r.Source == FromNowhere:
			if v.Outcome != Unavailable {
				v.Outcome, v.Binding, v.RetryAfter = Unavailable, i, r.RetryAfter
			}
		case !r.Allowed:
			if v.Outcome == Allow || (v.Outcome == Deny && r.RetryAfter > v.RetryAfter) {
				v.Outcome, v.Binding, v.RetryAfter = Deny, i, r.RetryAfter
			}
		case v.Outcome == Allow:
			if v.Binding < 0 || binds(hits[i].Rule, r.Decision, hits[v.Binding].Rule, v.Results[v.Binding].Decision) {
				v.Binding = i
			}
			v.Wait = max(v.Wait, r.Wait)
		}
	}
	if v.Outcome != Allow {
		v.Wait = 0
	}
}

// binds reports whether an admitting hit of rule ra with decision a binds
// rather than one of rule rb with decision b: a rule that shows its
// numbers before a quiet one, then the tighter.
func binds(ra *Rule, a limiter.Decision, rb *Rule, b limiter.Decision) bool {
	if ra.Quiet != rb.Quiet {
		return !ra.Quiet
	}
	return tighter(a, b)
}

// tighter reports whether a leaves less room than b.
func tighter(a, b limiter.Decision) bool {
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.Limit < b.Limit
}
