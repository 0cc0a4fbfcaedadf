// Package admission is the validating admission webhook of
// RateLimitPolicy: it rejects at admission what the CRD's schema and CEL
// rules cannot check, with one message per problem that names the field.
//
// It adds no rules of its own. Validate runs, in order:
//  1. RateLimitPolicy.ValidateSemantics, the API package's pure validation
//     (regular expressions compile, label selectors are valid, a jwt
//     section with exactly one key source is set when a rule keys on a
//     jwtClaim, the CEL rules repeated for objects built in Go, and each
//     rule's limit through the sidecar's own check, config.Limit.Check,
//     which runs limiter.Limit.Validate: whole microseconds, refill times
//     and scales the algorithms can represent);
//  2. the policy compiler itself, on the policy alone with a stand-in
//     store, so that a policy the webhook admits is one the compiler
//     compiles and the sidecars load.
//
// A failing step stops the next ones, whose messages would repeat the
// same problem less clearly.
//
// Updates that leave the spec unchanged (labels, annotations, finalizers)
// and objects being deleted are admitted without validation, so that an
// object stored before a rule was added can still be cleaned up.
//
// With a Reader, it also refuses a policy that would bring the rules of its
// namespace above config.MaxRules: every pod's sidecar enforces at most
// the rules of its namespace, and is bounded so.
//
// The webhook also returns warnings, which never reject: a storeRef to a
// CounterStore that does not exist, a store different from the one the
// namespace's earlier policies use, a JWT key Secret or ConfigMap that does
// not exist, a rule that opts into onMissingKey: Skip (requests without a
// key pass it), a rule with no key (one counter for all requests), and
// rules removed or renamed by an update (their counters start afresh).
package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	cradmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/policy/compiler"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Path is where the webhook server serves the validator. It is the path
// controller-runtime derives for the type.
const Path = "/validate-ratelimit-floodgate-dev-v1alpha1-ratelimitpolicy"

// ClusterPath is where the webhook server serves the ClusterRateLimitPolicy
// validator.
const ClusterPath = "/validate-ratelimit-floodgate-dev-v1alpha1-clusterratelimitpolicy"

// +kubebuilder:webhook:path=/validate-ratelimit-floodgate-dev-v1alpha1-ratelimitpolicy,mutating=false,failurePolicy=fail,sideEffects=None,groups=ratelimit.floodgate.dev,resources=ratelimitpolicies,verbs=create;update,versions=v1alpha1,name=validate.ratelimitpolicy.floodgate.dev,admissionReviewVersions=v1,serviceName=floodgate-webhook,serviceNamespace=floodgate-system,timeoutSeconds=10

// +kubebuilder:webhook:path=/validate-ratelimit-floodgate-dev-v1alpha1-clusterratelimitpolicy,mutating=false,failurePolicy=fail,sideEffects=None,groups=ratelimit.floodgate.dev,resources=clusterratelimitpolicies,verbs=create;update,versions=v1alpha1,name=validate.clusterratelimitpolicy.floodgate.dev,admissionReviewVersions=v1,serviceName=floodgate-webhook,serviceNamespace=floodgate-system,timeoutSeconds=10

// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=ratelimitpolicies;counterstores,verbs=get;list;watch

// Validator validates RateLimitPolicies. Reader, when set, is used for
// warnings only. It is safe for concurrent use.
type Validator struct {
	// Reader reads CounterStores and the namespace's other policies, for
	// warnings and the namespace's rule bound. The manager's cached client;
	// nil disables both.
	Reader client.Reader
	// APIReader reads the metadata of the Secrets and ConfigMaps that
	// policies reference, from the API server itself (the manager caches
	// neither kind in full). Nil disables those warnings.
	APIReader client.Reader
}

var _ cradmission.Validator[*v1alpha1.RateLimitPolicy] = (*Validator)(nil)

// Setup registers the validators at Path and ClusterPath on mgr's
// webhook server.
func Setup(mgr ctrl.Manager) error {
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.RateLimitPolicy{}).
		WithValidator(&Validator{Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).
		Complete(); err != nil {
		return err
	}
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.ClusterRateLimitPolicy{}).
		WithValidator(&ClusterValidator{}).
		Complete()
}

// ClusterValidator validates ClusterRateLimitPolicies, as Validator does
// RateLimitPolicies: ClusterRateLimitPolicy.ValidateSemantics, then the
// compiler's own check of the entry the sidecars would load. It is safe
// for concurrent use.
type ClusterValidator struct{}

