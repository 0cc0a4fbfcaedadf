package v1alpha1

// GatewayAPIGroup is the API group of the objects a policy's targetRef may
// name.
const GatewayAPIGroup = "gateway.networking.k8s.io"

// The kinds a policy's targetRef may name.
const (
	// KindHTTPRoute is a Gateway API HTTPRoute: the policy applies to the
	// requests the route matches (all its rules, or the rule sectionName
	// names), at every Gateway the route is attached to.
	KindHTTPRoute = "HTTPRoute"
	// KindGRPCRoute is a Gateway API GRPCRoute: the policy applies to the
	// gRPC calls the route matches (all its rules, or the rule sectionName
	// names), at every Gateway the route is attached to, as for an
	// HTTPRoute.
	KindGRPCRoute = "GRPCRoute"
	// KindGateway is a Gateway API Gateway: the policy applies to every
	// request the Gateway routes (on all its listeners, or on the listener
	// sectionName names).
	KindGateway = "Gateway"
)

// TargetReference names the Gateway API object, in the policy's namespace,
// whose requests a policy limits. A gateway enforces such a policy by
// asking floodgate's central rate-limit service (the floodgate-ratelimit
// Deployment) about every request, instead of a sidecar in each pod.
type TargetReference struct {
	// Group is the target's API group: gateway.networking.k8s.io.
	// +required
	// +kubebuilder:validation:Enum=gateway.networking.k8s.io
	Group string `json:"group"`

	// Kind is HTTPRoute, GRPCRoute or Gateway.
	// +required
	// +kubebuilder:validation:Enum=HTTPRoute;GRPCRoute;Gateway
	Kind string `json:"kind"`

	// Name is the target's name, in the policy's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// SectionName narrows the target: the name of one rule of an
	// HTTPRoute or a GRPCRoute, or of one listener of a Gateway. When unset, the policy
	// applies to the whole target.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	SectionName string `json:"sectionName,omitempty"`
}

// String returns the target as Kind/name, or Kind/name/sectionName.
func (t TargetReference) String() string {
	s := t.Kind + "/" + t.Name
	if t.SectionName != "" {
		s += "/" + t.SectionName
	}
	return s
}

// TargetStatus is what the manager found of a policy's targetRef. It
// stands in for targetedPods, which counts pods and has no meaning for a
// policy that a gateway enforces.
type TargetStatus struct {
	// Ref is the target, as Kind/name or Kind/name/sectionName.
	// +optional
	Ref string `json:"ref,omitempty"`

	// Found is true when the target exists (and, with sectionName, has
	// that rule or listener).
	// +optional
	Found bool `json:"found"`

	// Gateways are the Gateways, as namespace/name, that enforce the
	// policy: the target itself, or the parents of an HTTPRoute or a
	// GRPCRoute that have accepted it.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Gateways []string `json:"gateways,omitempty"`

	// Hostnames are the target's hostnames: an HTTPRoute's or a
	// GRPCRoute's, or the Gateway listeners'. Empty means any host.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Hostnames []string `json:"hostnames,omitempty"`

	// GatewayConfig names the key of the ConfigMap floodgate-gateway-config
	// (in the central rate-limit service's namespace) under which the
	// manager publishes what each Gateway needs to send its requests to
	// the central service, for example the Istio EnvoyFilter.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	GatewayConfig []string `json:"gatewayConfig,omitempty"`

	// AppliedObjects are the objects the manager applies to the policy's
	// Gateways when it configures them itself (the chart's
	// gatewayConfig.apply): an Istio EnvoyFilter or an Envoy Gateway
	// EnvoyPatchPolicy per Gateway, and where each stands.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	AppliedObjects []AppliedObject `json:"appliedObjects,omitempty"`
}

// The states of an AppliedObject.
const (
	// AppliedStateApplied: the object is applied. For an EnvoyFilter,
	// which Istio gives no status, this is the last state; an
	// EnvoyPatchPolicy waits for Envoy Gateway's status.
	AppliedStateApplied = "Applied"
	// AppliedStateProgrammed: Envoy Gateway accepted the EnvoyPatchPolicy
	// and programmed its patches into the gateway's Envoy.
	AppliedStateProgrammed = "Programmed"
	// AppliedStateRejected: Envoy Gateway or the API server refused the
	// object; the message says why.
	AppliedStateRejected = "Rejected"
	// AppliedStateConflict: an object of that name exists that the
	// manager did not create; it is left alone.
	AppliedStateConflict = "Conflict"
	// AppliedStateNotInstalled: the API server does not serve the kind
	// (Istio or Envoy Gateway is not installed).
	AppliedStateNotInstalled = "NotInstalled"
)

// AppliedObject is one gateway object the manager applies for a policy.
type AppliedObject struct {
	// Kind is EnvoyFilter or EnvoyPatchPolicy.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Kind string `json:"kind"`

	// Namespace and Name name the object: in the Gateway's namespace,
	// named after the Gateway.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Namespace string `json:"namespace"`
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Gateway is the Gateway the object configures, as namespace/name.
	// +required
	// +kubebuilder:validation:MaxLength=507
	Gateway string `json:"gateway"`

	// State is Applied, Programmed, Rejected, Conflict or NotInstalled.
	// +required
	// +kubebuilder:validation:Enum=Applied;Programmed;Rejected;Conflict;NotInstalled
	State string `json:"state"`

	// Message explains a state other than Applied and Programmed.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}
