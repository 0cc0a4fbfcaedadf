package clusterstatus

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

const rev = "sha256:aaaa"

func policy() v1alpha1.RateLimitPolicy {
	return v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "shop", Generation: 2},
		Spec:       v1alpha1.RateLimitPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}},
		Status: v1alpha1.RateLimitPolicyStatus{ObservedGeneration: 2, Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted},
			{Type: v1alpha1.ConditionResolvedRefs, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonResolvedRefs},
			{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionTrue, Reason: "Programmed"},
		}},
	}
}

// pod is a running pod of app=api; loaded, when set, is its sidecar's
// report.
func pod(name string, ready, sidecar bool, loaded *corev1.PodCondition) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "api"}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"},
	}
	p.Spec.Containers = []corev1.Container{{Name: "app"}}
	if sidecar {
		p.Spec.InitContainers = []corev1.Container{{Name: config.ContainerName}}
	}
	if ready {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	}
	if loaded != nil {
		p.Status.Conditions = append(p.Status.Conditions, *loaded)
	}
	return p
}

func loaded(reason, msg string) *corev1.PodCondition {
	return &corev1.PodCondition{Type: config.ConditionPolicyLoaded, Status: corev1.ConditionTrue, Reason: reason, Message: msg}
}

func decisions(rule, result string, v float64) Sample {
	return Sample{Name: MetricDecisions, Labels: map[string]string{"policy": "api", "rule": rule, "result": result}, Value: v}
}

func TestBuild(t *testing.T) {
	t.Parallel()
	store := &v1alpha1.CounterStore{Status: v1alpha1.CounterStoreStatus{Endpoints: []string{"r:6379"}, Conditions: []metav1.Condition{
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Message: "ok"},
		{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Message: "shard 2 has no replica"},
	}}}
	other := pod("other", true, true, nil)
	other.Labels = map[string]string{"app": "web"}
	in := Input{
		Namespace: "shop",
		Policies:  []v1alpha1.RateLimitPolicy{policy()},
		Config:    &config.Config{Revision: rev, Policies: []config.Policy{{Name: "api", Generation: 2}}},
		Stores:    map[string]*v1alpha1.CounterStore{"default": store},
		Pods: []corev1.Pod{
			pod("a", true, true, loaded(config.ReasonLoaded, rev)),
			pod("b", true, true, loaded(config.ReasonLoaded, "sha256:old")),
			pod("c", false, true, nil), // starting: not stale
			pod("d", true, true, loaded(config.ReasonRevisionRejected, "bad regex")),
			pod("e", true, false, nil), // no sidecar
			other,
		},
		Window: 5 * time.Second,
		Before: map[string]Scrape{"a": {Samples: []Sample{decisions("r", "allowed", 10), decisions("r", "denied", 1)}}},
		After: map[string]Scrape{
			"a": {Samples: []Sample{
				decisions("r", "allowed", 15), decisions("r", "denied", 4), decisions("r", "shadow_denied", 2),
				{Name: MetricConfig, Labels: map[string]string{"revision": rev}, Value: 1},
				{Name: MetricFallback, Value: 1},
				{Name: MetricDecisions, Labels: map[string]string{"policy": "other", "rule": "r", "result": "denied"}, Value: 99},
				{Name: MetricExempt, Labels: map[string]string{"policy": "api", "rule": "r"}, Value: 6},
				{Name: MetricExempt, Labels: map[string]string{"policy": "other", "rule": "r"}, Value: 50},
			}},
			"b": {Err: "connection refused"},
		},
	}
	rep := Build(in)
	if got, want := rep.Window, "5s"; got != want {
		t.Errorf("Window %q, want %q", got, want)
	}
	ps := rep.Policies[0]
	if ps.Revision != rev || ps.CompiledGeneration != 2 || ps.Targeted != 5 || ps.Enforcing != 1 {
		t.Errorf("revision %q, compiled %d, targeted %d, enforcing %d; want %q, 2, 5, 1", ps.Revision, ps.CompiledGeneration, ps.Targeted, ps.Enforcing, rev)
	}
	if !ps.Store.Found || ps.Store.Ready != "True" || ps.Store.Degraded != "True" || !strings.Contains(ps.Store.Message, "degraded: shard 2 has no replica") {
		t.Errorf("store %+v", ps.Store)
	}
	byName := map[string]PodStatus{}
	for _, p := range ps.Pods {
		byName[p.Name] = p
	}
	if len(byName) != 5 {
		t.Fatalf("pods %v, want the 5 targeted", ps.Pods)
	}
	for name, stale := range map[string]bool{"a": false, "b": true, "c": false, "d": true, "e": true} {
		if byName[name].Stale != stale {
			t.Errorf("pod %s: stale %v, want %v", name, byName[name].Stale, stale)
		}
	}
	a := byName["a"]
	if !a.Enforces || a.MetricsRevision != rev || !a.FallbackActive || len(a.Rules) != 1 {
		t.Fatalf("pod a: %+v", a)
	}
	if r := a.Rules[0]; r.Allowed != 15 || r.Denied != 4 || r.ShadowDenied != 2 || r.Exempt != 6 || r.RecentAllowed != 5 || r.RecentDenied != 3 {
		t.Errorf("pod a's counts %+v, want totals 15/4/2, 6 exempt and recent 5/3", r)
	}
	if got, want := byName["b"].MetricsError, "connection refused"; got != want {
		t.Errorf("pod b's metrics error %q, want %q", got, want)
	}
	if len(ps.Rules) != 1 || ps.Rules[0].RecentDenied != 3 || ps.Rules[0].Exempt != 6 {
		t.Errorf("rule sums %+v", ps.Rules)
	}
	wantProblems := []string{
		"api: pod b is stale: enforces sha256:old, not revision " + rev,
		"api: pod d is stale: RevisionRejected: bad regex, not revision " + rev,
		"api: pod e is stale: has no floodgate sidecar, not revision " + rev,
	}
	if strings.Join(rep.Problems, "\n") != strings.Join(wantProblems, "\n") {
		t.Errorf("problems\n%s\nwant\n%s", strings.Join(rep.Problems, "\n"), strings.Join(wantProblems, "\n"))
	}
}

