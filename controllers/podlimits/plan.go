// Package podlimits turns ingress-nginx style pod annotations into
// RateLimitPolicies: a one-line start for a per-client-IP limit.
//
//	metadata:
//	  annotations:
//	    floodgate.dev/limit-rps: "20"              # 20 requests per second per client IP
//	    floodgate.dev/limit-rpm: "600"             # and/or per minute
//	    floodgate.dev/limit-burst-multiplier: "5"  # burst = limit x 5 (the default, as in ingress-nginx)
//	    floodgate.dev/limit-whitelist: "10.0.0.0/8,192.0.2.7"  # never limited
//	    floodgate.dev/limit-trusted-cidrs: "10.0.0.0/8"  # proxies whose X-Forwarded-For is believed
//
// For each workload whose pods carry limit-rps or limit-rpm, the
// controller keeps a RateLimitPolicy named limit-<workload>, labelled
// floodgate.dev/implicit=pod-annotations, with a rule limit-rps and/or
// limit-rpm keyed on the client IP. It is an ordinary policy: it is
// validated, compiled, enforced and reported like any other (kubectl get
// rlp, status.rules with the counts), and it is rewritten from the
// annotations, so edit those, not the policy.
//
// # Which pods
//
// Pods are grouped by their labels without the ones Kubernetes sets per
// pod or per revision (pod-template-hash, controller-revision-hash, ...):
// the pods of one workload, across its rollouts. The policy selects the
// group by those labels. Within a group, the most recently created pod
// decides: its annotations set the limits, and when it has none there is
// no policy, so a rollout that adds, changes or removes the annotations
// takes effect as its new pods come. A group without labels cannot be
// selected apart from the rest of the namespace and gets no policy; an
// annotation that does not parse gets a Warning Event on the pod and no
// policy either.
package podlimits

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// The annotations.
const (
	AnnotationRPS             = "floodgate.dev/limit-rps"
	AnnotationRPM             = "floodgate.dev/limit-rpm"
	AnnotationBurstMultiplier = "floodgate.dev/limit-burst-multiplier"
	AnnotationWhitelist       = "floodgate.dev/limit-whitelist"
	AnnotationTrustedCIDRs    = "floodgate.dev/limit-trusted-cidrs"
)

// ImplicitLabel marks the policies this controller owns, with the value
// ImplicitValue.
const (
	ImplicitLabel = "floodgate.dev/implicit"
	ImplicitValue = "pod-annotations"
)

// DefaultBurstMultiplier is ingress-nginx's default.
const DefaultBurstMultiplier = 5

// perPodLabels are set by Kubernetes per pod or per revision; the others
// identify the workload.
var perPodLabels = []string{
	"pod-template-hash",
	"controller-revision-hash",
	"pod-template-generation",
	"statefulset.kubernetes.io/pod-name",
	"apps.kubernetes.io/pod-index",
	"batch.kubernetes.io/job-completion-index",
	"batch.kubernetes.io/controller-uid",
	"controller-uid",
}

// hasLimit reports whether the pod asks for an implicit limit.
func hasLimit(pod *corev1.Pod) bool {
	_, rps := pod.Annotations[AnnotationRPS]
	_, rpm := pod.Annotations[AnnotationRPM]
	return rps || rpm
}

// groupLabels returns the labels that select the pod's workload.
func groupLabels(pod *corev1.Pod) map[string]string {
	out := map[string]string{}
	for k, v := range pod.Labels {
		if !slices.Contains(perPodLabels, k) {
			out[k] = v
		}
	}
	return out
}

// groupKey is a stable text of a label set.
func groupKey(lbls map[string]string) string {
	keys := make([]string, 0, len(lbls))
	for k := range lbls {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, lbls[k])
	}
	return b.String()
}

// Problem is an annotation that cannot be used, reported on a pod.
type Problem struct {
	Pod     string
	Message string
}

// Plan is the policies the namespace's annotations ask for.
type Plan struct {
	// Policies are the desired policies, ordered by name.
	Policies []v1alpha1.RateLimitPolicy
	// Problems are the annotations that could not be used.
	Problems []Problem
}

// Desired computes the policies that the annotated pods of one namespace
// ask for, stored in store. It is pure.
func Desired(namespace string, pods []corev1.Pod, store string) Plan {
	newest := map[string]*corev1.Pod{}
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		k := groupKey(groupLabels(pod))
		if cur, ok := newest[k]; !ok || newer(pod, cur) {
			newest[k] = pod
		}
	}
	var plan Plan
	names := map[string]bool{}
	for _, k := range slices.Sorted(maps.Keys(newest)) {
		pod := newest[k]
		if !hasLimit(pod) {
			continue
		}
		lbls := groupLabels(pod)
		if len(lbls) == 0 {
			plan.Problems = append(plan.Problems, Problem{Pod: pod.Name,
				Message: "the pod has no labels to select it by, apart from those Kubernetes sets per pod, so floodgate cannot apply its limit-rps/limit-rpm annotations to it alone; label the pod template"})
			continue
		}
		p, err := policyFor(namespace, pod, lbls, store)
		if err != nil {
			plan.Problems = append(plan.Problems, Problem{Pod: pod.Name, Message: err.Error()})
			continue
		}
		if names[p.Name] {
			p.Name = truncName(p.Name, hashOf(k))
		}
		names[p.Name] = true
		plan.Policies = append(plan.Policies, *p)
	}
	slices.SortFunc(plan.Policies, func(a, b v1alpha1.RateLimitPolicy) int { return strings.Compare(a.Name, b.Name) })
	return plan
}

