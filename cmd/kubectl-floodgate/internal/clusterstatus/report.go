// Package clusterstatus reports, for the RateLimitPolicies of a namespace,
// what the cluster and the sidecars say about them: their conditions, the
// revision of the namespace's compiled config, the CounterStore's state,
// which targeted pods enforce that revision and which are stale, and what
// each pod's sidecar decided, denials first, over a recent window.
//
// Build is pure: it reads the objects and the metric samples it is given.
// Gather (gather.go) is the edge that reads them from the API server and,
// through the API server's pod proxy, from the sidecars' /metrics.
package clusterstatus

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/programmed"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Input is what Build reads.
type Input struct {
	Namespace string
	// Policies are the policies to report on.
	Policies []v1alpha1.RateLimitPolicy
	// Config is the namespace's compiled config (the ConfigMap
	// floodgate-policies), nil when there is none; ConfigErr says why it
	// could not be read.
	Config    *config.Config
	ConfigErr string
	// Pods are the namespace's pods.
	Pods []corev1.Pod
	// Stores holds the CounterStores the policies reference, by name.
	Stores map[string]*v1alpha1.CounterStore
	// Before and After are the sidecars' metrics by pod name at the start
	// and the end of Window; Before is empty when Window is 0.
	Before, After map[string]Scrape
	Window        time.Duration
}

// Scrape is one pod's metrics, or why they could not be read.
type Scrape struct {
	Samples []Sample
	Err     string
}

// Sample is one metric sample.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Report is the status of the policies.
type Report struct {
	Namespace string         `json:"namespace"`
	Window    string         `json:"window,omitempty"`
	Policies  []PolicyStatus `json:"policies"`
	// Problems lists what is not right, one line each; the plugin exits 1
	// when there are any.
	Problems []string `json:"problems,omitempty"`
}

// PolicyStatus is one policy's status.
type PolicyStatus struct {
	Name               string      `json:"name"`
	Generation         int64       `json:"generation"`
	ObservedGeneration int64       `json:"observedGeneration"`
	Conditions         []Condition `json:"conditions"`
	// Revision is the compiled config's revision, and CompiledGeneration
	// the generation of this policy it holds (0: none).
	Revision           string      `json:"revision,omitempty"`
	CompiledGeneration int64       `json:"compiledGeneration,omitempty"`
	Store              StoreStatus `json:"store"`
	// Target is, for a policy with a targetRef, its status.target: the
	// target, its Gateways, the keys of the generated gateway config, and
	// the gateway objects the manager applied. Such a policy is enforced
	// by the central rate-limit service, whose replicas Enforcing reports
	// (status.enforcing, loaded/running), not by the namespace's pods.
	Target *v1alpha1.TargetStatus `json:"target,omitempty"`
	// ServiceReplicas is status.enforcing of a policy with a targetRef:
	// the central service's replicas that have loaded it, of those
	// running.
	ServiceReplicas string      `json:"serviceReplicas,omitempty"`
	Targeted        int32       `json:"targeted"`
	Enforcing       int32       `json:"enforcing"`
	Pods            []PodStatus `json:"pods"`
	// Rules sums the sidecars' decisions per rule.
	Rules []RuleCounts `json:"rules,omitempty"`
}

// Condition is a status condition, as shown.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// StoreStatus is the CounterStore's state.
type StoreStatus struct {
	Name      string   `json:"name"`
	Found     bool     `json:"found"`
	Ready     string   `json:"ready,omitempty"`
	Degraded  string   `json:"degraded,omitempty"`
	Message   string   `json:"message,omitempty"`
	Endpoints []string `json:"endpoints,omitempty"`
}

