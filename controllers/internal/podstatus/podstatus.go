// Package podstatus reads pod status the way floodgate's controllers need
// it. It is pure: no client, no I/O.
package podstatus

import corev1 "k8s.io/api/core/v1"

// Ready reports whether the pod's Ready condition is True.
func Ready(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
