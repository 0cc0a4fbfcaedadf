package kubesource

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// ConditionPolicyLoaded is the pod condition the sidecar reports, and the
// readiness gate the injection webhook adds to every pod it injects. It is
// True while a policy document is in force, so that a pod joins its
// Services only once its sidecar enforces something, and never leaves them
// because a later document was rejected (the last good one stays in
// force).
//
// When the reason is ReasonLoaded, the message is exactly the revision in
// force: floodgate-manager compares it with the ConfigMap's revision to
// count the pods that enforce a policy (status.enforcingPods) and to set
// its Programmed condition.
const ConditionPolicyLoaded corev1.PodConditionType = "floodgate.dev/policy-loaded"

// Reasons of ConditionPolicyLoaded.
const (
	// ReasonLoaded (True): the latest document of the ConfigMap is in
	// force; the message is its revision.
	ReasonLoaded = "Loaded"
	// ReasonRevisionRejected (True): the latest document was rejected and
	// an earlier revision stays in force.
	ReasonRevisionRejected = "RevisionRejected"
	// ReasonConfigMapDeleted (True): the ConfigMap was deleted; the
	// revision in force keeps running for the deletion grace period, in
	// case the ConfigMap is being recreated.
	ReasonConfigMapDeleted = "ConfigMapDeleted"
	// ReasonNoPolicies (True): the ConfigMap stayed deleted past the grace
	// period, so the sidecar enforces no policy and proxies every request.
	ReasonNoPolicies = "NoPolicies"
	// ReasonWaitingForConfigMap (False): no document has been in force
	// yet because the ConfigMap does not exist.
	ReasonWaitingForConfigMap = "WaitingForConfigMap"
	// ReasonRejected (False): the document was rejected and no earlier
	// one is in force.
	ReasonRejected = "Rejected"
)

// maxMessage bounds a condition message; a rejection error can be long.
const maxMessage = 1024

// state is what the source knows about the ConfigMap and the runner. It is
// owned by the source's Run goroutine.
type state struct {
	// synced is set once the informer has listed the ConfigMap (or found
	// none), so an absence is a fact rather than an unknown.
	synced bool
	// present reports whether the ConfigMap exists.
	present bool
	// seen is the revision of the last document delivered from the
	// ConfigMap; empty when unknown.
	seen string
	// inForce is the revision the runner has in force; empty when none.
	inForce string
	// lastErr is why the last delivered update was rejected; empty when
	// it was applied.
	lastErr string
	// emptied is set when inForce is the empty document applied after
	// the ConfigMap stayed deleted past the grace period.
	emptied bool
}

// condition is a pod condition without its timestamps.
type condition struct {
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

// desired returns the condition that describes s, or false when there is
// nothing to report yet (the informer has not synced and nothing was
// delivered). It is pure.
func desired(s state, namespace string, grace time.Duration) (condition, bool) {
	cm := namespace + "/" + config.ConfigMapName
	var c condition
	switch {
	case s.inForce == "" && s.lastErr != "":
		c = condition{corev1.ConditionFalse, ReasonRejected,
			fmt.Sprintf("revision %s of ConfigMap %s was rejected and no earlier revision is in force: %s", orUnknown(s.seen), cm, s.lastErr)}
	case s.inForce == "":
		if !s.synced || s.present {
			return condition{}, false
		}
		c = condition{corev1.ConditionFalse, ReasonWaitingForConfigMap,
			fmt.Sprintf("waiting for ConfigMap %s, which floodgate-manager writes once a RateLimitPolicy of the namespace is accepted and its CounterStore is ready", cm)}
	case s.emptied:
		c = condition{corev1.ConditionTrue, ReasonNoPolicies,
			fmt.Sprintf("ConfigMap %s stayed deleted for %v, so no policy is enforced", cm, grace)}
	case !s.present:
		c = condition{corev1.ConditionTrue, ReasonConfigMapDeleted,
			fmt.Sprintf("ConfigMap %s was deleted; revision %s stays in force for %v in case it is recreated", cm, s.inForce, grace)}
	case s.lastErr != "":
		c = condition{corev1.ConditionTrue, ReasonRevisionRejected,
			fmt.Sprintf("revision %s stays in force: revision %s was rejected: %s", s.inForce, orUnknown(s.seen), s.lastErr)}
	default:
		c = condition{corev1.ConditionTrue, ReasonLoaded, s.inForce}
	}
	c.Message = truncate(c.Message, maxMessage)
	return c, true
}

func orUnknown(rev string) string {
	if rev == "" {
		return "(unknown)"
	}
	return rev
}

// truncate shortens s to at most n bytes without splitting a rune.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "..."
	cut := n - len(ellipsis)
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + ellipsis
}