var _ cradmission.Validator[*v1alpha1.ClusterRateLimitPolicy] = (*ClusterValidator)(nil)

// ValidateCreate implements admission.Validator.
func (v *ClusterValidator) ValidateCreate(_ context.Context, p *v1alpha1.ClusterRateLimitPolicy) (cradmission.Warnings, error) {
	if errs := ValidateCluster(p); len(errs) > 0 {
		return nil, apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("ClusterRateLimitPolicy").GroupKind(), p.Name, errs)
	}
	return nil, nil
}

// ValidateUpdate implements admission.Validator.
func (v *ClusterValidator) ValidateUpdate(ctx context.Context, old, p *v1alpha1.ClusterRateLimitPolicy) (cradmission.Warnings, error) {
	if p.DeletionTimestamp != nil || equality.Semantic.DeepEqual(old.Spec, p.Spec) {
		return nil, nil
	}
	return v.ValidateCreate(ctx, p)
}

// ValidateDelete implements admission.Validator; deletions are never
// rejected.
func (v *ClusterValidator) ValidateDelete(context.Context, *v1alpha1.ClusterRateLimitPolicy) (cradmission.Warnings, error) {
	return nil, nil
}

// ValidateCluster returns every problem with p's spec, each with its field
// path. It is pure.
func ValidateCluster(p *v1alpha1.ClusterRateLimitPolicy) field.ErrorList {
	if errs := p.ValidateSemantics(); len(errs) > 0 {
		return errs
	}
	if err := compiler.CheckCluster(p); err != nil {
		return field.ErrorList{field.Invalid(field.NewPath("spec"), field.OmitValueType{}, err.Error())}
	}
	return nil
}

// ValidateCreate implements admission.Validator.
func (v *Validator) ValidateCreate(ctx context.Context, p *v1alpha1.RateLimitPolicy) (cradmission.Warnings, error) {
	if errs := Validate(p); len(errs) > 0 {
		return nil, invalid(p, errs)
	}
	if errs := v.namespaceBound(ctx, p); len(errs) > 0 {
		return nil, invalid(p, errs)
	}
	return v.warnings(ctx, nil, p), nil
}

// ValidateUpdate implements admission.Validator.
func (v *Validator) ValidateUpdate(ctx context.Context, old, p *v1alpha1.RateLimitPolicy) (cradmission.Warnings, error) {
	if p.DeletionTimestamp != nil || equality.Semantic.DeepEqual(old.Spec, p.Spec) {
		return nil, nil
	}
	if errs := Validate(p); len(errs) > 0 {
		return nil, invalid(p, errs)
	}
	if errs := v.namespaceBound(ctx, p); len(errs) > 0 {
		return nil, invalid(p, errs)
	}
	return v.warnings(ctx, old, p), nil
}

// namespaceBound refuses p when the rules of its namespace's policies,
// with p's, would be more than config.MaxRules, the most a sidecar
// enforces.
func (v *Validator) namespaceBound(ctx context.Context, p *v1alpha1.RateLimitPolicy) field.ErrorList {
	if v.Reader == nil {
		return nil
	}
	var others v1alpha1.RateLimitPolicyList
	if err := v.Reader.List(ctx, &others, client.InNamespace(p.Namespace)); err != nil {
		// The cache answers lists of a synced informer; a policy is not
		// refused for a failure of the webhook's own.
		return nil
	}
	total := len(p.Spec.Rules)
	for i := range others.Items {
		if o := &others.Items[i]; o.Name != p.Name && o.DeletionTimestamp == nil {
			total += len(o.Spec.Rules)
		}
	}
	if total > config.MaxRules {
		return field.ErrorList{field.Invalid(field.NewPath("spec", "rules"), len(p.Spec.Rules),
			fmt.Sprintf("the policies of namespace %s would hold %d rules, more than the %d a sidecar enforces; merge rules or spread the workloads over namespaces",
				p.Namespace, total, config.MaxRules))}
	}
	return nil
}

// ValidateDelete implements admission.Validator; deletions are never
// rejected (the configuration does not even send them).
func (v *Validator) ValidateDelete(context.Context, *v1alpha1.RateLimitPolicy) (cradmission.Warnings, error) {
	return nil, nil
}

func invalid(p *v1alpha1.RateLimitPolicy, errs field.ErrorList) error {
	return apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("RateLimitPolicy").GroupKind(), p.Name, errs)
}

