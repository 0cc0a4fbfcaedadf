// Package programmed turns what the sidecars report on their pods into a
// RateLimitPolicy's Programmed condition and status.enforcingPods.
//
// Each sidecar writes the pod condition config.ConditionPolicyLoaded:
// True with reason Loaded and, as its message, the revision of the
// namespace's ConfigMap it has in force. A pod enforces the policy's
// current compilation when that condition is True, its reason is Loaded and
// its message equals the ConfigMap's current revision.
//
// Evaluate is pure: it reads the pods it is given and no clock.
package programmed

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/internal/podstatus"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// ReasonProgrammed is the reason of a True Programmed condition.
const ReasonProgrammed = "Programmed"

// maxListed bounds the pods a message names.
const maxListed = 5

// Result is the Programmed condition and the enforcing count of one
// policy.
type Result struct {
	// Targeted is the number of running pods the selector matches.
	Targeted int32
	// Enforcing is how many of them report the revision loaded.
	Enforcing int32
	// Programmed is the condition's status.
	Programmed bool
	// Reason is ReasonProgrammed or v1alpha1.ReasonWaitingForSidecars.
	Reason string
	// Message names the revision and the pods that hold the condition
	// back.
	Message string
}

// Status returns the condition's status.
func (r Result) Status() metav1.ConditionStatus {
	if r.Programmed {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// Evaluate decides the Programmed condition of a policy whose generation
// is compiled into the ConfigMap at revision, given the pods its selector
// matches among pods.
//
// Programmed is True when at least one targeted pod enforces revision and
// no targeted pod lags. A pod lags when it serves traffic (it is Ready) or
// its sidecar has reported, but it does not enforce revision: its sidecar
// reports another revision, rejected this one, or it has no sidecar at
// all. A pod that is still starting (not Ready, no report yet) does not
// hold the condition back; it is counted in Targeted but not in Enforcing.
// With no targeted pod, nothing enforces the policy, so it is not
// Programmed.
//
// The message names the lagging pods but not the revision, which changes
// with every readiness change of a targeted pod (it carries the replica
// count), so that it costs no status write of its own.
func Evaluate(selector labels.Selector, pods []corev1.Pod, revision string, generation int64) Result {
	return EvaluatePolicy("", selector, pods, revision, generation)
}

// EvaluatePolicy is Evaluate for the policy named policy: a pod whose
// sidecar loaded the revision but not that policy (reason
// config.ReasonPartiallyLoaded, which names the policies it could not
// compile) lags.
func EvaluatePolicy(policy string, selector labels.Selector, pods []corev1.Pod, revision string, generation int64) Result {
	var res Result
	var lagging []string
	for i := range pods {
		pod := &pods[i]
		if !running(pod) || !selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		res.Targeted++
		c := loadedCondition(pod)
		if EnforcesPolicy(pod, revision, policy) {
			res.Enforcing++
			continue
		}
		ready := podstatus.Ready(pod)
		switch {
		case !hasSidecar(pod):
			if ready || c != nil {
				lagging = append(lagging, pod.Name+" (no floodgate sidecar: annotate the pod floodgate.dev/inject: \"true\")")
			}
		case c == nil:
			if ready {
				lagging = append(lagging, pod.Name+" (its sidecar has not reported yet)")
			}
		case c.Reason == config.ReasonLoaded && c.Status == corev1.ConditionTrue:
			lagging = append(lagging, fmt.Sprintf("%s (enforces revision %s)", pod.Name, c.Message))
		case c.Reason == config.ReasonPartiallyLoaded && c.Status == corev1.ConditionTrue:
			lagging = append(lagging, fmt.Sprintf("%s (its sidecar could not load this policy: see floodgate_sidecar_policy_failed and /debug/config on the pod; %s)", pod.Name, c.Message))
		default:
			lagging = append(lagging, fmt.Sprintf("%s (%s: %s)", pod.Name, c.Reason, c.Message))
		}
	}
	slices.Sort(lagging)

	compiled := fmt.Sprintf("Generation %d is compiled into ConfigMap floodgate-policies", generation)
	switch {
	case res.Targeted == 0:
		res.Reason = v1alpha1.ReasonWaitingForSidecars
		res.Message = compiled + "; no running pod is targeted yet, so no sidecar enforces it."
	case res.Enforcing == 0 && len(lagging) == 0:
		res.Reason = v1alpha1.ReasonWaitingForSidecars
		res.Message = fmt.Sprintf("%s; waiting for the sidecars of the %d targeted pods, which are starting, to report it loaded.",
			compiled, res.Targeted)
	case len(lagging) > 0:
		res.Reason = v1alpha1.ReasonWaitingForSidecars
		res.Message = fmt.Sprintf("%s; %d of %d targeted pods enforce it; waiting for %s.",
			compiled, res.Enforcing, res.Targeted, list(lagging))
	default:
		res.Programmed = true
		res.Reason = ReasonProgrammed
		res.Message = fmt.Sprintf("Generation %d is enforced by %d of %d targeted pods; the others are starting.",
			generation, res.Enforcing, res.Targeted)
		if res.Enforcing == res.Targeted {
			res.Message = fmt.Sprintf("Generation %d is enforced by all %d targeted pods.", generation, res.Targeted)
		}
	}
	return res
}

// Enforces reports whether pod's sidecar reports revision in force, with
// every policy of it.
func Enforces(pod *corev1.Pod, revision string) bool {
	c := loadedCondition(pod)
	return revision != "" && c != nil && c.Status == corev1.ConditionTrue &&
		c.Reason == config.ReasonLoaded && c.Message == revision
}

// EnforcesPolicy reports whether pod's sidecar reports revision in force
// with the policy named policy: the whole revision, or the revision but for
// policies that do not include it. An empty policy asks for the whole
// revision.
func EnforcesPolicy(pod *corev1.Pod, revision, policy string) bool {
	if Enforces(pod, revision) {
		return true
	}
	c := loadedCondition(pod)
	if policy == "" || revision == "" || c == nil || c.Status != corev1.ConditionTrue || c.Reason != config.ReasonPartiallyLoaded {
		return false
	}
	rev, failed, complete := config.ParsePartialMessage(c.Message)
	return complete && rev == revision && !slices.Contains(failed, policy)
}

// LoadedChanged reports whether the sidecar's condition differs between
// two versions of a pod, for the controller's pod predicate.
func LoadedChanged(old, cur *corev1.Pod) bool {
	a, b := loadedCondition(old), loadedCondition(cur)
	if a == nil || b == nil {
		return (a == nil) != (b == nil)
	}
	return a.Status != b.Status || a.Reason != b.Reason || a.Message != b.Message
}

func list(names []string) string {
	if len(names) <= maxListed {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:maxListed], ", ") + fmt.Sprintf(" and %d more", len(names)-maxListed)
}

func loadedCondition(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == config.ConditionPolicyLoaded {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func hasSidecar(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if cs[i].Name == config.ContainerName {
				return true
			}
		}
	}
	return false
}

// running matches the compiler's notion of a targeted pod: not being
// deleted and not finished.
func running(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}
