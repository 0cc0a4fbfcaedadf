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
// +kubebuilder:validation:XValidation:rule="has(self.jwt) || self.rules.all(r, (!has(r.key) || r.key.all(k, !has(k.jwtClaim))) && (!has(r.keys) || r.keys.all(a, a.all(k, !has(k.jwtClaim)))))",message="jwt must be set when a rule keys on a jwtClaim, so that tokens are verified before their claims count",fieldPath=".jwt"
// +kubebuilder:validation:XValidation:rule="!has(self.targetRef) || self.rules.all(r, !has(r.limit) || !has(r.limit.onExceed) || r.limit.onExceed != 'Delay')",message="onExceed: Delay cannot go with targetRef: the central rate-limit service answers the gateway allow or deny and cannot hold a request; enforce a Delay rule with sidecars (podSelector)",fieldPath=".targetRef"
// +kubebuilder:validation:XValidation:rule="has(self.podSelector) != has(self.targetRef)",message="set exactly one of podSelector (the pods whose sidecars enforce the policy) and targetRef (a Gateway API HTTPRoute or Gateway whose gateway enforces it)",fieldPath=".podSelector"
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
	// a rule. It is required when any rule has a jwtClaim key part or
	// reads auth.claims in a CEL expression.
	// +optional
	JWT *JWT `json:"jwt,omitempty"`

	// LoadShedding turns on the priority load shedder of the selected
	// pods: each sidecar learns how many requests its application serves
	// well at once and, past that, answers the lowest priority first with
	// 503. Rules assign priorities (rules[].priority).
	// +optional
	LoadShedding *LoadShedding `json:"loadShedding,omitempty"`

	// Exempt lists requests that none of the policy's rules limit: health
	// checks, internal callers. Exempt requests are counted in the
	// sidecar's floodgate_sidecar_exempt_total and spend nothing.
	// +optional
	Exempt *Exempt `json:"exempt,omitempty"`
}

// Exempt lists requests that are never limited: those from the client
// networks in SourceCIDRs, and those for which every condition in When
// holds. Either is enough.
//
// +kubebuilder:validation:XValidation:rule="(has(self.sourceCIDRs) && size(self.sourceCIDRs) > 0) || (has(self.when) && size(self.when) > 0)",message="set sourceCIDRs, when, or both"
type Exempt struct {
	// SourceCIDRs are client networks, the client IP read as
	// trustedProxies says.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	SourceCIDRs []CIDR `json:"sourceCIDRs,omitempty"`

	// When are CEL conditions over the request (see match.when); the
	// request is exempt when all of them hold.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	When []Expression `json:"when,omitempty"`
}

// Expression is a CEL expression over the request. Its variables are
// request.method, request.path, request.host, request.headers (lower-case
// names), request.query, source.address and auth.claims; the
// validating webhook compiles it and checks its cost.
//
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=2048
type Expression string

