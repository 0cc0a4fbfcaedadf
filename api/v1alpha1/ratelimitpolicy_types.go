package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// DefaultCounterStoreName is the CounterStore a policy without a storeRef
// uses.
const DefaultCounterStoreName = "default"

// RateLimitPolicySpec is what a user asks for: which pods enforce which
// limits, and where the shared counts live.
//
// +kubebuilder:validation:XValidation:rule="has(self.jwt) || self.rules.all(r, r.key.all(k, !has(k.jwtClaim)))",message="jwt must be set when a rule keys on a jwtClaim, so that tokens are verified before their claims count",fieldPath=".jwt"
// +kubebuilder:validation:XValidation:rule="has(self.podSelector) != has(self.targetRef)",message="set exactly one of podSelector (the pods whose sidecars enforce the policy) and targetRef (a Gateway API HTTPRoute or Gateway whose gateway enforces it)"
type RateLimitPolicySpec struct {
	// PodSelector selects the pods, in the policy's namespace, whose
	// sidecars enforce this policy. The empty selector {} selects every pod
	// of the namespace. Exactly one of podSelector and targetRef is set.
	// (A zero LabelSelector is omitted when the object is written from
	// Go; to select every pod from Go, set MatchLabels to an empty map.)
	// +optional
	PodSelector metav1.LabelSelector `json:"podSelector,omitzero"`

	// TargetRef names a Gateway API HTTPRoute or Gateway, in the policy's
	// namespace, whose gateway enforces this policy through floodgate's
	// central rate-limit service, instead of pods' sidecars. Exactly one
	// of podSelector and targetRef is set.
	// +optional
	TargetRef *TargetReference `json:"targetRef,omitempty"`

	// StoreRef names the CounterStore that holds this policy's shared
	// counts. When unset, the CounterStore named "default" is used. All the
	// policies of a namespace must use the same store, because a
	// namespace's sidecars share one store connection.
	// +optional
	StoreRef *StoreReference `json:"storeRef,omitempty"`

	// Rules are the limits. Every rule that matches a request is checked,
	// and if any rule denies, the request is denied. A denying rule spends
	// nothing.
	// +required
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(r, self.exists_one(o, o.name == r.name))",message="rule names must be unique within a policy"
	Rules []Rule `json:"rules"`

	// TrustedProxies says how the client IP is read from X-Forwarded-For.
	// When unset, the client IP is the connection's peer address.
	// +optional
	TrustedProxies *TrustedProxies `json:"trustedProxies,omitempty"`

	// JWT says how bearer tokens are verified before their claims may key
	// a rule. It is required when any rule has a jwtClaim key part.
	// +optional
	JWT *JWT `json:"jwt,omitempty"`
}

// StoreReference names a cluster-scoped CounterStore.
type StoreReference struct {
	// Name is the CounterStore's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
}

// Rule is one limit with the requests it applies to.
//
// +kubebuilder:validation:XValidation:rule="!has(self.cost) || !has(self.cost.default) || self.cost.default <= (has(self.limit.burst) && self.limit.burst > 0 ? self.limit.burst : self.limit.requests)",message="cost.default must not exceed the rule's capacity (limit.burst, or limit.requests when burst is unset), or every request would be denied",fieldPath=".cost.default"
// +kubebuilder:validation:XValidation:rule="!has(self.cost) || !has(self.cost.max) || self.cost.max <= (has(self.limit.burst) && self.limit.burst > 0 ? self.limit.burst : self.limit.requests)",message="cost.max must not exceed the rule's capacity (limit.burst, or limit.requests when burst is unset)",fieldPath=".cost.max"
type Rule struct {
	// Name identifies the rule within its policy: in metrics, in response
	// headers and in the counter keys. Renaming a rule starts its counts
	// afresh.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Match selects the requests the rule applies to. When unset, the rule
	// applies to every request.
	// +optional
	Match *RuleMatch `json:"match,omitempty"`

	// Key lists the descriptor parts whose values identify a counter: one
	// counter per distinct combination of values.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	Key []KeyPart `json:"key"`

	// OnMissingKey says what happens when a key part cannot be read from a
	// request: Skip (the rule does not apply), Shared (all such requests
	// share one counter) or Reject (answer 400).
	// +optional
	// +kubebuilder:default=Skip
	OnMissingKey OnMissingKey `json:"onMissingKey,omitempty"`

	// Limit is the rate.
	// +required
	Limit Limit `json:"limit"`

	// Cost says what each request spends. When unset, each request costs
	// 1.
	// +optional
	Cost *Cost `json:"cost,omitempty"`

	// FailureMode says what the sidecar does when the counter store is
	// unreachable: Open falls back to a local bucket of limit/replicas,
	// Closed answers 503.
	// +optional
	// +kubebuilder:default=Open
	FailureMode FailureMode `json:"failureMode,omitempty"`

	// Mode is Enforce, or Shadow to count and report without ever
	// blocking: the way to try a new limit on live traffic.
	// +optional
	// +kubebuilder:default=Enforce
	Mode Mode `json:"mode,omitempty"`
}