// PodStatus is one targeted pod.
type PodStatus struct {
	Name    string `json:"name"`
	Ready   bool   `json:"ready"`
	Sidecar bool   `json:"sidecar"`
	// Loaded is the sidecar's policy-loaded condition: its reason and
	// message (the revision it enforces, when Loaded).
	LoadedReason  string `json:"loadedReason,omitempty"`
	LoadedMessage string `json:"loadedMessage,omitempty"`
	// Enforces reports the current revision in force; Stale a pod that
	// serves or has reported but enforces something else.
	Enforces bool `json:"enforces"`
	Stale    bool `json:"stale"`
	// MetricsRevision is the revision the sidecar's metrics report, and
	// FallbackActive its fallback gauge; MetricsError why the metrics
	// could not be read.
	MetricsRevision string       `json:"metricsRevision,omitempty"`
	FallbackActive  bool         `json:"fallbackActive,omitempty"`
	MetricsError    string       `json:"metricsError,omitempty"`
	Rules           []RuleCounts `json:"rules,omitempty"`
}

// RuleCounts are a rule's decisions: totals since the sidecars started,
// and the increase over the window.
type RuleCounts struct {
	Rule         string  `json:"rule"`
	Allowed      float64 `json:"allowed"`
	Denied       float64 `json:"denied"`
	ShadowDenied float64 `json:"shadowDenied,omitempty"`
	Unavailable  float64 `json:"unavailable,omitempty"`
	// Exempt counts the requests the rule matched and left alone as
	// exempt (its exempt section or its policy's).
	Exempt float64 `json:"exempt,omitempty"`
	// Recent* are the increases over the window.
	RecentAllowed float64 `json:"recentAllowed"`
	RecentDenied  float64 `json:"recentDenied"`
}

// Metric names read from the sidecars.
const (
	MetricDecisions = "floodgate_sidecar_decisions_total"
	MetricConfig    = "floodgate_sidecar_config_info"
	MetricFallback  = "floodgate_sidecar_fallback_active"
	MetricExempt    = "floodgate_sidecar_exempt_total"
)

// Build builds the report.
func Build(in Input) Report {
	rep := Report{Namespace: in.Namespace}
	if in.Window > 0 {
		rep.Window = in.Window.String()
	}
	if in.ConfigErr != "" {
		rep.Problems = append(rep.Problems, "the compiled config cannot be read: "+in.ConfigErr)
	}
	for i := range in.Policies {
		ps, problems := policyStatus(&in, &in.Policies[i])
		rep.Policies = append(rep.Policies, ps)
		rep.Problems = append(rep.Problems, problems...)
	}
	return rep
}

