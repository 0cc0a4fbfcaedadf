package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxClusterPolicyNameLength bounds a ClusterRateLimitPolicy's name, so
// that its compiled name, "cluster." and the name, fits the sidecar
// config's 63 characters.
const MaxClusterPolicyNameLength = 55

// ClusterPolicyPrefix starts the name a ClusterRateLimitPolicy has in the
// compiled sidecar config, in metrics and in the RateLimit-Policy field:
// "cluster.<name>".
const ClusterPolicyPrefix = "cluster."

// ClusterRateLimitPolicySpec is a platform team's limits for every
// namespace it selects: defaults, which a namespace's RateLimitPolicy may
// tighten, and overrides, which always apply.
//
// Its rules are enforced by the sidecars of the pods it selects, beside
// the namespace's own policies: every rule that matches a request is
// checked and the tightest wins, so a namespace's policy can always add
// tighter limits. A namespace's policy replaces a default rule on the pods
// it targets by having a rule of the same name that tightens it: the same
// match, key, cost, exemptions, failure mode and algorithm, in Enforce
// mode when the default is, with requests per period and capacity no
// larger. A rule of that name that would loosen the default, or differs
// from it otherwise, replaces nothing: the default keeps applying, and the
// RateLimitPolicy's status.rules says so. Overrides are never replaced.
//
// +kubebuilder:validation:XValidation:rule="(has(self.defaults) && size(self.defaults.rules) > 0) || (has(self.overrides) && size(self.overrides.rules) > 0)",message="set defaults, overrides, or both"
// +kubebuilder:validation:XValidation:rule="!has(self.defaults) || !has(self.overrides) || self.defaults.rules.all(d, self.overrides.rules.all(o, o.name != d.name))",message="a rule name is either a default or an override, not both",fieldPath=".overrides"
// +kubebuilder:validation:XValidation:rule="(!has(self.defaults) || self.defaults.rules.all(r, r.key.all(k, !has(k.jwtClaim)))) && (!has(self.overrides) || self.overrides.rules.all(r, r.key.all(k, !has(k.jwtClaim))))",message="a ClusterRateLimitPolicy cannot key on jwtClaim: it has no namespace to hold the keys that verify tokens"
type ClusterRateLimitPolicySpec struct {
	// NamespaceSelector selects the namespaces the policy applies to. The
	// empty selector {} selects every namespace; the manager's own
	// namespace and the system namespaces have no injected sidecars.
	// +required
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`

	// PodSelector selects the pods, in the selected namespaces, whose
	// sidecars enforce the policy. {} selects every pod.
	// +required
	PodSelector metav1.LabelSelector `json:"podSelector"`

	// StoreRef names the CounterStore for namespaces that have no
	// RateLimitPolicy of their own; where they have one, the namespace's
	// store holds these counts too, since a namespace's sidecars share
	// one store. When unset, the CounterStore named "default" is used.
	// +optional
	StoreRef *StoreReference `json:"storeRef,omitempty"`

	// TrustedProxies says how the client IP is read from X-Forwarded-For.
	// +optional
	TrustedProxies *TrustedProxies `json:"trustedProxies,omitempty"`

	// Exempt lists requests none of the policy's rules limit.
	// +optional
	Exempt *Exempt `json:"exempt,omitempty"`

	// Defaults are rules a namespace's policy may tighten.
	// +optional
	Defaults *ClusterRules `json:"defaults,omitempty"`

	// Overrides are rules that always apply.
	// +optional
	Overrides *ClusterRules `json:"overrides,omitempty"`
}

// ClusterRules is a list of rules of a ClusterRateLimitPolicy. Counts are
// kept per namespace: the same client in two namespaces spends two
// budgets.
type ClusterRules struct {
	// Rules are the limits, as in a RateLimitPolicy.
	// +required
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(r, self.exists_one(o, o.name == r.name))",message="rule names must be unique within a policy"
	Rules []Rule `json:"rules"`
}

// ClusterRateLimitPolicyStatus is what the manager observed and did.
type ClusterRateLimitPolicyStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions are Accepted (the spec is valid).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Namespaces is the number of namespaces the namespaceSelector
	// selects.
	// +optional
	Namespaces int32 `json:"namespaces"`
}

// ClusterRateLimitPolicy sets limits for every namespace it selects: a
// floor of defaults that each namespace's RateLimitPolicy may tighten but
// not loosen, and overrides that always apply.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=crlp,categories=floodgate
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 55",message="the name must be at most 55 characters: the sidecars know the policy as cluster.<name>, at most 63"
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Namespaces",type=integer,JSONPath=`.status.namespaces`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterRateLimitPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired behaviour.
	// +required
	Spec ClusterRateLimitPolicySpec `json:"spec"`

	// Status is the observed state.
	// +optional
	Status ClusterRateLimitPolicyStatus `json:"status,omitempty"`
}

// StoreName returns the name of the CounterStore the policy names.
func (p *ClusterRateLimitPolicy) StoreName() string {
	if p.Spec.StoreRef == nil || p.Spec.StoreRef.Name == "" {
		return DefaultCounterStoreName
	}
	return p.Spec.StoreRef.Name
}

// ClusterRateLimitPolicyList is a list of ClusterRateLimitPolicy.
//
// +kubebuilder:object:root=true
type ClusterRateLimitPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the policies.
	Items []ClusterRateLimitPolicy `json:"items"`
}