// OnMissingKey is the behaviour when a key part is absent from a request.
// +kubebuilder:validation:Enum=Skip;Shared;Reject
type OnMissingKey string

// The OnMissingKey values.
const (
	OnMissingKeySkip   OnMissingKey = "Skip"
	OnMissingKeyShared OnMissingKey = "Shared"
	OnMissingKeyReject OnMissingKey = "Reject"
)

// FailureMode is the behaviour when the counter store is unreachable.
// +kubebuilder:validation:Enum=Open;Closed
type FailureMode string

// The FailureMode values.
const (
	FailureModeOpen   FailureMode = "Open"
	FailureModeClosed FailureMode = "Closed"
)

// Mode says whether a rule blocks.
// +kubebuilder:validation:Enum=Enforce;Shadow
type Mode string

// The Mode values.
const (
	ModeEnforce Mode = "Enforce"
	ModeShadow  Mode = "Shadow"
)

// RuleMatch selects requests. All the conditions that are set must hold.
type RuleMatch struct {
	// Path matches the request path.
	// +optional
	Path *PathMatch `json:"path,omitempty"`

	// Methods, when set, restricts the rule to these HTTP methods.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=9
	Methods []HTTPMethod `json:"methods,omitempty"`

	// Headers, when set, must all be present on the request, with the
	// given value where one is given.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Headers []HeaderMatch `json:"headers,omitempty"`

	// Hosts, when set, restricts the rule to requests for these hosts
	// (the Host header, or :authority, without its port, compared without
	// case): an exact name such as api.example.com, or a wildcard
	// *.example.com, which matches any name under example.com (one label
	// or more) but not example.com itself, as Gateway API hostnames do.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	Hosts []Hostname `json:"hosts,omitempty"`
}

// Hostname is a DNS name, or a wildcard "*." followed by one.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:Pattern=`^(\*\.)?[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*$`
type Hostname string

// HTTPMethod is an HTTP request method.
// +kubebuilder:validation:Enum=GET;HEAD;POST;PUT;PATCH;DELETE;OPTIONS;CONNECT;TRACE
type HTTPMethod string

// PathMatchType says how a PathMatch value is compared with the path.
// +kubebuilder:validation:Enum=Exact;Prefix;RegularExpression
type PathMatchType string

// The PathMatchType values.
const (
	PathMatchExact             PathMatchType = "Exact"
	PathMatchPrefix            PathMatchType = "Prefix"
	PathMatchRegularExpression PathMatchType = "RegularExpression"
)

// PathMatch matches the request path.
//
// +kubebuilder:validation:XValidation:rule="self.type == 'RegularExpression' || self.value.matches('^/[-A-Za-z0-9/._~!$&()+,;=:@%]*$')",message="must be a literal absolute path (a leading / and no pattern characters such as * ^ | [ ] { } ?) when type is Exact or Prefix; use type RegularExpression for a pattern",fieldPath=".value"
type PathMatch struct {
	// Type is Exact, Prefix or RegularExpression.
	// +optional
	// +kubebuilder:default=Prefix
	Type PathMatchType `json:"type,omitempty"`

	// Value is the path, or for RegularExpression a pattern in RE2 syntax
	// (the syntax of Go's regexp package).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Value string `json:"value"`
}

// HeaderMatch matches one request header.
type HeaderMatch struct {
	// Name is the header name, matched case-insensitively.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	Name string `json:"name"`

	// Value, when set, must equal the header's value exactly. When unset,
	// the header only has to be present.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value,omitempty"`
}

// KeyPart is one descriptor part of a counter key. Exactly one field is
// set.
//
// +kubebuilder:validation:XValidation:rule="[has(self.header), has(self.query), has(self.clientIP), has(self.jwtClaim), has(self.path), has(self.method)].filter(x, x).size() == 1",message="exactly one of header, query, clientIP, jwtClaim, path or method must be set in each key part"
type KeyPart struct {
	// Header keys on the value of this request header.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	Header string `json:"header,omitempty"`

	// Query keys on the value of this query parameter.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Query string `json:"query,omitempty"`

	// ClientIP keys on the client IP address, read as trustedProxies says.
	// +optional
	ClientIP *ClientIPKey `json:"clientIP,omitempty"`

	// JWTClaim keys on this claim of the verified bearer token.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	JWTClaim string `json:"jwtClaim,omitempty"`

	// Path keys on the request path.
	// +optional
	Path *PathKey `json:"path,omitempty"`

	// Method keys on the request method.
	// +optional
	Method *MethodKey `json:"method,omitempty"`
}

