package compiler

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/big"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// ClusterEntryUID is the uid of a ClusterRateLimitPolicy's entry in the
// document of namespace ns: its own uid and a digest of the namespace, so
// that each namespace counts apart and the uid stays within the sidecar
// config's 64 characters.
func ClusterEntryUID(uid, ns string) string {
	sum := sha256.Sum256([]byte(ns))
	return uid + "." + hex.EncodeToString(sum[:6])
}

// ClusterEntryName is the name of a ClusterRateLimitPolicy in the
// document, in metrics and in the RateLimit-Policy field.
func ClusterEntryName(name string) string { return v1alpha1.ClusterPolicyPrefix + name }

// selectsNamespace reports whether the cluster policy applies to a
// namespace with the given labels.
func selectsNamespace(c *v1alpha1.ClusterRateLimitPolicy, nsLabels map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(&c.Spec.NamespaceSelector)
	return err == nil && sel.Matches(labels.Set(nsLabels))
}

// hasSidecar reports whether the pod runs floodgate's sidecar.
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

// countSidecars counts the running pods sel matches that run the sidecar.
func countSidecars(sel labels.Selector, pods []corev1.Pod) int32 {
	var n int32
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if sel.Matches(labels.Set(pod.Labels)) && hasSidecar(pod) {
			n++
		}
	}
	return n
}

// compileCluster is the entry of a ClusterRateLimitPolicy in the document
// of namespace ns: its defaults, then its overrides.
func compileCluster(c *v1alpha1.ClusterRateLimitPolicy, ns string, replicas int32) config.Policy {
	out := config.Policy{
		Name:           ClusterEntryName(c.Name),
		UID:            ClusterEntryUID(string(c.UID), ns),
		Generation:     c.Generation,
		Replicas:       replicas,
		PodSelector:    compileSelector(c.Spec.PodSelector),
		TrustedProxies: compileTrustedProxies(c.Spec.TrustedProxies),
		Exempt:         compileExempt(c.Spec.Exempt),
	}
	for _, list := range []*v1alpha1.ClusterRules{c.Spec.Defaults, c.Spec.Overrides} {
		if list == nil {
			continue
		}
		for i := range list.Rules {
			out.Rules = append(out.Rules, compileRule(&list.Rules[i]))
		}
	}
	return out
}

// clusterRules lists a cluster policy's rules with their kind.
func clusterRules(c *v1alpha1.ClusterRateLimitPolicy) []clusterRule {
	var out []clusterRule
	if c.Spec.Defaults != nil {
		for i := range c.Spec.Defaults.Rules {
			out = append(out, clusterRule{rule: &c.Spec.Defaults.Rules[i], kind: v1alpha1.ClusterRuleDefault})
		}
	}
	if c.Spec.Overrides != nil {
		for i := range c.Spec.Overrides.Rules {
			out = append(out, clusterRule{rule: &c.Spec.Overrides.Rules[i], kind: v1alpha1.ClusterRuleOverride})
		}
	}
	return out
}

type clusterRule struct {
	rule *v1alpha1.Rule
	kind v1alpha1.ClusterRuleKind
}

// overlaps reports whether the team policy's pods and the cluster
// policy's meet: some running pod is selected by both, or the cluster
// policy selects every pod.
func overlaps(c *v1alpha1.ClusterRateLimitPolicy, team *v1alpha1.RateLimitPolicy, pods []corev1.Pod) bool {
	cs, err := metav1.LabelSelectorAsSelector(&c.Spec.PodSelector)
	if err != nil {
		return false
	}
	if cs.Empty() {
		return true
	}
	ts, err := metav1.LabelSelectorAsSelector(&team.Spec.PodSelector)
	if err != nil {
		return false
	}
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp == nil && cs.Matches(labels.Set(pod.Labels)) && ts.Matches(labels.Set(pod.Labels)) {
			return true
		}
	}
	return false
}