// Validate returns every problem with p's spec, each with its field path.
// It is pure.
func Validate(p *v1alpha1.RateLimitPolicy) field.ErrorList {
	if errs := p.ValidateSemantics(); len(errs) > 0 {
		return errs
	}
	return compile(p)
}

// standInStore is a Ready CounterStore for compiling one policy alone; its
// address is never dialled.
func standInStore(name string) *v1alpha1.CounterStore {
	return &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: v1alpha1.CounterStoreStatus{
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "StandIn"}},
			Endpoints:  []string{"admission.invalid:6379"},
		},
	}
}

// compile runs the policy compiler on p alone.
func compile(p *v1alpha1.RateLimitPolicy) field.ErrorList {
	c := p.DeepCopy()
	if c.UID == "" {
		c.UID = types.UID("00000000-0000-0000-0000-000000000000")
	}
	if c.Generation == 0 {
		c.Generation = 1
	}
	out, err := compiler.Compile(compiler.Input{
		Namespace: c.Namespace,
		Policies:  []v1alpha1.RateLimitPolicy{*c},
		Stores:    map[string]*v1alpha1.CounterStore{c.StoreName(): standInStore(c.StoreName())},
	})
	if err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("spec"), err)}
	}
	var errs field.ErrorList
	for _, res := range out.Policies {
		for _, e := range res.Invalid {
			if e.Type == field.ErrorTypeInternal {
				// The compiler's own check: the compiled entry fails the
				// sidecar's validation. It is the input's fault.
				e = field.Invalid(field.NewPath("spec"), field.OmitValueType{}, e.Detail)
			}
			errs = append(errs, e)
		}
	}
	return errs
}

// warnings are the problems that do not make p invalid.
func (v *Validator) warnings(ctx context.Context, old, p *v1alpha1.RateLimitPolicy) cradmission.Warnings {
	var w cradmission.Warnings
	if old != nil {
		names := make([]string, 0, len(p.Spec.Rules))
		for _, r := range p.Spec.Rules {
			names = append(names, r.Name)
		}
		for _, r := range old.Spec.Rules {
			if !slices.Contains(names, r.Name) {
				w = append(w, fmt.Sprintf("spec.rules: rule %q was removed or renamed; a rule's counters are keyed by its name, so a renamed rule starts counting afresh", r.Name))
			}
		}
	}
	for i := range p.Spec.Rules {
		r := &p.Spec.Rules[i]
		path := fmt.Sprintf("spec.rules[%d]", i)
		if r.OnMissingKey == v1alpha1.OnMissingKeySkip {
			w = append(w, fmt.Sprintf("%s.onMissingKey: Skip lets every request that carries none of the rule's keys past rule %q unlimited; Shared (the default) counts them in one counter", path, r.Name))
		}
		if len(r.Key) == 0 && len(r.Keys) == 0 {
			w = append(w, fmt.Sprintf("%s: rule %q has no key: one counter for every request it matches (a global limit)", path, r.Name))
		}
	}
	w = append(w, v.refWarnings(ctx, p)...)
	if v.Reader == nil {
		return w
	}
	store := p.StoreName()
	var cs v1alpha1.CounterStore
	switch err := v.Reader.Get(ctx, client.ObjectKey{Name: store}, &cs); {
	case apierrors.IsNotFound(err):
		w = append(w, fmt.Sprintf("spec.storeRef.name: CounterStore %q does not exist; the policy is not enforced until it does and is Ready", store))
	case err == nil && !meta.IsStatusConditionTrue(cs.Status.Conditions, v1alpha1.ConditionReady):
		w = append(w, fmt.Sprintf("spec.storeRef.name: CounterStore %q is not Ready; the policy is not enforced until it is", store))
	}
	w = append(w, v.meshWarnings(ctx, p)...)
	var others v1alpha1.RateLimitPolicyList
	if err := v.Reader.List(ctx, &others, client.InNamespace(p.Namespace)); err == nil {
		var first *v1alpha1.RateLimitPolicy
		for i := range others.Items {
			o := &others.Items[i]
			if o.UID == p.UID || o.Name == p.Name || o.DeletionTimestamp != nil || !createdBefore(o, p) {
				continue
			}
			if first == nil || o.CreationTimestamp.Before(&first.CreationTimestamp) ||
				(o.CreationTimestamp.Equal(&first.CreationTimestamp) && o.Name < first.Name) {
				first = o
			}
		}
		if first != nil && first.StoreName() != store {
			w = append(w, fmt.Sprintf("spec.storeRef.name: the namespace's sidecars share one CounterStore, %q, used by policy %q, which was created first; this policy uses %q and is not enforced while that holds",
				first.StoreName(), first.Name, store))
		}
	}
	return w
}