func policyStatus(in *Input, p *v1alpha1.RateLimitPolicy) (PolicyStatus, []string) {
	ps := PolicyStatus{Name: p.Name, Generation: p.Generation, ObservedGeneration: p.Status.ObservedGeneration,
		Targeted: p.Status.TargetedPods, Enforcing: p.Status.EnforcingPods}
	var problems []string
	for _, t := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionResolvedRefs, v1alpha1.ConditionProgrammed} {
		c := meta.FindStatusCondition(p.Status.Conditions, t)
		if c == nil {
			ps.Conditions = append(ps.Conditions, Condition{Type: t, Status: "Unknown", Reason: "NotReported"})
			problems = append(problems, fmt.Sprintf("%s: %s not reported yet", p.Name, t))
			continue
		}
		ps.Conditions = append(ps.Conditions, Condition{Type: t, Status: string(c.Status), Reason: c.Reason, Message: c.Message})
		if c.Status != metav1.ConditionTrue {
			problems = append(problems, fmt.Sprintf("%s: %s is %s (%s): %s", p.Name, t, c.Status, c.Reason, c.Message))
		}
	}
	if p.Status.ObservedGeneration != p.Generation {
		problems = append(problems, fmt.Sprintf("%s: the manager has not observed generation %d yet (status is of %d)", p.Name, p.Generation, p.Status.ObservedGeneration))
	}

	ps.Store = storeStatus(p.StoreName(), in.Stores[p.StoreName()])
	if p.GatewayEnforced() {
		return gatewayPolicyStatus(ps, p, problems)
	}
	if in.Config != nil {
		ps.Revision = in.Config.Revision
		for _, cp := range in.Config.Policies {
			if cp.Name == p.Name {
				ps.CompiledGeneration = cp.Generation
			}
		}
	}
	if ps.CompiledGeneration == 0 {
		problems = append(problems, fmt.Sprintf("%s: not in the namespace's compiled config", p.Name))
	} else if ps.CompiledGeneration != p.Generation {
		problems = append(problems, fmt.Sprintf("%s: the compiled config holds generation %d, not %d", p.Name, ps.CompiledGeneration, p.Generation))
	}

	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
	if err != nil {
		problems = append(problems, fmt.Sprintf("%s: podSelector: %v", p.Name, err))
		return ps, problems
	}
	var targeted []corev1.Pod
	for _, pod := range in.Pods {
		if running(&pod) && sel.Matches(labels.Set(pod.Labels)) {
			targeted = append(targeted, pod)
		}
	}
	if ps.Revision != "" {
		r := programmed.Evaluate(sel, targeted, ps.Revision, ps.CompiledGeneration)
		ps.Targeted, ps.Enforcing = r.Targeted, r.Enforcing
	}
	rules := map[string]*RuleCounts{}
	for i := range targeted {
		pod := &targeted[i]
		pst := podStatus(in, pod, p.Name, ps.Revision)
		if pst.Stale {
			why := "enforces " + pst.LoadedMessage
			if pst.LoadedReason != config.ReasonLoaded {
				why = fmt.Sprintf("%s: %s", pst.LoadedReason, pst.LoadedMessage)
			}
			if !pst.Sidecar {
				why = "has no floodgate sidecar"
			}
			problems = append(problems, fmt.Sprintf("%s: pod %s is stale: %s, not revision %s", p.Name, pod.Name, why, ps.Revision))
		}
		for _, rc := range pst.Rules {
			sum := rules[rc.Rule]
			if sum == nil {
				sum = &RuleCounts{Rule: rc.Rule}
				rules[rc.Rule] = sum
			}
			sum.Allowed += rc.Allowed
			sum.Denied += rc.Denied
			sum.ShadowDenied += rc.ShadowDenied
			sum.Unavailable += rc.Unavailable
			sum.Exempt += rc.Exempt
			sum.RecentAllowed += rc.RecentAllowed
			sum.RecentDenied += rc.RecentDenied
		}
		ps.Pods = append(ps.Pods, pst)
	}
	for _, name := range sortedKeys(rules) {
		ps.Rules = append(ps.Rules, *rules[name])
	}
	return ps, problems
}

// gatewayPolicyStatus completes the status of p, a policy with a
// targetRef: the central rate-limit service enforces it, from a document
// in its own namespace, so the namespace's compiled config and pods say
// nothing of it; its target and the gateway objects the manager applied
// do.
func gatewayPolicyStatus(ps PolicyStatus, p *v1alpha1.RateLimitPolicy, problems []string) (PolicyStatus, []string) {
	ps.Targeted, ps.Enforcing = 0, 0
	ps.ServiceReplicas = p.Status.Enforcing
	t := p.Status.Target.DeepCopy()
	if t == nil {
		problems = append(problems, fmt.Sprintf("%s: the manager has not reported its target %s yet", p.Name, p.Spec.TargetRef))
		t = &v1alpha1.TargetStatus{}
	}
	if t.Ref == "" {
		t.Ref = p.Spec.TargetRef.String()
	}
	ps.Target = t
	if p.Status.Target != nil && !t.Found {
		problems = append(problems, fmt.Sprintf("%s: target %s not found", p.Name, t.Ref))
	}
	for _, a := range t.AppliedObjects {
		switch a.State {
		case v1alpha1.AppliedStateApplied, v1alpha1.AppliedStateProgrammed:
			continue
		}
		msg := fmt.Sprintf("%s: %s %s/%s for Gateway %s is %s", p.Name, a.Kind, a.Namespace, a.Name, a.Gateway, a.State)
		if a.Message != "" {
			msg += ": " + a.Message
		}
		problems = append(problems, msg)
	}
	return ps, problems
}