func TestBuildReportsWhatIsNotDone(t *testing.T) {
	t.Parallel()
	p := policy()
	p.Generation = 3
	p.Status.Conditions[0] = metav1.Condition{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonInvalid, Message: "spec.x: bad"}
	p.Status.Conditions = p.Status.Conditions[:1]
	rep := Build(Input{
		Namespace: "shop", Policies: []v1alpha1.RateLimitPolicy{p},
		Config:    &config.Config{Revision: rev, Policies: []config.Policy{{Name: "api", Generation: 2}}},
		Stores:    map[string]*v1alpha1.CounterStore{"default": nil},
		ConfigErr: "",
	})
	want := []string{
		"api: Accepted is False (Invalid): spec.x: bad",
		"api: ResolvedRefs not reported yet",
		"api: Programmed not reported yet",
		"api: the manager has not observed generation 3 yet (status is of 2)",
		"api: the compiled config holds generation 2, not 3",
	}
	if strings.Join(rep.Problems, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems\n%s\nwant\n%s", strings.Join(rep.Problems, "\n"), strings.Join(want, "\n"))
	}
	if st := rep.Policies[0].Store; st.Found || st.Message != `CounterStore "default" does not exist` {
		t.Errorf("store %+v", st)
	}
}

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	text := `# HELP floodgate_sidecar_decisions_total Rule decisions.
# TYPE floodgate_sidecar_decisions_total counter
floodgate_sidecar_decisions_total{policy="api",result="denied",rule="r"} 4
# TYPE floodgate_sidecar_config_info gauge
floodgate_sidecar_config_info{revision="sha256:aaaa"} 1
# TYPE floodgate_sidecar_fallback_active gauge
floodgate_sidecar_fallback_active 0
# TYPE go_goroutines gauge
go_goroutines 12
`
	got, err := ParseMetrics([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Value != 4 || got[0].Labels["rule"] != "r" || got[1].Labels["revision"] != rev {
		t.Errorf("ParseMetrics = %+v", got)
	}
	if _, err := ParseMetrics([]byte("not { metrics")); err == nil {
		t.Error("garbage parsed")
	}
}

// gatewayPolicy is a policy with a targetRef, as the manager reports it:
// loaded by 2 of 2 central service replicas, its HTTPRoute attached to two
// Gateways, one of whose objects the gateway refused.
func gatewayPolicy() v1alpha1.RateLimitPolicy {
	p := policy()
	p.Name = "edge"
	p.Spec.PodSelector = metav1.LabelSelector{}
	p.Spec.TargetRef = &v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindHTTPRoute, Name: "api"}
	p.Status.Enforcing = "2/2"
	p.Status.Target = &v1alpha1.TargetStatus{
		Ref: "HTTPRoute/api", Found: true, Gateways: []string{"shop/eg", "shop/public"}, Hostnames: []string{"api.example.com"},
		GatewayConfig: []string{"shop.eg.envoy-gateway.yaml", "shop.public.istio.yaml"},
		AppliedObjects: []v1alpha1.AppliedObject{
			{Kind: "EnvoyPatchPolicy", Namespace: "shop", Name: "floodgate-eg", Gateway: "shop/eg", State: v1alpha1.AppliedStateRejected, Message: "patch path does not exist"},
			{Kind: "EnvoyFilter", Namespace: "shop", Name: "floodgate-public", Gateway: "shop/public", State: v1alpha1.AppliedStateApplied},
		},
	}
	return p
}

