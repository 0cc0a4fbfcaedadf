package compiler

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// ServiceInput is everything CompileRateLimitService reads.
type ServiceInput struct {
	// Policies are RateLimitPolicies of any namespace; those without a
	// targetRef, and those being deleted, are ignored.
	Policies []v1alpha1.RateLimitPolicy
	// Pods are the central rate-limit service's pods. Every one of them
	// enforces every policy, so the ready ones set each policy's
	// replicas (the local share of a fail-open rule).
	Pods []corev1.Pod
	// Stores holds the CounterStores the policies reference, by name.
	Stores map[string]*v1alpha1.CounterStore
	// Previous is the document the central service's ConfigMap holds now,
	// or nil.
	Previous *config.Config
	// Targets is what was found of each policy's targetRef, by the
	// policy's "<namespace>/<name>" (Input.Targets).
	Targets map[string]v1alpha1.TargetStatus
}

// CompileRateLimitService compiles the document of the central rate-limit
// service (config.RateLimitServiceConfigMapName): every policy with a
// targetRef, of every namespace, with the same rules as Compile. The
// central service holds one store connection, so all these policies use
// one CounterStore: the earliest-created policy decides, and a later one
// naming another store gets StoreConflict. A policy's entry has no
// podSelector (every replica of the service enforces it); policies are
// told apart by namespace and name, which the gateways send in each
// request descriptor (config.PolicyEntryKey), and an entry lists the
// Gateways that may send them (config.Policy.Gateways): those of its
// found target (Targets), the Gateways that accepted the targeted
// HTTPRoute, or the targeted Gateway. Each result carries its policy's
// Namespace; its TargetedPods and ReadyPods count the service's pods.
func CompileRateLimitService(in ServiceInput) (Output, error) {
	return Compile(Input{
		Policies:         in.Policies,
		Pods:             in.Pods,
		Stores:           in.Stores,
		Previous:         in.Previous,
		Targets:          in.Targets,
		RateLimitService: true,
	})
}