// Hostname is a DNS name in lower case, or a wildcard whose first label is
// "*" (such as *.example.com), as in the Gateway API.
//
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:Pattern=`^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
type Hostname string

// StoreReference names a cluster-scoped CounterStore.
type StoreReference struct {
	// Name is the CounterStore's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
}

// Rule is one limit with the requests it applies to: a rate (limit), a cap
// on requests in flight (concurrency), or neither when the rule only gives
// the requests it matches a priority for the load shedder.
//
// +kubebuilder:validation:XValidation:rule="!has(self.concurrency) || !has(self.limit) || !has(self.limit.split)",message="limit.split does not apply to a concurrency rule: its slots are one count per key, held for the request's life",fieldPath=".limit.split"
// +kubebuilder:validation:XValidation:rule="!(has(self.limit) && has(self.concurrency))",message="set limit (a rate) or concurrency (requests in flight), not both; use two rules for both; limit.split does not apply to a concurrency cap",fieldPath=".concurrency"
// +kubebuilder:validation:XValidation:rule="has(self.limit) || has(self.concurrency) || has(self.priority)",message="a rule needs a limit, a concurrency cap, or a priority"
// +kubebuilder:validation:XValidation:rule="!has(self.cost) || has(self.limit)",message="cost applies to rate limits only: a concurrency rule holds one slot per request",fieldPath=".cost"
// +kubebuilder:validation:XValidation:rule="!has(self.responseHeaders) || has(self.limit)",message="responseHeaders applies to rate limits only: it says which of a rate rule's numbers its answers carry",fieldPath=".responseHeaders"
// +kubebuilder:validation:XValidation:rule="!has(self.cost) || !has(self.limit) || !has(self.cost.default) || self.cost.default <= (has(self.limit.onExceed) && self.limit.onExceed == 'Delay' ? (has(self.limit.delayAfter) ? self.limit.delayAfter : 1) : (has(self.limit.burst) && self.limit.burst > 0 ? self.limit.burst : self.limit.requests))",message="cost.default must not exceed the rule's capacity (limit.burst, or limit.requests when burst is unset; limit.delayAfter, or 1, under onExceed: Delay), or every request would be denied",fieldPath=".cost.default"
// +kubebuilder:validation:XValidation:rule="!has(self.cost) || !has(self.limit) || !has(self.cost.max) || self.cost.max <= (has(self.limit.onExceed) && self.limit.onExceed == 'Delay' ? (has(self.limit.delayAfter) ? self.limit.delayAfter : 1) : (has(self.limit.burst) && self.limit.burst > 0 ? self.limit.burst : self.limit.requests))",message="cost.max must not exceed the rule's capacity (limit.burst, or limit.requests when burst is unset; limit.delayAfter, or 1, under onExceed: Delay)",fieldPath=".cost.max"
// +kubebuilder:validation:XValidation:rule="!has(self.limit) || !has(self.limit.onExceed) || self.limit.onExceed != 'Delay' || !has(self.mode) || self.mode != 'Shadow'",message="a Shadow rule never holds a request, so it cannot use onExceed: Delay; try the limit in Shadow with onExceed unset (Deny), then switch to Enforce with Delay",fieldPath=".mode"
// +kubebuilder:validation:XValidation:rule="!has(self.keys) || !has(self.key) || size(self.key) == 0",message="set key or keys, not both: key is one alternative, keys a list of them",fieldPath=".keys"
// +kubebuilder:validation:XValidation:rule="!has(self.limit) || !has(self.limit.split) || !has(self.cost) || !has(self.cost.default) || self.cost.default * self.limit.split <= (has(self.limit.onExceed) && self.limit.onExceed == 'Delay' ? (has(self.limit.delayAfter) ? self.limit.delayAfter : 1) : (has(self.limit.burst) && self.limit.burst > 0 ? self.limit.burst : self.limit.requests))",message="cost.default must fit one sub-counter: at most the rule's capacity divided by limit.split",fieldPath=".cost.default"
// +kubebuilder:validation:XValidation:rule="!has(self.limit) || !has(self.limit.split) || !has(self.cost) || !has(self.cost.max) || self.cost.max * self.limit.split <= (has(self.limit.onExceed) && self.limit.onExceed == 'Delay' ? (has(self.limit.delayAfter) ? self.limit.delayAfter : 1) : (has(self.limit.burst) && self.limit.burst > 0 ? self.limit.burst : self.limit.requests))",message="cost.max must fit one sub-counter: at most the rule's capacity divided by limit.split",fieldPath=".cost.max"
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
	// counter per distinct combination of values. It is one key
	// alternative; see Keys for several. A rule with no key part at all
	// (neither key nor keys) has one counter for every request: a global
	// limit, or one concurrency cap for every request. A rule that only sets
	// a priority uses no key.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Key []KeyPart `json:"key,omitempty"`

	// Keys, instead of Key, lists key alternatives in order: each request
	// is keyed by the first alternative whose parts it all carries, for
	// example a verified JWT sub, else the X-API-Key header, else the
	// client IP. A request that carries none of them gets OnMissingKey.
	// An empty alternative ([]) keys every request to one shared counter;
	// it may only be the last.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxItems=8
	Keys [][]KeyPart `json:"keys,omitempty"`

	// OnMissingKey says what happens to a request that carries no
	// complete key alternative: Shared (all such requests share one
	// counter; the default), Reject (answer 400) or Skip (the rule does
	// not apply to it, which lets such requests past the rule; admission
	// warns about it).
	// +optional
	// +kubebuilder:default=Shared
	OnMissingKey OnMissingKey `json:"onMissingKey,omitempty"`

	// Limit is the rate. Set it, or concurrency, or neither when the rule
	// only sets a priority.
	// +optional
	Limit Limit `json:"limit,omitzero"`

	// Concurrency caps the requests of a key in flight at once, over all
	// the replicas together. Set it or limit, not both.
	// +optional
	Concurrency *Concurrency `json:"concurrency,omitempty"`

	// Priority is the class the load shedder (spec.loadShedding) gives the
	// requests this rule matches: Critical, Default or Sheddable. The first
	// rule in order that matches a request and sets a priority decides;
	// requests no such rule matches are Default.
	// +optional
	Priority Priority `json:"priority,omitempty"`

	// Cost says what each request spends. When unset, each request costs
	// 1.
	// +optional
	Cost *Cost `json:"cost,omitempty"`

	// FailureMode says what the sidecar does when the counter store is
	// unreachable: Open falls back to a local bucket of limit/replicas (for
	// a concurrency rule, to max/replicas slots of its own), Closed answers
	// 503.
	// +optional
	// +kubebuilder:default=Open
	FailureMode FailureMode `json:"failureMode,omitempty"`

	// Mode is Enforce, or Shadow to count and report without ever
	// blocking: the way to try a new limit on live traffic.
	// +optional
	// +kubebuilder:default=Enforce
	Mode Mode `json:"mode,omitempty"`

	// Exempt lists requests the rule matches but never limits. The
	// policy's exempt section applies too.
	// +optional
	Exempt *Exempt `json:"exempt,omitempty"`

	// ResponseHeaders says which rate-limit response fields the answers
	// this rule binds carry: Full (the default) sends X-RateLimit-Limit,
	// X-RateLimit-Remaining, X-RateLimit-Reset, RateLimit-Policy,
	// RateLimit, and Retry-After on a refusal; RetryAfter sends only
	// Retry-After on a refusal; None sends none of them, and a refusal's
	// body states no number. RetryAfter and None keep a threshold, such
	// as a denial-of-service guard's, from being advertised.
	// +optional
	ResponseHeaders ResponseHeaders `json:"responseHeaders,omitempty"`
}

// ResponseHeaders says which rate-limit response fields a rule's answers
// carry.
// +kubebuilder:validation:Enum=Full;RetryAfter;None
type ResponseHeaders string

// The ResponseHeaders values.
const (
	ResponseHeadersFull       ResponseHeaders = "Full"
	ResponseHeadersRetryAfter ResponseHeaders = "RetryAfter"
	ResponseHeadersNone       ResponseHeaders = "None"
)

// KeyAlternatives returns the rule's key alternatives: Keys, or Key as the
// only one (which may be empty: a global rule).
func (r *Rule) KeyAlternatives() [][]KeyPart {
	if len(r.Keys) > 0 {
		return r.Keys
	}
	return [][]KeyPart{r.Key}
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

	// Headers, when set, must all match: present, with the given value or
	// a value the regex matches, or absent; each may be inverted.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Headers []HeaderMatch `json:"headers,omitempty"`

	// Hosts, when set, restricts the rule to these hosts (the Host
	// header, or :authority, without its port, compared
	// case-insensitively). A wildcard such as *.example.com matches every
	// name ending in .example.com, however many labels precede it, but
	// not example.com itself.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	Hosts []Hostname `json:"hosts,omitempty"`

	// Query, when set, must all match the request's query parameters, as
	// headers match headers.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Query []QueryMatch `json:"query,omitempty"`

	// SourceCIDRs, when set, restricts the rule to clients in these
	// networks, the client IP read as trustedProxies says.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	SourceCIDRs []CIDR `json:"sourceCIDRs,omitempty"`

	// When are CEL conditions over the request, all of which must hold,
	// such as "request.headers['x-tier'] == 'free'" or
	// "request.path.startsWith('/api/') && request.method != 'GET'". A
	// condition that cannot be evaluated on a request (it reads a header
	// the request lacks, say) does not hold. See docs/matching.md.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	When []Expression `json:"when,omitempty"`
}

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

// HeaderMatch matches one request header. At most one of value, regex
// and absent is set; with none, the header only has to be present.
//
// +kubebuilder:validation:XValidation:rule="[has(self.value) && size(self.value) > 0, has(self.regex) && size(self.regex) > 0, has(self.absent) && self.absent].filter(x, x).size() <= 1",message="set at most one of value, regex and absent"
// +kubebuilder:validation:XValidation:rule="!(has(self.absent) && self.absent && has(self.invert) && self.invert)",message="invert cannot go with absent; to require the header, leave both unset",fieldPath=".invert"
type HeaderMatch struct {
	// Name is the header name, matched case-insensitively.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	Name string `json:"name"`

	// Value, when set, must equal one of the header's values exactly.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value,omitempty"`

	// Regex, when set, is an RE2 regular expression (Go's regexp syntax)
	// that must match one of the header's values whole.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Regex string `json:"regex,omitempty"`

	// Absent requires the header to be missing.
	// +optional
	Absent bool `json:"absent,omitempty"`

	// Invert negates the match: with value or regex, the header matches
	// when it is missing or none of its values match; alone, when it is
	// missing.
	// +optional
	Invert bool `json:"invert,omitempty"`
}

