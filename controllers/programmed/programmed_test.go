package programmed

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

type podOpt func(*corev1.Pod)

func pod(name string, opts ...podOpt) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "api"}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: config.ContainerName}},
			Containers:     []corev1.Container{{Name: "app"}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func ready(p *corev1.Pod) {
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
}

func loaded(status corev1.ConditionStatus, reason, msg string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: config.ConditionPolicyLoaded, Status: status, Reason: reason, Message: msg,
		})
	}
}

func enforcing(rev string) podOpt { return loaded(corev1.ConditionTrue, config.ReasonLoaded, rev) }

func noSidecar(p *corev1.Pod) { p.Spec.InitContainers = nil }

func labelled(k, v string) podOpt { return func(p *corev1.Pod) { p.Labels = map[string]string{k: v} } }

func phase(ph corev1.PodPhase) podOpt { return func(p *corev1.Pod) { p.Status.Phase = ph } }

func deleting(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }

func TestEvaluate(t *testing.T) {
	t.Parallel()
	const rev = "sha256:0123456789abcdef"
	sel := labels.SelectorFromSet(labels.Set{"app": "api"})
	tests := []struct {
		name       string
		pods       []corev1.Pod
		targeted   int32
		enforcing  int32
		programmed bool
		reason     string
		msgHas     []string
	}{{
		name:   "no pods",
		reason: v1alpha1.ReasonWaitingForSidecars, msgHas: []string{"Generation 3 is compiled into ConfigMap floodgate-policies", "no running pod is targeted"},
	}, {
		name:     "every pod enforces the revision",
		pods:     []corev1.Pod{pod("a", ready, enforcing(rev)), pod("b", ready, enforcing(rev))},
		targeted: 2, enforcing: 2, programmed: true,
		reason: ReasonProgrammed, msgHas: []string{"Generation 3 is enforced by all 2 targeted pods"},
	}, {
		name:     "a ready pod on an older revision holds it back",
		pods:     []corev1.Pod{pod("a", ready, enforcing(rev)), pod("b", ready, enforcing("sha256:old"))},
		targeted: 2, enforcing: 1,
		reason: v1alpha1.ReasonWaitingForSidecars, msgHas: []string{"1 of 2", "b (enforces revision sha256:old)"},
	}, {
		name: "a pod whose sidecar rejected the revision holds it back even when not ready",
		pods: []corev1.Pod{
			pod("a", ready, enforcing(rev)),
			pod("b", loaded(corev1.ConditionFalse, config.ReasonRejected, "bad document")),
		},
		targeted: 2, enforcing: 1,
		reason: v1alpha1.ReasonWaitingForSidecars, msgHas: []string{"b (Rejected: bad document)"},
	}, {
		name: "a pod keeping an older revision after a rejection holds it back",
		pods: []corev1.Pod{
			pod("a", ready, loaded(corev1.ConditionTrue, config.ReasonRevisionRejected, "revision x stays in force")),
		},
		targeted: 1, enforcing: 0,
		reason: v1alpha1.ReasonWaitingForSidecars, msgHas: []string{"a (RevisionRejected"},
	}, {
		name:     "a ready pod without a sidecar holds it back",
		pods:     []corev1.Pod{pod("a", ready, enforcing(rev)), pod("plain", ready, noSidecar)},
		targeted: 2, enforcing: 1,
		reason: v1alpha1.ReasonWaitingForSidecars, msgHas: []string{"plain (no floodgate sidecar"},
	}, {
		name:     "a ready pod whose sidecar has not reported holds it back",
		pods:     []corev1.Pod{pod("a", ready)},
		targeted: 1,
		reason:   v1alpha1.ReasonWaitingForSidecars, msgHas: []string{"a (its sidecar has not reported yet)"},
	}, {
		name:     "a starting pod does not hold it back",
		pods:     []corev1.Pod{pod("a", ready, enforcing(rev)), pod("new")},
		targeted: 2, enforcing: 1, programmed: true,
		reason: ReasonProgrammed, msgHas: []string{"1 of 2", "starting"},
	}, {
		name:     "only starting pods: waiting",
		pods:     []corev1.Pod{pod("a"), pod("b")},
		targeted: 2,
		reason:   v1alpha1.ReasonWaitingForSidecars, msgHas: []string{"which are starting"},
	}, {
		name: "pods outside the selector, finished or being deleted do not count",
		pods: []corev1.Pod{
			pod("a", ready, enforcing(rev)),
			pod("other", ready, labelled("app", "web")),
			pod("done", ready, phase(corev1.PodSucceeded)),
			pod("failed", ready, phase(corev1.PodFailed)),
			pod("going", ready, deleting),
		},
		targeted: 1, enforcing: 1, programmed: true, reason: ReasonProgrammed,
	}, {
		name:     "a False condition with the revision as message does not count as enforcing",
		pods:     []corev1.Pod{pod("a", ready, loaded(corev1.ConditionFalse, config.ReasonLoaded, rev))},
		targeted: 1,
		reason:   v1alpha1.ReasonWaitingForSidecars,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Evaluate(sel, tt.pods, rev, 3)
			if got.Targeted != tt.targeted || got.Enforcing != tt.enforcing || got.Programmed != tt.programmed || got.Reason != tt.reason {
				t.Errorf("Evaluate = {targeted %d, enforcing %d, programmed %v, reason %s}, want {%d, %d, %v, %s}; message %q",
					got.Targeted, got.Enforcing, got.Programmed, got.Reason, tt.targeted, tt.enforcing, tt.programmed, tt.reason, got.Message)
			}
			if strings.Contains(got.Message, rev) && !strings.Contains(tt.name, "False condition") {
				t.Errorf("message %q names the current revision, which churns with readiness", got.Message)
			}
			for _, s := range tt.msgHas {
				if !strings.Contains(got.Message, s) {
					t.Errorf("message %q does not contain %q", got.Message, s)
				}
			}
			if got, want := got.Status() == metav1.ConditionTrue, tt.programmed; got != want {
				t.Errorf("Status() True = %v, want %v", got, want)
			}
		})
	}
}