func storeStatus(name string, cs *v1alpha1.CounterStore) StoreStatus {
	st := StoreStatus{Name: name}
	if cs == nil {
		st.Message = fmt.Sprintf("CounterStore %q does not exist", name)
		return st
	}
	st.Found = true
	st.Endpoints = cs.Status.Endpoints
	if c := meta.FindStatusCondition(cs.Status.Conditions, v1alpha1.ConditionReady); c != nil {
		st.Ready, st.Message = string(c.Status), c.Message
	}
	if c := meta.FindStatusCondition(cs.Status.Conditions, v1alpha1.ConditionDegraded); c != nil {
		st.Degraded = string(c.Status)
		if c.Status == metav1.ConditionTrue {
			st.Message = strings.TrimSpace(st.Message + "; degraded: " + c.Message)
		}
	}
	return st
}

func podStatus(in *Input, pod *corev1.Pod, policy, revision string) PodStatus {
	st := PodStatus{Name: pod.Name, Ready: ready(pod), Sidecar: hasSidecar(pod)}
	for _, c := range pod.Status.Conditions {
		if c.Type == config.ConditionPolicyLoaded {
			st.LoadedReason, st.LoadedMessage = c.Reason, c.Message
		}
	}
	st.Enforces = revision != "" && programmed.Enforces(pod, revision)
	st.Stale = revision != "" && !st.Enforces && (st.Ready || st.LoadedReason != "")
	after, ok := in.After[pod.Name]
	if !ok {
		return st
	}
	if after.Err != "" {
		st.MetricsError = after.Err
		return st
	}
	before := in.Before[pod.Name]
	counts := map[string]*RuleCounts{}
	get := func(rule string) *RuleCounts {
		if counts[rule] == nil {
			counts[rule] = &RuleCounts{Rule: rule}
		}
		return counts[rule]
	}
	for _, s := range after.Samples {
		switch s.Name {
		case MetricConfig:
			if s.Value == 1 {
				st.MetricsRevision = s.Labels["revision"]
			}
		case MetricFallback:
			st.FallbackActive = s.Value > 0
		case MetricDecisions:
			if s.Labels["policy"] != policy {
				continue
			}
			rc := get(s.Labels["rule"])
			recent := s.Value - value(before.Samples, s)
			switch s.Labels["result"] {
			case "allowed":
				rc.Allowed, rc.RecentAllowed = s.Value, recent
			case "denied":
				rc.Denied, rc.RecentDenied = s.Value, recent
			case "shadow_denied":
				rc.ShadowDenied = s.Value
			case "unavailable":
				rc.Unavailable = s.Value
			}
		case MetricExempt:
			if s.Labels["policy"] == policy {
				get(s.Labels["rule"]).Exempt = s.Value
			}
		}
	}
	for _, name := range sortedKeys(counts) {
		st.Rules = append(st.Rules, *counts[name])
	}
	if len(in.Before) == 0 {
		for i := range st.Rules {
			st.Rules[i].RecentAllowed, st.Rules[i].RecentDenied = 0, 0
		}
	}
	return st
}

// value returns the value of the sample of before with the same name and
// labels as s, or 0 (a counter that did not exist yet).
func value(before []Sample, s Sample) float64 {
	for _, b := range before {
		if b.Name == s.Name && sameLabels(b.Labels, s.Labels) {
			return b.Value
		}
	}
	return 0
}

func sameLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func ready(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasSidecar(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.InitContainers, isSidecar) || slices.ContainsFunc(pod.Spec.Containers, isSidecar)
}

func isSidecar(c corev1.Container) bool { return c.Name == config.ContainerName }

// running is the compiler's notion of a targeted pod.
func running(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}