// QueryMatch matches one query parameter, on its decoded values. At most
// one of value, regex and absent is set; with none, the parameter only
// has to be present.
//
// +kubebuilder:validation:XValidation:rule="[has(self.value) && size(self.value) > 0, has(self.regex) && size(self.regex) > 0, has(self.absent) && self.absent].filter(x, x).size() <= 1",message="set at most one of value, regex and absent"
// +kubebuilder:validation:XValidation:rule="!(has(self.absent) && self.absent && has(self.invert) && self.invert)",message="invert cannot go with absent; to require the parameter, leave both unset",fieldPath=".invert"
type QueryMatch struct {
	// Name is the parameter's name, matched exactly.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`

	// Value, when set, must equal one of the parameter's values.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value,omitempty"`

	// Regex, when set, must match one of the parameter's values whole.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Regex string `json:"regex,omitempty"`

	// Absent requires the parameter to be missing.
	// +optional
	Absent bool `json:"absent,omitempty"`

	// Invert negates the match, as for headers.
	// +optional
	Invert bool `json:"invert,omitempty"`
}

// KeyPart is one descriptor part of a counter key. Exactly one field is
// set.
//
// +kubebuilder:validation:XValidation:rule="[has(self.header), has(self.query), has(self.clientIP), has(self.jwtClaim), has(self.path), has(self.method), has(self.expression)].filter(x, x).size() == 1",message="exactly one of header, query, clientIP, jwtClaim, path, method or expression must be set in each key part"
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

	// Expression keys on the value of a CEL expression over the request
	// (see match.when), for keys the other parts cannot express, such as
	// "request.headers['x-org'] + '/' + request.path.split('/')[1]". It
	// must compute a string, a number or a bool. Its value is hashed like
	// every other part; an expression that fails on a request, or computes
	// more than 4096 bytes, is a missing part.
	// +optional
	Expression Expression `json:"expression,omitempty"`
}