// ClientIPKey selects the client IP as a key part. It has no fields; write
// it as {}.
type ClientIPKey struct{}

// PathKey selects the request path as a key part. It has no fields; write it
// as {}.
type PathKey struct{}

// MethodKey selects the request method as a key part. It has no fields;
// write it as {}.
type MethodKey struct{}

// Algorithm names a limiting algorithm.
// +kubebuilder:validation:Enum=TokenBucket;GCRA;SlidingWindow;FixedWindow;SlidingLog
type Algorithm string

// The Algorithm values. They are the names sidecar/limiter parses.
const (
	AlgorithmTokenBucket   Algorithm = "TokenBucket"
	AlgorithmGCRA          Algorithm = "GCRA"
	AlgorithmSlidingWindow Algorithm = "SlidingWindow"
	AlgorithmFixedWindow   Algorithm = "FixedWindow"
	AlgorithmSlidingLog    Algorithm = "SlidingLog"
)

// MaxSlidingLogRequests bounds Requests for SlidingLog, which stores one
// entry per admitted request in each key's log. It is the limiter's bound.
const MaxSlidingLogRequests = limiter.MaxLogRequests

// Limit is Requests per Per, shaped by Algorithm.
//
// +kubebuilder:validation:XValidation:rule="!has(self.burst) || self.algorithm in ['TokenBucket', 'GCRA']",message="burst is only valid with the TokenBucket and GCRA algorithms; the window algorithms count requests per period",fieldPath=".burst"
// +kubebuilder:validation:XValidation:rule="self.algorithm != 'SlidingLog' || self.requests <= 100000",message="SlidingLog keeps one entry per admitted request, so requests must be at most 100000; use SlidingWindow for larger limits",fieldPath=".requests"
type Limit struct {
	// Requests is the number of requests admitted per period. It sets the
	// rate for TokenBucket and GCRA and the count per window for the
	// window algorithms.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	Requests int64 `json:"requests"`

	// Per is the period, between 1s and 366d (8784h), written as a Go
	// duration such as 1s, 1m, 1h or 24h.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') || (duration(self) >= duration('1s') && duration(self) <= duration('8784h'))",message="must be between 1s and 366d (8784h)"
	Per metav1.Duration `json:"per"`

	// Burst is the bucket capacity for TokenBucket and GCRA: how many
	// requests a client that has been idle may send at once. When unset,
	// it is Requests.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	Burst int64 `json:"burst,omitempty"`

	// Algorithm is TokenBucket, GCRA, SlidingWindow, FixedWindow or
	// SlidingLog.
	// +optional
	// +kubebuilder:default=TokenBucket
	Algorithm Algorithm `json:"algorithm,omitempty"`
}

// Capacity returns the most a single key can spend at once: Burst, or
// Requests when Burst is 0.
func (l Limit) Capacity() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}

// Cost says what a request spends.
//
// +kubebuilder:validation:XValidation:rule="!has(self.max) || has(self.fromHeader)",message="max bounds a header-supplied cost, so it needs fromHeader",fieldPath=".max"
// +kubebuilder:validation:XValidation:rule="!has(self.max) || !has(self.default) || self.default <= self.max",message="default must not exceed max",fieldPath=".default"
type Cost struct {
	// FromHeader reads the cost from this request header when the request
	// carries it. A value that is not a positive integer, or exceeds Max,
	// is answered with 400.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	FromHeader string `json:"fromHeader,omitempty"`

	// Default is the cost when FromHeader is unset or absent.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	Default int64 `json:"default,omitempty"`

	// Max bounds a header-supplied cost. When unset, it is the rule's
	// capacity.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	Max int64 `json:"max,omitempty"`
}

// TrustedProxies configures how the client IP is read from
// X-Forwarded-For.
//
// +kubebuilder:validation:XValidation:rule="(has(self.cidrs) && size(self.cidrs) > 0) || (has(self.hops) && self.hops > 0)",message="set cidrs, hops, or both"
type TrustedProxies struct {
	// CIDRs are the proxies whose X-Forwarded-For entries are believed.
	// The client IP is the right-most address not in these ranges.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	CIDRs []CIDR `json:"cidrs,omitempty"`

	// Hops, when non-zero, trusts exactly this many proxies in front of
	// the pod: the client IP is the Hops-th address from the right of
	// X-Forwarded-For.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	Hops int32 `json:"hops,omitempty"`
}