// newer orders pods by creation, then name.
func newer(a, b *corev1.Pod) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	return a.Name > b.Name
}

// policyFor builds the policy of a workload from its newest pod.
func policyFor(namespace string, pod *corev1.Pod, lbls map[string]string, store string) (*v1alpha1.RateLimitPolicy, error) {
	ann := pod.Annotations
	mult := int64(DefaultBurstMultiplier)
	if v, ok := ann[AnnotationBurstMultiplier]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 1 || n > 1000 {
			return nil, fmt.Errorf("annotation %s: %q: must be an integer from 1 to 1000", AnnotationBurstMultiplier, v)
		}
		mult = n
	}
	p := &v1alpha1.RateLimitPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "RateLimitPolicy"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      policyName(workloadName(pod)),
			Namespace: namespace,
			Labels:    map[string]string{ImplicitLabel: ImplicitValue, "app.kubernetes.io/managed-by": "floodgate-manager"},
			Annotations: map[string]string{
				"floodgate.dev/source": fmt.Sprintf("the %s annotations of pod %s and the other pods with its labels; edit those, not this policy", "floodgate.dev/limit-*", pod.Name),
			},
		},
		Spec: v1alpha1.RateLimitPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: lbls},
			StoreRef:    &v1alpha1.StoreReference{Name: store},
		},
	}
	for _, l := range []struct {
		annotation, rule string
		per              time.Duration
	}{{AnnotationRPS, "limit-rps", time.Second}, {AnnotationRPM, "limit-rpm", time.Minute}} {
		v, ok := ann[l.annotation]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 1 || n > limiter.MaxRequests {
			return nil, fmt.Errorf("annotation %s: %q: must be an integer from 1 to %d", l.annotation, v, limiter.MaxRequests)
		}
		burst := n * mult
		if burst > limiter.MaxRequests {
			return nil, fmt.Errorf("annotation %s: %d times the burst multiplier %d exceeds %d", l.annotation, n, mult, limiter.MaxRequests)
		}
		p.Spec.Rules = append(p.Spec.Rules, v1alpha1.Rule{
			Name:  l.rule,
			Key:   []v1alpha1.KeyPart{{ClientIP: &v1alpha1.ClientIPKey{}}},
			Limit: v1alpha1.Limit{Requests: n, Per: metav1.Duration{Duration: l.per}, Burst: burst, Algorithm: v1alpha1.AlgorithmTokenBucket},
		})
	}
	if v, ok := ann[AnnotationWhitelist]; ok {
		cidrs, err := parseCIDRs(AnnotationWhitelist, v)
		if err != nil {
			return nil, err
		}
		if len(cidrs) > 0 {
			p.Spec.Exempt = &v1alpha1.Exempt{SourceCIDRs: cidrs}
		}
	}
	if v, ok := ann[AnnotationTrustedCIDRs]; ok {
		cidrs, err := parseCIDRs(AnnotationTrustedCIDRs, v)
		if err != nil {
			return nil, err
		}
		if len(cidrs) > 0 {
			p.Spec.TrustedProxies = &v1alpha1.TrustedProxies{CIDRs: cidrs}
		}
	}
	if errs := p.ValidateSemantics(); len(errs) > 0 {
		return nil, fmt.Errorf("the annotations make an invalid policy: %w", errs.ToAggregate())
	}
	return p, nil
}

// parseCIDRs reads a comma-separated list of networks; a bare address is
// its own network (/32 or /128), as ingress-nginx reads limit-whitelist.
func parseCIDRs(annotation, v string) ([]v1alpha1.CIDR, error) {
	var out []v1alpha1.CIDR
	seen := map[netip.Prefix]bool{}
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		var p netip.Prefix
		if a, err := netip.ParseAddr(f); err == nil {
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		} else if p, err = netip.ParsePrefix(f); err != nil {
			return nil, fmt.Errorf("annotation %s: %q is not an IP address or a CIDR", annotation, f)
		}
		p = p.Masked()
		if !seen[p] {
			seen[p] = true
			out = append(out, v1alpha1.CIDR(p.String()))
		}
	}
	if len(out) > 64 {
		return nil, fmt.Errorf("annotation %s: at most 64 networks, got %d", annotation, len(out))
	}
	return out, nil
}

// workloadName is the name of the pod's workload: its controller's name,
// without the pod-template-hash a Deployment's ReplicaSet adds; the pod's
// own name without an owner.
func workloadName(pod *corev1.Pod) string {
	if ref := metav1.GetControllerOf(pod); ref != nil {
		name := ref.Name
		if h := pod.Labels["pod-template-hash"]; ref.Kind == "ReplicaSet" && h != "" {
			name = strings.TrimSuffix(name, "-"+h)
		}
		return name
	}
	return pod.Name
}

// policyName is "limit-<workload>", shortened with a digest to a DNS label.
func policyName(workload string) string {
	name := "limit-" + workload
	if len(validation.IsDNS1123Label(name)) == 0 {
		return name
	}
	return truncName(name, hashOf(workload))
}

// truncName fits name and a suffix into a DNS label.
func truncName(name, suffix string) string {
	keep := validation.DNS1123LabelMaxLength - len(suffix) - 1
	if len(name) > keep {
		name = name[:keep]
	}
	return strings.TrimRight(name, "-.") + "-" + suffix
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:4])
}