// ClientIPKey selects the client IP as a key part. {} keys IPv4 clients by
// address and IPv6 clients by /64.
type ClientIPKey struct {
	// IPv4PrefixLength keys IPv4 clients by their network of this many
	// bits. When unset, by address (32).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	IPv4PrefixLength int32 `json:"ipv4PrefixLength,omitempty"`

	// IPv6PrefixLength keys IPv6 clients by their network of this many
	// bits. When unset, 64: one host commonly holds a whole /64, and would
	// otherwise have 2^64 counters.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	IPv6PrefixLength int32 `json:"ipv6PrefixLength,omitempty"`
}

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
// +kubebuilder:validation:XValidation:rule="!has(self.split) || self.split <= self.requests",message="split must not exceed requests: each sub-counter needs at least one request per period",fieldPath=".split"
// +kubebuilder:validation:XValidation:rule="!has(self.split) || !has(self.burst) || self.burst == 0 || self.split <= self.burst",message="split must not exceed burst: each sub-counter needs a capacity of at least one",fieldPath=".split"
// +kubebuilder:validation:XValidation:rule="!has(self.maxDelay) || (has(self.onExceed) && self.onExceed == 'Delay')",message="maxDelay applies only with onExceed: Delay",fieldPath=".maxDelay"
// +kubebuilder:validation:XValidation:rule="!has(self.delayAfter) || (has(self.onExceed) && self.onExceed == 'Delay')",message="delayAfter applies only with onExceed: Delay",fieldPath=".delayAfter"
// +kubebuilder:validation:XValidation:rule="!has(self.onExceed) || self.onExceed != 'Delay' || has(self.maxDelay)",message="maxDelay is required with onExceed: Delay: the longest a request over the limit waits for its slot before it is denied",fieldPath=".maxDelay"
// +kubebuilder:validation:XValidation:rule="!has(self.onExceed) || self.onExceed != 'Delay' || !has(self.burst) || self.burst == 0",message="burst does not apply with onExceed: Delay: delayAfter sets how many requests of a burst pass at once",fieldPath=".burst"
// +kubebuilder:validation:XValidation:rule="!has(self.onExceed) || self.onExceed != 'Delay' || !has(self.algorithm) || self.algorithm in ['TokenBucket', 'GCRA']",message="onExceed: Delay takes algorithm TokenBucket or GCRA: a Delay rule is metered with GCRA, which admits what TokenBucket admits",fieldPath=".algorithm"
// +kubebuilder:validation:XValidation:rule="!has(self.onExceed) || self.onExceed != 'Delay' || !has(self.split) || self.split <= 1",message="a Delay rule never splits: its requests queue on one counter",fieldPath=".split"
// +kubebuilder:validation:XValidation:rule="!has(self.onExceed) || self.onExceed != 'Delay' || !has(self.lease) || self.lease == 'Off'",message="a Delay rule never leases: each request reserves its slot on the shared count, in order; leave lease unset or Off",fieldPath=".lease"
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
	// it is Requests. Not with onExceed: Delay, where delayAfter sets it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000000
	Burst int64 `json:"burst,omitempty"`

	// Algorithm is TokenBucket, GCRA, SlidingWindow, FixedWindow or
	// SlidingLog.
	// +optional
	// +kubebuilder:default=TokenBucket
	Algorithm Algorithm `json:"algorithm,omitempty"`

	// Lease is Auto or Off. Auto (the default when unset) lets a sidecar
	// that sees a key often take a batch of the key's tokens from the
	// counter store in one call and admit against it locally: the shared
	// count is never exceeded, but a request may not see what other
	// sidecars spent a moment ago. Off decides every request on the shared
	// count (strict). SlidingLog never leases, nor does a rule with
	// onExceed: Delay, which refuses an explicit Auto.
	// +optional
	Lease LeaseMode `json:"lease,omitempty"`

	// Split spreads each counter of the rule over this many sub-counters
	// on different Redis slots (and masters), each holding 1/split of the
	// limit, for a key whose traffic is more than one shard can answer. A
	// request is decided on one sub-counter and borrows from the others
	// when it is spent, so the total stays the limit. A request's cost
	// must fit one sub-counter. When unset, 1 (no split). A rule with
	// onExceed: Delay never splits.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	Split int32 `json:"split,omitempty"`

	// OnExceed is what a request over the limit gets: Deny (the default
	// when unset) answers 429; Delay holds it in the sidecar until its
	// slot comes and then passes it to the application, and answers 429
	// only when that slot is more than maxDelay away (leaky-bucket
	// queueing, as nginx's limit_req without nodelay). A Delay rule is
	// metered with GCRA: algorithm must be TokenBucket or GCRA, burst is
	// unset (delayAfter sets it), it never leases (lease unset or Off) or
	// splits, it cannot be in Shadow mode, and a policy with a targetRef
	// cannot hold it. See docs/algorithms.md#delay-instead-of-deny.
	// +optional
	OnExceed OnExceed `json:"onExceed,omitempty"`

	// MaxDelay, required with onExceed: Delay and refused without, is the
	// longest a request over the limit waits for its slot; a request
	// whose slot is further away is denied. Between 1ms and 1m, written as
	// a Go duration such as 500ms or 2s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') || (duration(self) >= duration('1ms') && duration(self) <= duration('1m'))",message="must be between 1ms and 1m"
	MaxDelay metav1.Duration `json:"maxDelay,omitzero"`

	// DelayAfter, with onExceed: Delay only, is how many requests of a
	// burst a key that has been idle passes at once without waiting, as
	// nginx limit_req's delay=; those after it wait for their slots. When
	// unset, 1: every request over the rate waits.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	DelayAfter int64 `json:"delayAfter,omitempty"`
}

