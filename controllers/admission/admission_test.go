package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
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
		name: "a condition that does not compile",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.When = []v1alpha1.Expression{"request.method == GET"}
		},
		want: []string{"spec.rules[0].match.when[0]", "not a valid CEL expression", "undeclared reference to 'GET'"},
	}, {
		name: "a condition over the cost limit",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.When = []v1alpha1.Expression{"request.query.all(a, request.headers.exists(b, a == b))"}
		},
		want: []string{"spec.rules[0].match.when[0]", "estimated worst-case cost", "exceeds the limit 1000000"},
	}, {
		name: "a key expression reading claims without jwt",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Key = []v1alpha1.KeyPart{{Expression: "auth.claims.org"}}
		},
		want: []string{"spec.rules[0].key[0].expression", "reads auth.claims"},
	}, {
		name: "a client network with host bits",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.SourceCIDRs = []v1alpha1.CIDR{"192.0.2.1/24"}
		},
		want: []string{"spec.rules[0].match.sourceCIDRs[0]", "must be a CIDR with no host bits set"},
	}, {
		name: "an exempt network that is not one",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Exempt = &v1alpha1.Exempt{SourceCIDRs: []v1alpha1.CIDR{"10.0.0.0/33"}}
		},
		want: []string{"spec.exempt.sourceCIDRs[0]", "must be a CIDR"},
	}, {
		name: "an exempt condition that does not compile",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Exempt = &v1alpha1.Exempt{When: []v1alpha1.Expression{"source.address in"}}
		},
		want: []string{"spec.rules[0].exempt.when[0]", "not a valid CEL expression"},
	}, {
		name: "a header regex that does not compile",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.Headers = []v1alpha1.HeaderMatch{{Name: "X-Tier", Regex: "[a-"}}
		},
		want: []string{"spec.rules[0].match.headers[0].regex", "not a valid RE2 regular expression"},
	}, {
		name: "a query regex that does not compile",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.Query = []v1alpha1.QueryMatch{{Name: "page", Regex: "(?P<x"}}
		},
		want: []string{"spec.rules[0].match.query[0].regex", "not a valid RE2 regular expression"},
	}, {
		name: "a wildcard host in the wrong place",
		mutate: func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.Hosts = []v1alpha1.Hostname{"api.*.example.com"}
		},
		want: []string{"spec.rules[0].match.hosts[0]", "must be a lower-case DNS name"},
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

// meshLister is the manager's cache with pods: some run Istio's sidecar.
type meshLister struct {
	policyLister
	pods []corev1.Pod
}

func (l meshLister) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if pl, ok := list.(*corev1.PodList); ok {
		pl.Items = l.pods
		return nil
	}
	return l.policyLister.List(ctx, list, opts...)
}

// A policy that reads the client IP behind Istio's sidecar, where every
// client arrives from 127.0.0.6, is admitted with a warning naming the
// pods; trustedProxies, or a key that is not the client, silences it.
func TestMeshWarnings(t *testing.T) {
	t.Parallel()
	istio := []corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "api-1", Namespace: "shop"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}, {Name: "istio-proxy"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "api-2", Namespace: "shop"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}}},
	}
	clientIP := func(p *v1alpha1.RateLimitPolicy) {
		p.Spec.Rules[0].Key = []v1alpha1.KeyPart{{ClientIP: &v1alpha1.ClientIPKey{}}}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*v1alpha1.RateLimitPolicy)
		pods   []corev1.Pod
		warned bool
	}{
		{"a clientIP key", clientIP, istio, true},
		{"a clientIP key among alternatives", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Key = nil
			p.Spec.Rules[0].Keys = [][]v1alpha1.KeyPart{{{Header: "X-API-Key"}}, {{ClientIP: &v1alpha1.ClientIPKey{}}}}
		}, istio, true},
		{"sourceCIDRs", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.SourceCIDRs = []v1alpha1.CIDR{"10.0.0.0/8"}
		}, istio, true},
		{"source.address in a condition", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.When = []v1alpha1.Expression{"source.address != '10.0.0.1'"}
		}, istio, true},
		{"a clientIP key with trustedProxies", func(p *v1alpha1.RateLimitPolicy) {
			clientIP(p)
			p.Spec.TrustedProxies = &v1alpha1.TrustedProxies{CIDRs: []v1alpha1.CIDR{"127.0.0.6/32"}}
		}, istio, false},
		{"a header key", func(*v1alpha1.RateLimitPolicy) {}, istio, false},
		{"no pod behind Istio", clientIP, istio[1:], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := valid()
			tc.mutate(p)
			w, err := (&Validator{Reader: meshLister{pods: tc.pods}}).ValidateCreate(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(w, "\n")
			if got := strings.Contains(all, "127.0.0.6"); got != tc.warned {
				t.Fatalf("warned about the mesh = %v, want %v; warnings %q", got, tc.warned, w)
			}
			if tc.warned && !strings.Contains(all, "(api-1)") {
				t.Errorf("the warning does not name the meshed pod api-1: %q", w)
			}
		})
	}
}