// CIDR is an IPv4 or IPv6 network in CIDR notation with no host bits set,
// such as 10.0.0.0/8 or fd00::/8.
//
// +kubebuilder:validation:MaxLength=49
// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="must be a CIDR with no host bits set, such as 10.0.0.0/8 or fd00::/8"
type CIDR string

// JWT configures the verification of bearer tokens. Exactly one of
// HMACSecretRef, JWKSConfigMapRef and UpstreamVerified is set.
//
// +kubebuilder:validation:XValidation:rule="[has(self.hmacSecretRef), has(self.jwksConfigMapRef), has(self.upstreamVerified) && self.upstreamVerified].filter(x, x).size() == 1",message="set exactly one of hmacSecretRef, jwksConfigMapRef, or upstreamVerified: true"
type JWT struct {
	// Header carries the token. When unset, the token is read from
	// Authorization with a "Bearer " prefix.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	Header string `json:"header,omitempty"`

	// HMACSecretRef names a Secret key, in the policy's namespace, that
	// holds the HMAC key for HS256, HS384 and HS512 tokens.
	// +optional
	HMACSecretRef *KeyReference `json:"hmacSecretRef,omitempty"`

	// JWKSConfigMapRef names a ConfigMap key, in the policy's namespace,
	// that holds a JSON Web Key Set for RS*, ES* and EdDSA tokens. A key
	// set is public, so it lives in a ConfigMap rather than a Secret.
	// +optional
	JWKSConfigMapRef *KeyReference `json:"jwksConfigMapRef,omitempty"`

	// Issuer, when set, must equal the token's iss claim.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Issuer string `json:"issuer,omitempty"`

	// Audience, when set, must be one of the token's aud claims.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Audience string `json:"audience,omitempty"`

	// UpstreamVerified says that a proxy in front of the pod has already
	// verified the token, so its claims are read without checking the
	// signature.
	// +optional
	UpstreamVerified bool `json:"upstreamVerified,omitempty"`
}

// KeyReference names one key of a Secret or ConfigMap in the referring
// object's namespace.
type KeyReference struct {
	// Name is the object's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// Key is the data key within the object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// RateLimitPolicyStatus is what the manager observed and did.
type RateLimitPolicyStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions are Accepted (the spec is valid), ResolvedRefs (the
	// CounterStore exists and is Ready) and Programmed (the sidecars
	// enforce this generation).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// TargetedPods is the number of running pods the podSelector matches.
	// +optional
	TargetedPods int32 `json:"targetedPods"`

	// EnforcingPods is the number of targeted pods whose sidecar reports
	// this policy loaded. For a policy with a targetRef, it is the number
	// of central rate-limit service replicas that report it loaded.
	// +optional
	EnforcingPods int32 `json:"enforcingPods"`

	// Target reports the targetRef's object, for a policy with a
	// targetRef (which targets no pods: targetedPods stays 0).
	// +optional
	Target *TargetStatus `json:"target,omitempty"`
}

// RateLimitPolicy limits the requests that reach the pods it selects. The
// sidecars of those pods enforce it together, sharing their counts through
// a CounterStore.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=rlp,categories=floodgate
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Programmed",type=string,JSONPath=`.status.conditions[?(@.type=="Programmed")].status`
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.status.targetedPods`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.status.target.ref`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RateLimitPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired behaviour.
	// +required
	Spec RateLimitPolicySpec `json:"spec"`

	// Status is the observed state.
	// +optional
	Status RateLimitPolicyStatus `json:"status,omitempty"`
}

// GatewayEnforced reports whether the policy has a targetRef: a gateway,
// through the central rate-limit service, enforces it instead of sidecars.
func (p *RateLimitPolicy) GatewayEnforced() bool { return p.Spec.TargetRef != nil }

// StoreName returns the name of the CounterStore the policy uses.
func (p *RateLimitPolicy) StoreName() string {
	if p.Spec.StoreRef == nil || p.Spec.StoreRef.Name == "" {
		return DefaultCounterStoreName
	}
	return p.Spec.StoreRef.Name
}

// RateLimitPolicyList is a list of RateLimitPolicy.
//
// +kubebuilder:object:root=true
type RateLimitPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the policies.
	Items []RateLimitPolicy `json:"items"`
}