// OnExceed is what a request over a rate limit gets.
// +kubebuilder:validation:Enum=Deny;Delay
type OnExceed string

// The OnExceed values.
const (
	OnExceedDeny  OnExceed = "Deny"
	OnExceedDelay OnExceed = "Delay"
)

// Delays reports whether the limit delays a request over it instead of
// denying it.
func (l Limit) Delays() bool { return l.OnExceed == OnExceedDelay }

// LeaseMode says whether sidecars lease the tokens of hot keys.
// +kubebuilder:validation:Enum=Auto;Off
type LeaseMode string

// The LeaseMode values.
const (
	LeaseAuto LeaseMode = "Auto"
	LeaseOff  LeaseMode = "Off"
)

// Capacity returns the most a single key can spend at once: Burst, or
// Requests when Burst is 0; under onExceed: Delay, DelayAfter, or 1 when
// it is 0.
func (l Limit) Capacity() int64 {
	if l.Delays() {
		return max(l.DelayAfter, 1)
	}
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
// X-Forwarded-For, or from a header that trusted proxies set. Nothing a
// client sends is believed unless the connection comes from a peer inside
// CIDRs.
//
// +kubebuilder:validation:XValidation:rule="has(self.cidrs) && size(self.cidrs) > 0",message="cidrs is required: X-Forwarded-For is believed only from peers inside them; without them any client could name any address (hops alone is not enough)",fieldPath=".cidrs"
// +kubebuilder:validation:XValidation:rule="!has(self.header) || !has(self.hops) || self.hops == 0",message="header holds one address: it excludes hops",fieldPath=".header"
type TrustedProxies struct {
	// CIDRs are the proxies whose X-Forwarded-For entries (or Header) are
	// believed. The client IP is the right-most address not in these
	// ranges. Required.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	CIDRs []CIDR `json:"cidrs,omitempty"`

	// Hops, when non-zero, trusts exactly this many proxies in front of
	// the pod: the client IP is the Hops-th address from the right of
	// X-Forwarded-For. The peer must still be inside CIDRs.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	Hops int32 `json:"hops,omitempty"`

	// Header, when set, names a header that the trusted proxies set to the
	// client's address alone, such as X-Real-IP or True-Client-IP: it is
	// read, from trusted peers only, instead of X-Forwarded-For.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	Header string `json:"header,omitempty"`
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

	// OnInvalidToken says what a request whose bearer token is present but
	// does not verify (forged, expired, of another issuer or audience,
	// malformed) gets from a rule that needs a jwtClaim: Reject answers
	// 401; NextAlternative keys it by the rule's next key alternative, as
	// if it carried no token. Either way the rule never skips it.
	// +optional
	// +kubebuilder:default=Reject
	OnInvalidToken OnInvalidToken `json:"onInvalidToken,omitempty"`
}

// OnInvalidToken is what a rule does with a bearer token that does not
// verify.
// +kubebuilder:validation:Enum=Reject;NextAlternative
type OnInvalidToken string

// The OnInvalidToken values.
const (
	OnInvalidTokenReject          OnInvalidToken = "Reject"
	OnInvalidTokenNextAlternative OnInvalidToken = "NextAlternative"
)

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
	// CounterStore exists and is Ready, and the JWT key Secret or
	// ConfigMap exists) and Programmed (the sidecars enforce this
	// generation).
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

	// Enforcing is enforcingPods/targetedPods, such as "3/3", for kubectl
	// get. For a policy with a targetRef, it is the central rate-limit
	// service's replicas that have loaded it over those running.
	// +optional
	Enforcing string `json:"enforcing,omitempty"`

	// Store is the CounterStore that holds the policy's counts.
	// +optional
	Store string `json:"store,omitempty"`

	// Rules reports on each rule: what it denied, or would have denied in
	// Shadow mode, over the recent window that usage describes, and how it
	// relates to a ClusterRateLimitPolicy default of the same name.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Rules []RuleStatus `json:"rules,omitempty"`

	// ClusterRules are the rules of ClusterRateLimitPolicies that apply to
	// pods this policy targets, beside its own rules (tightest wins), or
	// that one of its rules replaces.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	ClusterRules []ClusterRuleStatus `json:"clusterRules,omitempty"`

	// Usage says how the rules' counts were gathered; unset until the
	// manager has read the sidecars' counters twice.
	// +optional
	Usage *UsageStatus `json:"usage,omitempty"`
}

