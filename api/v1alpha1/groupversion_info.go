// Package v1alpha1 is the ratelimit.floodgate.dev/v1alpha1 API: the
// namespaced RateLimitPolicy that users write, and the cluster-scoped
// CounterStore that holds the shared counters.
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
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "ratelimit.floodgate.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this API's types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this API's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
