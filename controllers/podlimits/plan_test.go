package podlimits

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// rsPod is a pod of Deployment api's ReplicaSet with the template hash,
// created at t0 plus age seconds.
func rsPod(name, hash string, age int, ann map[string]string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "shop",
			CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second)),
			Labels:            map[string]string{"app": "api", "pod-template-hash": hash},
			Annotations:       ann,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "api-" + hash,
				UID: "rs-uid", Controller: ptr.To(true)}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func TestDesired(t *testing.T) {
	t.Parallel()
	plan := Desired("shop", []corev1.Pod{
		rsPod("api-5d8-a", "5d8", 1, map[string]string{
			AnnotationRPS: "20", AnnotationRPM: "600", AnnotationBurstMultiplier: "3",
			AnnotationWhitelist: "10.0.0.0/8, 192.0.2.7,2001:db8::1", AnnotationTrustedCIDRs: "10.0.0.0/8"}),
		rsPod("api-5d8-b", "5d8", 2, map[string]string{AnnotationRPS: "20"}),
		{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop", Labels: map[string]string{"app": "web"}}},
	}, "main")
	if len(plan.Problems) != 0 {
		t.Fatalf("problems: %+v", plan.Problems)
	}
	if len(plan.Policies) != 1 {
		t.Fatalf("%d policies, want 1 (for api)", len(plan.Policies))
	}
	p := plan.Policies[0]
	if got, want := p.Name, "limit-api"; got != want {
		t.Errorf("name %q, want %q (the Deployment's name)", got, want)
	}
	// The newest pod (api-5d8-b) decides: only limit-rps, default multiplier.
	if got := p.Spec.PodSelector.MatchLabels; len(got) != 1 || got["app"] != "api" {
		t.Errorf("selector %v, want app=api without pod-template-hash", got)
	}
	if len(p.Spec.Rules) != 1 || p.Spec.Rules[0].Name != "limit-rps" {
		t.Fatalf("rules %+v, want limit-rps only", p.Spec.Rules)
	}
	r := p.Spec.Rules[0]
	if r.Limit.Requests != 20 || r.Limit.Per.Duration != time.Second || r.Limit.Burst != 100 || r.Key[0].ClientIP == nil {
		t.Errorf("rule %+v, want 20/s, burst 100 (x5), per client IP", r)
	}
	if p.Spec.StoreRef.Name != "main" || p.Labels[ImplicitLabel] != ImplicitValue {
		t.Errorf("store %v, labels %v", p.Spec.StoreRef, p.Labels)
	}

	// With the older pod alone, every annotation shows.
	plan = Desired("shop", []corev1.Pod{rsPod("api-5d8-a", "5d8", 1, map[string]string{
		AnnotationRPS: "20", AnnotationRPM: "600", AnnotationBurstMultiplier: "3",
		AnnotationWhitelist: "10.0.0.0/8, 192.0.2.7,2001:db8::1", AnnotationTrustedCIDRs: "10.0.0.0/8"})}, "main")
	p = plan.Policies[0]
	if len(p.Spec.Rules) != 2 || p.Spec.Rules[1].Name != "limit-rpm" || p.Spec.Rules[1].Limit.Per.Duration != time.Minute ||
		p.Spec.Rules[0].Limit.Burst != 60 || p.Spec.Rules[1].Limit.Burst != 1800 {
		t.Errorf("rules %+v, want limit-rps 20/s burst 60 and limit-rpm 600/m burst 1800", p.Spec.Rules)
	}
	if got, want := p.Spec.Exempt.SourceCIDRs, []v1alpha1.CIDR{"10.0.0.0/8", "192.0.2.7/32", "2001:db8::1/128"}; !equal(got, want) {
		t.Errorf("exempt %v, want %v", got, want)
	}
	if got := p.Spec.TrustedProxies; got == nil || len(got.CIDRs) != 1 || got.CIDRs[0] != "10.0.0.0/8" {
		t.Errorf("trustedProxies %+v", got)
	}
}

func equal(a, b []v1alpha1.CIDR) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A rollout that removes the annotations removes the policy as its new
// pods come: the newest pod decides.
func TestRolloutRemovingTheAnnotation(t *testing.T) {
	t.Parallel()
	old := rsPod("api-5d8-a", "5d8", 1, map[string]string{AnnotationRPS: "20"})
	cur := rsPod("api-7f9-a", "7f9", 2, nil)
	if plan := Desired("shop", []corev1.Pod{old, cur}, "main"); len(plan.Policies) != 0 {
		t.Errorf("policies %v, want none once the newest pod has no annotation", plan.Policies)
	}
	changed := rsPod("api-7f9-a", "7f9", 2, map[string]string{AnnotationRPS: "50"})
	plan := Desired("shop", []corev1.Pod{old, changed}, "main")
	if len(plan.Policies) != 1 || plan.Policies[0].Spec.Rules[0].Limit.Requests != 50 {
		t.Errorf("policies %+v, want the new pods' 50/s", plan.Policies)
	}
}

func TestDesiredProblems(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		pod  corev1.Pod
		want string
	}{
		{"not a number", rsPod("a", "1", 1, map[string]string{AnnotationRPS: "fast"}), `annotation floodgate.dev/limit-rps: "fast": must be an integer from 1 to 1000000000`},
		{"zero", rsPod("a", "1", 1, map[string]string{AnnotationRPM: "0"}), "floodgate.dev/limit-rpm"},
		{"bad multiplier", rsPod("a", "1", 1, map[string]string{AnnotationRPS: "1", AnnotationBurstMultiplier: "0"}), "floodgate.dev/limit-burst-multiplier"},
		{"burst too large", rsPod("a", "1", 1, map[string]string{AnnotationRPS: "1000000000", AnnotationBurstMultiplier: "2"}), "exceeds 1000000000"},
		{"bad whitelist", rsPod("a", "1", 1, map[string]string{AnnotationRPS: "1", AnnotationWhitelist: "10.0.0.0/8,intranet"}), `"intranet" is not an IP address or a CIDR`},
		{"no labels", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bare", Labels: map[string]string{"pod-template-hash": "x"},
			Annotations: map[string]string{AnnotationRPS: "1"}}}, "has no labels to select it by"},
	} {
		plan := Desired("shop", []corev1.Pod{tc.pod}, "main")
		if len(plan.Policies) != 0 || len(plan.Problems) != 1 || !strings.Contains(plan.Problems[0].Message, tc.want) {
			t.Errorf("%s: policies %d, problems %+v; want one problem containing %q", tc.name, len(plan.Policies), plan.Problems, tc.want)
		}
	}
}

func TestPolicyNames(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("w", 70)
	if got := policyName(long); len(got) > 63 || !strings.HasPrefix(got, "limit-www") {
		t.Errorf("policyName(70 w) = %q", got)
	}
	if first, again := policyName(long), policyName(long); first != again || first == policyName(long+"x") {
		t.Error("shortened names are not stable and distinct")
	}
	bare := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "solo", Labels: map[string]string{"app": "solo"},
		Annotations: map[string]string{AnnotationRPS: "5"}}}
	if plan := Desired("shop", []corev1.Pod{bare}, "main"); len(plan.Policies) != 1 || plan.Policies[0].Name != "limit-solo" {
		t.Errorf("a bare pod's policy: %+v", plan.Policies)
	}
}
