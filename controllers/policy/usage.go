package policy

import (
	"time"

	"sigs.k8s.io/controller-runtime/pkg/event"
)

// RuleCounts are one rule's decisions over a recent window, summed over
// the pods that enforce it.
type RuleCounts struct {
	// Denied counts denials of an enforced rule.
	Denied int64
	// ShadowDenied counts the requests a Shadow rule would have denied.
	ShadowDenied int64
	// Exempt counts requests the rule left alone as exempt.
	Exempt int64
}

// PolicyUsage is what a policy's rules did over a recent window.
type PolicyUsage struct {
	// Window is the span the counts cover, at most.
	Window time.Duration
	// Pods is the number of pods whose counters were read.
	Pods int32
	// Rules holds the counts by rule name.
	Rules map[string]RuleCounts
}

// UsageSource supplies the usage of policies, gathered off the decision
// path (package usage reads the sidecars' counters).
type UsageSource interface {
	// For returns the usage of the policy namespace/name, or nil when
	// none is known yet.
	For(namespace, name string) *PolicyUsage
	// Updates delivers an event, whose object names a namespace, whenever
	// the usage of a policy of that namespace changes.
	Updates() <-chan event.GenericEvent
}

// usageOf returns the usage of the policy namespace/name from u, which
// may be nil.
func usageOf(u UsageSource, namespace, name string) *PolicyUsage {
	if u == nil {
		return nil
	}
	return u.For(namespace, name)
}