func TestEvaluateListsAtMostFivePods(t *testing.T) {
	t.Parallel()
	var pods []corev1.Pod
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		pods = append(pods, pod(n, ready, enforcing("sha256:old")))
	}
	got := Evaluate(labels.Everything(), pods, "sha256:new", 1)
	if !strings.Contains(got.Message, "and 2 more") || strings.Contains(got.Message, "f (") {
		t.Errorf("message %q should name five pods and count the rest", got.Message)
	}
}

func TestEnforcesNeedsARevision(t *testing.T) {
	t.Parallel()
	p := pod("a", enforcing(""))
	if Enforces(&p, "") {
		t.Error("Enforces(pod, \"\") = true, want false: an empty revision is never in force")
	}
}

func TestLoadedChanged(t *testing.T) {
	t.Parallel()
	base := pod("a")
	tests := []struct {
		name     string
		old, cur corev1.Pod
		want     bool
	}{
		{"no condition on either", base, base, false},
		{"condition added", base, pod("a", enforcing("r1")), true},
		{"condition removed", pod("a", enforcing("r1")), base, true},
		{"revision changed", pod("a", enforcing("r1")), pod("a", enforcing("r2")), true},
		{"reason changed", pod("a", enforcing("r1")), pod("a", loaded(corev1.ConditionTrue, config.ReasonRevisionRejected, "r1")), true},
		{"status changed", pod("a", enforcing("r1")), pod("a", loaded(corev1.ConditionFalse, config.ReasonLoaded, "r1")), true},
		{"unchanged", pod("a", enforcing("r1")), pod("a", ready, enforcing("r1")), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := LoadedChanged(&tt.old, &tt.cur); got != tt.want {
				t.Errorf("LoadedChanged = %v, want %v", got, tt.want)
			}
		})
	}
}

// A pod whose sidecar loaded the revision but could not compile one policy
// enforces the others, and lags for that one.
func TestEvaluatePartiallyLoaded(t *testing.T) {
	t.Parallel()
	const rev = "sha256:0123456789abcdef"
	sel := labels.SelectorFromSet(labels.Set{"app": "api"})
	partial := loaded(corev1.ConditionTrue, config.ReasonPartiallyLoaded, config.PartialMessage(rev, []string{"broken"}))
	pods := []corev1.Pod{pod("a", ready, partial), pod("b", ready, enforcing(rev))}
	if r := EvaluatePolicy("login", sel, pods, rev, 1); !r.Programmed || r.Enforcing != 2 {
		t.Errorf("login: %+v, want programmed on both pods", r)
	}
	r := EvaluatePolicy("broken", sel, pods, rev, 1)
	if r.Programmed || r.Enforcing != 1 || !strings.Contains(r.Message, "a (its sidecar could not load this policy") {
		t.Errorf("broken: %+v, want pod a lagging", r)
	}
	// A list cut short names no policy for sure: every one lags there.
	many := make([]string, 200)
	for i := range many {
		many[i] = strings.Repeat("x", 20) + string(rune('a'+i%26))
	}
	cut := []corev1.Pod{pod("c", ready, loaded(corev1.ConditionTrue, config.ReasonPartiallyLoaded, config.PartialMessage(rev, many)))}
	if r := EvaluatePolicy("login", sel, cut, rev, 1); r.Enforcing != 0 {
		t.Errorf("a cut list: %+v, want login not counted", r)
	}
}
