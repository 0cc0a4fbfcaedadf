package admission

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

func valid() *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "shop", UID: "8a3e4c1e-0000-4000-8000-000000000001", Generation: 1},
		Spec: v1alpha1.RateLimitPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
			Rules: []v1alpha1.Rule{{
				Name:  "per-user",
				Match: &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchPrefix, Value: "/api/"}},
				Key:   []v1alpha1.KeyPart{{Header: "X-API-Key"}},
				Limit: v1alpha1.Limit{Requests: 100, Per: metav1.Duration{Duration: time.Minute}, Burst: 50},
			}},
		},
	}
}

func TestValidateAcceptsAValidPolicy(t *testing.T) {
	t.Parallel()
	if errs := Validate(valid()); len(errs) > 0 {
		t.Fatalf("Validate(valid) = %v", errs.ToAggregate())
	}
	noUID := valid()
	noUID.UID, noUID.Generation = "", 0
	if errs := Validate(noUID); len(errs) > 0 {
		t.Fatalf("Validate(without uid and generation) = %v", errs.ToAggregate())
	}
}

func TestValidateRejectsWithFieldNames(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*v1alpha1.RateLimitPolicy)
		want   []string
	}{{
		name: "a regular expression that does not compile",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.Path = &v1alpha1.PathMatch{Type: v1alpha1.PathMatchRegularExpression, Value: "/api/(v1"}
		},
		want: []string{"spec.rules[0].match.path.value", "not a valid RE2 regular expression", "missing closing )"},
	}, {
		name:   "a jwtClaim key without a jwt section",
		mutate: func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Key = []v1alpha1.KeyPart{{JWTClaim: "sub"}} },
		want:   []string{"spec.jwt: Required value", "jwt must be set when a rule keys on a jwtClaim"},
	}, {
		name: "a jwt section with two key sources",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Key = []v1alpha1.KeyPart{{JWTClaim: "sub"}}
			p.Spec.JWT = &v1alpha1.JWT{
				HMACSecretRef:    &v1alpha1.KeyReference{Name: "k", Key: "hmac"},
				JWKSConfigMapRef: &v1alpha1.KeyReference{Name: "j", Key: "jwks.json"},
			}
		},
		want: []string{"spec.jwt", "set exactly one of hmacSecretRef, jwksConfigMapRef, or upstreamVerified"},
	}, {
		name: "a bad label selector operator",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.PodSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Near", Values: []string{"a"}}}
		},
		want: []string{"spec.podSelector.matchExpressions[0].operator", "Near"},
	}, {
		name: "a period that is not whole microseconds (limiter.Limit.Validate)",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit.Per = metav1.Duration{Duration: time.Second + 500*time.Nanosecond}
		},
		want: []string{"spec.rules[0].limit.per", "must be a whole number of microseconds"},
	}, {
		name: "a bucket that takes too long to refill (limiter.Limit.Validate)",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit = v1alpha1.Limit{Requests: 1, Per: metav1.Duration{Duration: 8784 * time.Hour}, Burst: 1000}
		},
		want: []string{"spec.rules[0].limit.burst: Invalid value: 1000", "takes longer than"},
	}, {
		name:   "a name the sidecar config cannot carry (the compiler's check)",
		mutate: func(p *v1alpha1.RateLimitPolicy) { p.Name = strings.Repeat("a", 70) },
		want:   []string{"spec: Invalid value", "fails the sidecar's validation", "policies[0].name", "must be 1-63"},
	}, {
		name: "every problem of a step at once",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules = append(p.Spec.Rules, p.Spec.Rules[0])
			p.Spec.Rules[0].Match.Path = &v1alpha1.PathMatch{Type: v1alpha1.PathMatchRegularExpression, Value: "*"}
		},
		want: []string{"spec.rules[1].name: Duplicate value", "spec.rules[0].match.path.value"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := valid()
			tt.mutate(p)
			errs := Validate(p)
			if len(errs) == 0 {
				t.Fatal("Validate accepted the policy")
			}
			msg := invalid(p, errs).Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not contain %q", msg, w)
				}
			}
			if !apierrors.IsInvalid(invalid(p, errs)) {
				t.Error("the error is not a 422 Invalid status")
			}
		})
	}
}

func TestValidateUpdate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v := &Validator{}
	old := valid()

	bad := valid()
	bad.Spec.Rules[0].Match.Path = &v1alpha1.PathMatch{Type: v1alpha1.PathMatchRegularExpression, Value: "("}
	if _, err := v.ValidateUpdate(ctx, old, bad); err == nil {
		t.Error("an update to an invalid spec was admitted")
	}

	// An invalid object stored earlier can still have its metadata
	// changed and be deleted.
	relabelled := bad.DeepCopy()
	relabelled.Labels = map[string]string{"team": "a"}
	if _, err := v.ValidateUpdate(ctx, bad, relabelled); err != nil {
		t.Errorf("a metadata-only update was rejected: %v", err)
	}
	deleting := bad.DeepCopy()
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	deleting.Spec.Rules[0].Limit.Requests = 5
	if _, err := v.ValidateUpdate(ctx, bad, deleting); err != nil {
		t.Errorf("an update of an object being deleted was rejected: %v", err)
	}

	renamed := valid()
	renamed.Spec.Rules[0].Name = "per-key"
	w, err := v.ValidateUpdate(ctx, old, renamed)
	if err != nil {
		t.Fatal(err)
	}
	if len(w) != 1 || !strings.Contains(w[0], `rule "per-user" was removed or renamed`) {
		t.Errorf("warnings %q, want one about the renamed rule", w)
	}
	if w, err := v.ValidateDelete(ctx, bad); err != nil || len(w) != 0 {
		t.Errorf("ValidateDelete = %v, %v", w, err)
	}
}

func TestMeshedPods(t *testing.T) {
	t.Parallel()
	always := corev1.ContainerRestartPolicyAlways
	pods := []corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "web-b"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}, {Name: "istio-proxy"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}, {Name: "floodgate-sidecar"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "web-a"}, Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "istio-proxy", RestartPolicy: &always}},
			Containers:     []corev1.Container{{Name: "app"}},
		}},
	}
	if got, want := MeshedPods(pods), []string{"web-a", "web-b"}; !slices.Equal(got, want) {
		t.Errorf("MeshedPods = %v, want %v", got, want)
	}
	if got := MeshedPods(pods[1:2]); got != nil {
		t.Errorf("MeshedPods of an unmeshed pod = %v, want none", got)
	}
}
