package kubesource

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/floodgate-dev/floodgate/internal/message"
	"github.com/floodgate-dev/floodgate/sidecar/config"
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
	// failed names the policies of inForce that the sidecar could not
	// compile and does not enforce.
	failed []string
}

// condition is a pod condition without its timestamps.
type condition struct {
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

// desired returns the condition that describes s, or false when there is
// nothing to report yet (the informer has not synced and nothing was
// delivered); cm is the ConfigMap, namespace/name. It is pure.
func desired(s state, cm string, grace time.Duration) (condition, bool) {
	var c condition
	switch {
	case s.inForce == "" && s.lastErr != "":
		c = condition{corev1.ConditionFalse, config.ReasonRejected,
			fmt.Sprintf("revision %s of ConfigMap %s was rejected and no earlier revision is in force: %s", orUnknown(s.seen), cm, s.lastErr)}
	case s.inForce == "":
		if !s.synced || s.present {
			return condition{}, false
		}
		c = condition{corev1.ConditionFalse, config.ReasonWaitingForConfigMap,
			fmt.Sprintf("waiting for ConfigMap %s, which floodgate-manager writes once a RateLimitPolicy of the namespace is accepted and its CounterStore is ready", cm)}
	case s.emptied:
		c = condition{corev1.ConditionTrue, config.ReasonNoPolicies,
			fmt.Sprintf("ConfigMap %s stayed deleted for %v, so no policy is enforced", cm, grace)}
	case !s.present:
		c = condition{corev1.ConditionTrue, config.ReasonConfigMapDeleted,
			fmt.Sprintf("ConfigMap %s was deleted; revision %s stays in force for %v in case it is recreated", cm, s.inForce, grace)}
	case s.lastErr != "":
		c = condition{corev1.ConditionTrue, config.ReasonRevisionRejected,
			fmt.Sprintf("revision %s stays in force: revision %s was rejected: %s", s.inForce, orUnknown(s.seen), s.lastErr)}
	case len(s.failed) > 0:
		// The message is read back by floodgate-manager: keep it whole.
		return condition{corev1.ConditionTrue, config.ReasonPartiallyLoaded, config.PartialMessage(s.inForce, s.failed)}, true
	default:
		c = condition{corev1.ConditionTrue, config.ReasonLoaded, s.inForce}
	}
	c.Message = message.Truncate(c.Message, maxMessage)
	return c, true
}

func orUnknown(rev string) string {
	if rev == "" {
		return "(unknown)"
	}
	return rev
}