// refWarnings warns about JWT key references to objects that do not exist.
func (v *Validator) refWarnings(ctx context.Context, p *v1alpha1.RateLimitPolicy) cradmission.Warnings {
	j := p.Spec.JWT
	if v.APIReader == nil || j == nil {
		return nil
	}
	var w cradmission.Warnings
	for _, ref := range []struct {
		field, kind string
		ref         *v1alpha1.KeyReference
	}{{"spec.jwt.hmacSecretRef", "Secret", j.HMACSecretRef}, {"spec.jwt.jwksConfigMapRef", "ConfigMap", j.JWKSConfigMapRef}} {
		if ref.ref == nil {
			continue
		}
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(ref.kind))
		if err := v.APIReader.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: ref.ref.Name}, m); apierrors.IsNotFound(err) {
			w = append(w, fmt.Sprintf("%s.name: %s %q does not exist in namespace %s; the policy is not enforced (ResolvedRefs=False) until it does, and pods created before it get its keys at their next restart",
				ref.field, ref.kind, ref.ref.Name, p.Namespace))
		}
	}
	return w
}

// createdBefore orders policies as the compiler does: by creation time,
// then name.
func createdBefore(a, b *v1alpha1.RateLimitPolicy) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// istioProxy is the name of the container Istio injects.
const istioProxy = "istio-proxy"

// meshWarnings warns when a rule of p reads the client IP (a clientIP key
// part, sourceCIDRs, or source.address in a condition or an expression)
// without trustedProxies, and p selects pods that run Istio's sidecar:
// Istio's inbound proxy connects to the pod from 127.0.0.6, so every
// client would share one counter, and one network.
func (v *Validator) meshWarnings(ctx context.Context, p *v1alpha1.RateLimitPolicy) cradmission.Warnings {
	if p.GatewayEnforced() || p.Spec.TrustedProxies != nil || !readsClientIP(p) {
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
	if err != nil {
		return nil
	}
	var pods corev1.PodList
	if err := v.Reader.List(ctx, &pods, client.InNamespace(p.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil
	}
	meshed := MeshedPods(pods.Items)
	if len(meshed) == 0 {
		return nil
	}
	if len(meshed) > 3 {
		meshed = append(meshed[:3], fmt.Sprintf("and %d more", len(meshed)-3))
	}
	return cradmission.Warnings{fmt.Sprintf("spec.rules: a rule reads the client IP (clientIP, sourceCIDRs or %s), and selected pods run Istio's sidecar (%s): "+
		"Istio's inbound proxy connects from 127.0.0.6, so every client would look the same; "+
		"set spec.trustedProxies to read the client from X-Forwarded-For, or key on something else (docs/gateways.md)",
		config.VarSource, strings.Join(meshed, ", "))}
}

// readsClientIP reports whether a rule of p, or its exemptions, reads the
// client IP.
func readsClientIP(p *v1alpha1.RateLimitPolicy) bool {
	exempt := func(e *v1alpha1.Exempt) bool {
		return e != nil && (len(e.SourceCIDRs) > 0 || readsSource(e.When))
	}
	parts := func(ks []v1alpha1.KeyPart) bool {
		return slices.ContainsFunc(ks, func(k v1alpha1.KeyPart) bool {
			return k.ClientIP != nil || strings.Contains(string(k.Expression), config.VarSource)
		})
	}
	if exempt(p.Spec.Exempt) {
		return true
	}
	for _, r := range p.Spec.Rules {
		if parts(r.Key) || slices.ContainsFunc(r.Keys, parts) || exempt(r.Exempt) {
			return true
		}
		if m := r.Match; m != nil && (len(m.SourceCIDRs) > 0 || readsSource(m.When)) {
			return true
		}
	}
	return false
}

// readsSource reports whether a condition reads source.address.
func readsSource(when []v1alpha1.Expression) bool {
	return slices.ContainsFunc(when, func(e v1alpha1.Expression) bool { return strings.Contains(string(e), config.VarSource) })
}

// MeshedPods returns the names of the pods that run Istio's sidecar (an
// istio-proxy container, or a native sidecar init container of that name).
func MeshedPods(pods []corev1.Pod) []string {
	var out []string
	for i := range pods {
		pod := &pods[i]
		for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
			if c.Name == istioProxy {
				out = append(out, pod.Name)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}
