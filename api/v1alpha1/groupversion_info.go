// Package v1alpha1 is the ratelimit.floodgate.dev/v1alpha1 API: the
// namespaced RateLimitPolicy that users write, the cluster-scoped
// ClusterRateLimitPolicy that platform teams write for many namespaces, and
// the cluster-scoped CounterStore that holds the shared counters.
//
// Validation happens in layers. The OpenAPI schema and the CEL rules
// (x-kubernetes-validations) generated from the markers in this package
// reject bad input at admission, each error naming its field. What CEL
// cannot check, such as compiling a regular expression or validating a label
// selector's operators, is in ValidateSemantics, which the policy controller
// runs before compiling and a validating webhook can call.
//
// +kubebuilder:object:generate=true
// +groupName=ratelimit.floodgate.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "ratelimit.floodgate.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this API's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this API's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers every kind of this group version, and the meta
// types (ListOptions and friends) that clients of the group use.
func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&RateLimitPolicy{}, &RateLimitPolicyList{},
		&CounterStore{}, &CounterStoreList{},
		&ClusterRateLimitPolicy{}, &ClusterRateLimitPolicyList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
