package podstatus

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestReady(t *testing.T) {
	t.Parallel()
	cond := func(typ corev1.PodConditionType, s corev1.ConditionStatus) corev1.PodCondition {
		return corev1.PodCondition{Type: typ, Status: s}
	}
	for name, tc := range map[string]struct {
		conds []corev1.PodCondition
		want  bool
	}{
		"no conditions":      {nil, false},
		"ready":              {[]corev1.PodCondition{cond(corev1.PodScheduled, corev1.ConditionTrue), cond(corev1.PodReady, corev1.ConditionTrue)}, true},
		"not ready":          {[]corev1.PodCondition{cond(corev1.PodReady, corev1.ConditionFalse)}, false},
		"unknown":            {[]corev1.PodCondition{cond(corev1.PodReady, corev1.ConditionUnknown)}, false},
		"only other reasons": {[]corev1.PodCondition{cond(corev1.ContainersReady, corev1.ConditionTrue)}, false},
	} {
		if got := Ready(&corev1.Pod{Status: corev1.PodStatus{Conditions: tc.conds}}); got != tc.want {
			t.Errorf("%s: Ready = %v, want %v", name, got, tc.want)
		}
	}
}
