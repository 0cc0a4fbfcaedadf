package v1alpha1

// Condition types of a RateLimitPolicy.
const (
	// ConditionAccepted is True when the spec is valid. When False, the
	// message names every invalid field, and the last accepted generation,
	// if any, keeps running.
	ConditionAccepted = "Accepted"
	// ConditionResolvedRefs is True when every object the policy names
	// resolves: its CounterStore exists and is Ready, and the Secret or
	// ConfigMap of its JWT keys exists.
	ConditionResolvedRefs = "ResolvedRefs"
	// ConditionProgrammed is True when the targeted sidecars enforce the
	// policy's current generation.
	ConditionProgrammed = "Programmed"
)

// Condition reasons of a RateLimitPolicy.
const (
	// ReasonAccepted: the spec is valid.
	ReasonAccepted = "Accepted"
	// ReasonInvalid: the spec has errors that the API server's schema and
	// CEL rules cannot catch, such as a regular expression that does not
	// compile.
	ReasonInvalid = "Invalid"

	// ReasonResolvedRefs: the CounterStore exists and is Ready.
	ReasonResolvedRefs = "ResolvedRefs"
	// ReasonStoreNotFound: no CounterStore has the referenced name.
	ReasonStoreNotFound = "StoreNotFound"
	// ReasonStoreNotReady: the CounterStore exists but is not Ready, or
	// publishes no endpoints yet.
	ReasonStoreNotReady = "StoreNotReady"
	// ReasonStoreConflict: another policy of the namespace, created
	// earlier, uses a different CounterStore. A namespace's sidecars share
	// one store.
	ReasonStoreConflict = "StoreConflict"
	// ReasonRefNotFound: the Secret or ConfigMap that holds the policy's
	// JWT keys does not exist. The message names the field.
	ReasonRefNotFound = "RefNotFound"

	// ReasonWaitingForSidecars: the policy is compiled into the
	// namespace's ConfigMap, and the sidecars have not yet reported it
	// loaded.
	ReasonWaitingForSidecars = "WaitingForSidecars"
	// ReasonWaitingForRateLimitService: a policy with a targetRef is
	// compiled into the central rate-limit service's ConfigMap, and the
	// service's replicas have not yet reported it loaded (or none runs).
	ReasonWaitingForRateLimitService = "WaitingForRateLimitService"
	// ReasonPending: the current generation cannot be compiled until it is
	// Accepted and its references resolve. The message says whether an
	// earlier generation keeps running.
	ReasonPending = "Pending"
	// ReasonConfigMapError: writing the namespace's ConfigMap failed; the
	// manager retries with backoff.
	ReasonConfigMapError = "ConfigMapError"
	// ReasonDocumentFull: the policy is valid, but the compiled document
	// has no room for it: the namespace's ConfigMap is full, or, for a
	// policy with a targetRef, the namespace's share of the central
	// rate-limit service's document is. The policies created first are
	// kept; the message gives the share and what the policy needs.
	ReasonDocumentFull = "DocumentFull"
	// ReasonGatewayConfigPending: the manager applies the gateways'
	// objects (the chart's gatewayConfig.apply) and one of the policy's
	// is not in place yet: not yet applied, its kind's CRD is not
	// installed, or Envoy Gateway has not yet accepted and programmed it.
	// status.target.appliedObjects says which.
	ReasonGatewayConfigPending = "GatewayConfigPending"
	// ReasonGatewayConfigRejected: the gateway refused an object the
	// manager applied for the policy (Envoy Gateway's Accepted or
	// Programmed condition is False), or the API server refused it.
	ReasonGatewayConfigRejected = "GatewayConfigRejected"
	// ReasonGatewayConfigConflict: an object with the name the manager
	// would apply exists and was not created by the manager, which
	// leaves it alone.
	ReasonGatewayConfigConflict = "GatewayConfigConflict"
)

// Condition types of a CounterStore.
const (
	// ConditionReady is True when every hash slot is served and the
	// endpoints are published.
	ConditionReady = "Ready"
	// ConditionDegraded is True when the store serves every slot but has
	// lost redundancy, for example a shard without a healthy replica.
	ConditionDegraded = "Degraded"
)