// replacement decides whether a team policy's rule replaces the cluster
// default of the same name. It does when it tightens the default: the
// same rule (match, key, missing-key behaviour, cost, exemptions,
// algorithm and onExceed, under the same trusted proxies and without an
// exemption of the team policy's own), failing closed where the default
// does, enforced where the default is, holding a request no longer than a
// Delay default does, with no more requests per period and no more
// capacity (for a concurrency cap: the same priority and no more requests
// in flight). Otherwise the default keeps applying beside the team's rule.
func replacement(c *v1alpha1.ClusterRateLimitPolicy, d *v1alpha1.Rule, team *v1alpha1.RateLimitPolicy, r *v1alpha1.Rule) v1alpha1.ClusterDefaultStatus {
	st := v1alpha1.ClusterDefaultStatus{Policy: c.Name}
	cd, cr := compileRule(d), compileRule(r)
	differs := func(what string) v1alpha1.ClusterDefaultStatus {
		st.Reason = v1alpha1.ReasonDiffers
		st.Message = fmt.Sprintf("Rule %q is not a tightening of the default %q of ClusterRateLimitPolicy %s: %s. The default keeps applying to this policy's pods beside it.",
			r.Name, d.Name, c.Name, what)
		return st
	}
	loosens := func(what string) v1alpha1.ClusterDefaultStatus {
		st.Reason = v1alpha1.ReasonLoosens
		st.Message = fmt.Sprintf("Rule %q would loosen the default %q of ClusterRateLimitPolicy %s: %s. A namespace's policy can tighten a default but not loosen it, so the default keeps applying to this policy's pods beside it.",
			r.Name, d.Name, c.Name, what)
		return st
	}
	switch {
	case !reflect.DeepEqual(cd.Match, cr.Match):
		return differs("its match differs")
	case !reflect.DeepEqual(cd.Key, cr.Key):
		return differs("its key differs")
	case cd.OnMissingKey != cr.OnMissingKey:
		return differs(fmt.Sprintf("its onMissingKey is %s, the default's %s", cr.OnMissingKey, cd.OnMissingKey))
	case cd.Cost != cr.Cost:
		return differs("its cost differs")
	case !reflect.DeepEqual(cd.Exempt, cr.Exempt):
		return differs("its exempt section differs")
	case team.Spec.Exempt != nil:
		return differs("the policy's exempt section would exempt requests the default limits")
	case !reflect.DeepEqual(compileTrustedProxies(team.Spec.TrustedProxies), compileTrustedProxies(c.Spec.TrustedProxies)):
		return differs("the policy reads the client IP with other trustedProxies")
	case (cd.Concurrency == nil) != (cr.Concurrency == nil) || cd.IsRate() != cr.IsRate():
		return differs("one limits a rate, the other requests in flight or neither")
	case cd.Priority != cr.Priority:
		return differs(fmt.Sprintf("its priority is %q, the default's %q", cr.Priority, cd.Priority))
	case cd.Concurrency != nil && cr.Concurrency.Max > cd.Concurrency.Max:
		return loosens(fmt.Sprintf("%d requests in flight is more than %d", cr.Concurrency.Max, cd.Concurrency.Max))
	case cd.Limit.OnExceed != cr.Limit.OnExceed:
		return differs(fmt.Sprintf("its onExceed is %s, the default's %s", or(cr.Limit.OnExceed, config.OnExceedDeny), or(cd.Limit.OnExceed, config.OnExceedDeny)))
	case cd.Limit.Algorithm != cr.Limit.Algorithm:
		return differs(fmt.Sprintf("its algorithm is %s, the default's %s", cr.Limit.Algorithm, cd.Limit.Algorithm))
	case cr.Limit.MaxDelay.Duration > cd.Limit.MaxDelay.Duration:
		return loosens(fmt.Sprintf("it holds a request up to %v, the default %v, so it denies fewer", cr.Limit.MaxDelay.Duration, cd.Limit.MaxDelay.Duration))
	case cd.Mode == config.ModeEnforce && cr.Mode == config.ModeShadow:
		return loosens("it is in Shadow mode, the default enforces")
	case cd.FailureMode == config.FailureClosed && cr.FailureMode == config.FailureOpen:
		return loosens("it fails open, the default fails closed")
	case fasterThan(r.Limit, d.Limit):
		return loosens(fmt.Sprintf("%d per %s is more than %d per %s", r.Limit.Requests, r.Limit.Per.Duration, d.Limit.Requests, d.Limit.Per.Duration))
	case r.Limit.Capacity() > d.Limit.Capacity():
		return loosens(fmt.Sprintf("a capacity of %d is more than %d", r.Limit.Capacity(), d.Limit.Capacity()))
	}
	st.Replaced = true
	st.Reason = v1alpha1.ReasonTightens
	st.Message = fmt.Sprintf("Rule %q tightens the default %q of ClusterRateLimitPolicy %s and replaces it on this policy's pods.", r.Name, d.Name, c.Name)
	return st
}

// fasterThan reports whether a admits more requests per unit of time than
// b, exactly: a.requests/a.per > b.requests/b.per.
func fasterThan(a, b v1alpha1.Limit) bool {
	l := new(big.Int).Mul(big.NewInt(a.Requests), big.NewInt(int64(b.Per.Duration)))
	r := new(big.Int).Mul(big.NewInt(b.Requests), big.NewInt(int64(a.Per.Duration)))
	return l.Cmp(r) > 0
}

// CheckCluster compiles a ClusterRateLimitPolicy's entry for a stand-in
// namespace and runs the sidecar's validation on it, so that a policy the
// webhook admits is one the sidecars load.
func CheckCluster(c *v1alpha1.ClusterRateLimitPolicy) error {
	entry := compileCluster(c, "admission", 1)
	if entry.UID == ClusterEntryUID("", "admission") {
		entry.UID = ClusterEntryUID("00000000-0000-0000-0000-000000000000", "admission")
	}
	store := config.Store{Type: config.StoreRedis, Addresses: []string{"admission.invalid:6379"}}
	return checkEntry(entry, store)
}