// RuleStatus is what the manager observed of one rule.
type RuleStatus struct {
	// Name is the rule's name.
	// +required
	Name string `json:"name"`

	// Mode is the rule's mode.
	// +optional
	Mode Mode `json:"mode,omitempty"`

	// Denied is the number of requests the rule denied over the usage
	// window, summed over the targeted pods (Enforce rules).
	// +optional
	Denied *int64 `json:"denied,omitempty"`

	// WouldHaveDenied is the number of requests a Shadow rule would have
	// denied over the usage window, summed over the targeted pods. They
	// reached the application.
	// +optional
	WouldHaveDenied *int64 `json:"wouldHaveDenied,omitempty"`

	// Exempt is the number of requests the rule matched and left alone as
	// exempt over the usage window.
	// +optional
	Exempt *int64 `json:"exempt,omitempty"`

	// ClusterDefault reports on a ClusterRateLimitPolicy default of the
	// same name that applies to the pods this policy targets.
	// +optional
	ClusterDefault *ClusterDefaultStatus `json:"clusterDefault,omitempty"`
}

// Reasons of ClusterDefaultStatus.
const (
	// ReasonTightens: the rule is the default's rule with limits no
	// looser, so it replaces the default on the policy's pods.
	ReasonTightens = "Tightens"
	// ReasonLoosens: the rule would allow more than the default, so it
	// does not replace it; the default keeps applying beside it.
	ReasonLoosens = "Loosens"
	// ReasonDiffers: the rule matches, keys, costs or exempts requests
	// differently from the default, so it is not a tightening of it and
	// does not replace it; the default keeps applying beside it.
	ReasonDiffers = "Differs"
)