// A policy with a targetRef is the central service's: the namespace's
// compiled config and pods say nothing of it, and the report shows its
// target and the gateway objects the manager applied instead, with a
// problem for each object that is not in force.
func TestBuildGatewayPolicy(t *testing.T) {
	t.Parallel()
	store := &v1alpha1.CounterStore{Status: v1alpha1.CounterStoreStatus{Conditions: []metav1.Condition{
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue},
	}}}
	rep := Build(Input{
		Namespace: "shop",
		Policies:  []v1alpha1.RateLimitPolicy{gatewayPolicy()},
		Stores:    map[string]*v1alpha1.CounterStore{"default": store},
		Pods:      []corev1.Pod{pod("a", true, false, nil)},
	})
	ps := rep.Policies[0]
	if ps.Target == nil || ps.Target.Ref != "HTTPRoute/api" || len(ps.Target.AppliedObjects) != 2 || ps.ServiceReplicas != "2/2" {
		t.Fatalf("target %+v, service replicas %q", ps.Target, ps.ServiceReplicas)
	}
	if ps.Targeted != 0 || ps.Enforcing != 0 || len(ps.Pods) != 0 {
		t.Errorf("targeted %d, enforcing %d, pods %v; want none: no pod enforces a policy with a targetRef", ps.Targeted, ps.Enforcing, ps.Pods)
	}
	want := "edge: EnvoyPatchPolicy shop/floodgate-eg for Gateway shop/eg is Rejected: patch path does not exist"
	if strings.Join(rep.Problems, "\n") != want {
		t.Errorf("problems\n%s\nwant\n%s", strings.Join(rep.Problems, "\n"), want)
	}

	for _, tc := range []struct {
		name   string
		target *v1alpha1.TargetStatus
		want   []string
	}{
		{"not reported", nil, []string{"edge: the manager has not reported its target HTTPRoute/api yet"}},
		{"not found", &v1alpha1.TargetStatus{Ref: "HTTPRoute/api"}, []string{"edge: target HTTPRoute/api not found"}},
		{"every state", &v1alpha1.TargetStatus{Ref: "HTTPRoute/api", Found: true, Gateways: []string{"shop/a"}, AppliedObjects: []v1alpha1.AppliedObject{
			{Kind: "EnvoyPatchPolicy", Namespace: "shop", Name: "p", Gateway: "shop/a", State: v1alpha1.AppliedStateProgrammed},
			{Kind: "EnvoyFilter", Namespace: "shop", Name: "f", Gateway: "shop/a", State: v1alpha1.AppliedStateApplied},
			{Kind: "EnvoyFilter", Namespace: "shop", Name: "c", Gateway: "shop/a", State: v1alpha1.AppliedStateConflict, Message: "not created by floodgate"},
			{Kind: "EnvoyFilter", Namespace: "shop", Name: "n", Gateway: "shop/a", State: v1alpha1.AppliedStateNotInstalled},
		}}, []string{
			"edge: EnvoyFilter shop/c for Gateway shop/a is Conflict: not created by floodgate",
			"edge: EnvoyFilter shop/n for Gateway shop/a is NotInstalled",
		}},
	} {
		p := gatewayPolicy()
		p.Status.Target = tc.target
		rep := Build(Input{Namespace: "shop", Policies: []v1alpha1.RateLimitPolicy{p}, Stores: map[string]*v1alpha1.CounterStore{"default": store}})
		if strings.Join(rep.Problems, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("%s: problems\n%s\nwant\n%s", tc.name, strings.Join(rep.Problems, "\n"), strings.Join(tc.want, "\n"))
		}
		if got := rep.Policies[0].Target; got == nil || got.Ref != "HTTPRoute/api" {
			t.Errorf("%s: target %+v, want the ref HTTPRoute/api", tc.name, got)
		}
	}
}