func validCluster() *v1alpha1.ClusterRateLimitPolicy {
	return &v1alpha1.ClusterRateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "floor", UID: "c1a55e00-0000-4000-8000-000000000001", Generation: 1},
		Spec: v1alpha1.ClusterRateLimitPolicySpec{
			Exempt: &v1alpha1.Exempt{SourceCIDRs: []v1alpha1.CIDR{"10.0.0.0/8"}},
			Defaults: &v1alpha1.ClusterRules{Rules: []v1alpha1.Rule{{
				Name:  "per-ip",
				Match: &v1alpha1.RuleMatch{When: []v1alpha1.Expression{"request.path != '/healthz'"}},
				Key:   []v1alpha1.KeyPart{{ClientIP: &v1alpha1.ClientIPKey{}}},
				Limit: v1alpha1.Limit{Requests: 1000, Per: metav1.Duration{Duration: time.Second}},
			}}},
		},
	}
}

func TestValidateCluster(t *testing.T) {
	t.Parallel()
	if errs := ValidateCluster(validCluster()); len(errs) > 0 {
		t.Fatalf("ValidateCluster(valid) = %v", errs.ToAggregate())
	}
	noUID := validCluster()
	noUID.UID = ""
	if errs := ValidateCluster(noUID); len(errs) > 0 {
		t.Fatalf("ValidateCluster(without uid) = %v", errs.ToAggregate())
	}
	for _, tc := range []struct {
		name   string
		mutate func(*v1alpha1.ClusterRateLimitPolicy)
		want   []string
	}{{
		"a condition over the cost limit",
		func(p *v1alpha1.ClusterRateLimitPolicy) {
			p.Spec.Defaults.Rules[0].Match.When = []v1alpha1.Expression{"request.headers.exists(a, request.headers.exists(b, a < b))"}
		},
		[]string{"spec.defaults.rules[0].match.when[0]", "exceeds the limit"},
	}, {
		"a bad exempt network",
		func(p *v1alpha1.ClusterRateLimitPolicy) { p.Spec.Exempt.SourceCIDRs = []v1alpha1.CIDR{"10.0.0.0"} },
		[]string{"spec.exempt.sourceCIDRs[0]", "must be a CIDR"},
	}, {
		"claims, which a cluster policy has no keys for",
		func(p *v1alpha1.ClusterRateLimitPolicy) {
			p.Spec.Defaults.Rules[0].Key = []v1alpha1.KeyPart{{Expression: "auth.claims.sub"}}
		},
		[]string{"spec.defaults.rules[0].key[0].expression", "reads auth.claims, which a ClusterRateLimitPolicy cannot use"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := validCluster()
			tc.mutate(p)
			errs := ValidateCluster(p)
			if len(errs) == 0 {
				t.Fatal("ValidateCluster accepted the policy")
			}
			msg := errs.ToAggregate().Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not contain %q", msg, w)
				}
			}
		})
	}
}

// policyLister is the manager's cache as the validator reads it: the
// namespace's policies, and nothing else.
type policyLister struct{ items []v1alpha1.RateLimitPolicy }

func (l policyLister) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return apierrors.NewNotFound(schema.GroupResource{}, "")
}

func (l policyLister) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	if pl, ok := list.(*v1alpha1.RateLimitPolicyList); ok {
		pl.Items = l.items
	}
	return nil
}

// A namespace's policies may hold at most the rules one sidecar enforces.
func TestValidateBoundsTheNamespace(t *testing.T) {
	t.Parallel()
	rules := make([]v1alpha1.Rule, 64)
	for i := range rules {
		rules[i] = valid().Spec.Rules[0]
		rules[i].Name = fmt.Sprintf("r%d", i)
	}
	var others []v1alpha1.RateLimitPolicy
	for i := range config.MaxRules / 64 {
		p := valid()
		p.Name, p.Spec.Rules = fmt.Sprintf("p%d", i), rules
		others = append(others, *p)
	}
	v := &Validator{Reader: policyLister{items: others}}
	p := valid()
	p.Name, p.Spec.Rules = "one-too-many", rules
	_, err := v.ValidateCreate(context.Background(), p)
	if err == nil || !strings.Contains(err.Error(), "spec.rules") || !strings.Contains(err.Error(), fmt.Sprintf("more than the %d a sidecar enforces", config.MaxRules)) {
		t.Errorf("ValidateCreate over the bound = %v", err)
	}
	small := valid()
	small.Name = "fits"
	if _, err := v.ValidateCreate(context.Background(), small); err != nil {
		t.Errorf("ValidateCreate within the bound = %v", err)
	}
}

// Rules that let requests past them are admitted with a warning.
func TestWarningsAboutBypasses(t *testing.T) {
	t.Parallel()
	p := valid()
	p.Spec.Rules[0].OnMissingKey = v1alpha1.OnMissingKeySkip
	global := valid().Spec.Rules[0]
	global.Name, global.Key = "global", nil
	p.Spec.Rules = append(p.Spec.Rules, global)
	w, err := (&Validator{}).ValidateCreate(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(w, "\n")
	if !strings.Contains(all, `spec.rules[0].onMissingKey: Skip lets every request`) || !strings.Contains(all, `spec.rules[1]: rule "global" has no key`) {
		t.Errorf("warnings %q", w)
	}
}