// ClusterDefaultStatus is how a rule relates to the cluster default it
// shares a name with.
type ClusterDefaultStatus struct {
	// Policy is the ClusterRateLimitPolicy.
	// +required
	Policy string `json:"policy"`

	// Replaced is true when this rule replaces the default on the
	// policy's pods; false when the default keeps applying beside it.
	// +required
	Replaced bool `json:"replaced"`

	// Reason is Tightens, Loosens or Differs.
	// +required
	Reason string `json:"reason"`

	// Message says why.
	// +optional
	Message string `json:"message,omitempty"`
}

// ClusterRuleKind says how a ClusterRateLimitPolicy rule applies.
// +kubebuilder:validation:Enum=Default;Override
type ClusterRuleKind string

// The ClusterRuleKind values.
const (
	// ClusterRuleDefault is a rule of spec.defaults: a namespace's policy
	// may replace it with a tighter rule of the same name.
	ClusterRuleDefault ClusterRuleKind = "Default"
	// ClusterRuleOverride is a rule of spec.overrides: it always applies.
	ClusterRuleOverride ClusterRuleKind = "Override"
)

// ClusterRuleStatus is a ClusterRateLimitPolicy rule as it applies to the
// pods of a RateLimitPolicy.
type ClusterRuleStatus struct {
	// Policy is the ClusterRateLimitPolicy.
	// +required
	Policy string `json:"policy"`

	// Rule is the rule's name.
	// +required
	Rule string `json:"rule"`

	// Kind is Default or Override.
	// +required
	Kind ClusterRuleKind `json:"kind"`

	// ReplacedBy names the rule of this policy that replaces the default
	// on this policy's pods; empty when the cluster rule applies there.
	// +optional
	ReplacedBy string `json:"replacedBy,omitempty"`
}

// UsageStatus says how the counts of status.rules were gathered: the
// manager reads the decision counters of the targeted pods' sidecars
// (their /metrics on the admin port) at a low rate, and reports the
// increase over Window.
type UsageStatus struct {
	// Window is the span the counts cover, up to the manager's
	// --usage-window.
	// +required
	Window metav1.Duration `json:"window"`

	// Pods is the number of targeted pods whose counters were read.
	// +required
	Pods int32 `json:"pods"`
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
// +kubebuilder:printcolumn:name="Enforcing",type=string,JSONPath=`.status.enforcing`
// +kubebuilder:printcolumn:name="Store",type=string,JSONPath=`.status.store`
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
