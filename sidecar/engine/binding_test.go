package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// An admitted request's answer describes a rule that shows its numbers
// rather than a quiet one (responseHeaders RetryAfter or None), however
// much tighter the quiet one is; among rules alike, the tighter binds; a
// refusal is bound by the refusing rule, quiet or not.
func TestBindingPrefersARuleThatShowsItsNumbers(t *testing.T) {
	t.Parallel()
	e, m := newMemoryEngine(t)
	rule := func(name string, requests int64, quiet bool) *engine.Rule {
		r := newRule(t, m, name, limiter.Limit{Algorithm: limiter.FixedWindow, Requests: requests, Period: time.Hour})
		r.Quiet = quiet
		return r
	}
	loose, tightShown, tightQuiet := rule("loose", 100, false), rule("tight-shown", 10, false), rule("tight-quiet", 2, true)
	decide := func(hits ...engine.Hit) engine.Verdict {
		var v engine.Verdict
		e.Decide(context.Background(), hits, &v)
		return v
	}
	// A quiet rule tighter than a shown one: the shown one binds.
	v := decide(engine.Hit{Rule: tightQuiet, Key: "q1", Cost: 1}, engine.Hit{Rule: loose, Key: "l1", Cost: 1})
	if v.Outcome != engine.Allow || v.Binding != 1 {
		t.Fatalf("quiet tighter rule and a shown one: %v bound by hit %d, want allow bound by the shown rule (1)", v.Outcome, v.Binding)
	}
	// Two shown rules: the tighter binds.
	v = decide(engine.Hit{Rule: loose, Key: "l2", Cost: 1}, engine.Hit{Rule: tightShown, Key: "s2", Cost: 1})
	if v.Outcome != engine.Allow || v.Binding != 1 {
		t.Fatalf("two shown rules: %v bound by hit %d, want allow bound by the tighter (1)", v.Outcome, v.Binding)
	}
	// The quiet rule refuses once spent: it binds the refusal.
	for range 2 {
		decide(engine.Hit{Rule: tightQuiet, Key: "q3", Cost: 1})
	}
	v = decide(engine.Hit{Rule: loose, Key: "l3", Cost: 1}, engine.Hit{Rule: tightQuiet, Key: "q3", Cost: 1})
	if v.Outcome != engine.Deny || v.Binding != 1 {
		t.Fatalf("a spent quiet rule: %v bound by hit %d, want deny bound by the quiet rule (1)", v.Outcome, v.Binding)
	}
}
