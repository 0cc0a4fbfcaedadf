// Package config is the compiled sidecar configuration: the versioned
// document that floodgate-manager writes into each namespace's
// "floodgate-policies" ConfigMap, and that floodgate-sidecar reads from that
// ConfigMap or, in standalone mode, from --policy-file (YAML or JSON).
//
// The schema is versioned by APIVersion. Parse is strict: unknown fields are
// errors, so a typo never silently drops a limit. Validate reports every
// problem at once, each with its field path.
package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// APIVersion is the only schema version this package reads and writes.
const APIVersion = "floodgate.dev/sidecar-config/v1"

// ConfigMapName is the ConfigMap, one per namespace, that holds the compiled
// config under the DataKey key.
const (
	ConfigMapName = "floodgate-policies"
	DataKey       = "config.json"
)

// Config is the whole compiled document.
type Config struct {
	// APIVersion must be APIVersion.
	APIVersion string `json:"apiVersion"`
	// Revision identifies this content. The manager sets it to a hash of
	// the document, so equal inputs give equal revisions. It is optional in
	// a standalone --policy-file; the sidecar then derives one from the
	// file's bytes (Digest).
	Revision string `json:"revision"`
	// Store is the counter store the sidecars use.
	Store Store `json:"store"`
	// Policies are the policies of the namespace. A sidecar enforces those
	// whose PodSelector matches its own labels.
	Policies []Policy `json:"policies"`
	// Pods names, sorted, the pods that a policy's ReplicaPods index: the
	// ready pods the policies target. A sidecar finds its own pod here by
	// name (--pod-name) to learn its place among the replicas that share
	// each policy's limit while the store is unreachable.
	Pods []string `json:"pods,omitempty"`
}

// Store types.
const (
	StoreMemory = "memory"
	StoreRedis  = "redis"
)

// Store is where counters live.
type Store struct {
	// Name is the CounterStore's name, for reporting.
	Name string `json:"name,omitempty"`
	// Type is "memory" (per-sidecar, standalone use) or "redis". Empty
	// leaves the choice to the sidecar's flags, whose default is memory.
	Type string `json:"type"`
	// Addresses are the Redis Cluster seed addresses, host:port.
	Addresses []string `json:"addresses,omitempty"`
	// AuthSecretName names the Secret, in the sidecar's namespace, that
	// holds the store password under the key "password" (and the store
	// user, if any, under "username"): StoreAuthSecret, or empty for a
	// store without a password.
	AuthSecretName string `json:"authSecretName,omitempty"`
	// TLS enables TLS to the store.
	TLS *TLS `json:"tls,omitempty"`
}

// TLS configures TLS to the store.
type TLS struct {
	// CAFile verifies the store's certificates; empty uses the system pool.
	CAFile string `json:"caFile,omitempty"`
	// ServerName overrides the name checked in the store's certificate.
	ServerName string `json:"serverName,omitempty"`
	// InsecureSkipVerify disables verification. For testing only.
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// Policy is one compiled RateLimitPolicy.
type Policy struct {
	// Name is the RateLimitPolicy's name. It labels metrics and names the
	// policy in the RateLimit-Policy response field.
	Name string `json:"name"`
	// Namespace is the RateLimitPolicy's namespace.
	Namespace string `json:"namespace,omitempty"`
	// UID is the RateLimitPolicy's UID. It prefixes every counter key, so
	// it is restricted to letters, digits, '-', '_' and '.'.
	UID string `json:"uid"`
	// Generation is the RateLimitPolicy's metadata.generation.
	Generation int64 `json:"generation,omitempty"`
	// PodSelector selects the pods whose sidecars enforce this policy. Nil
	// selects every pod.
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// Replicas is the number of ready pods the policy targets. While the
	// store is unreachable, a rule that fails open admits on each replica
	// its share of the limit, so that the replicas together admit at most
	// the limit (see ReplicaPods). 0 (unset) means 1; negative values are
	// invalid.
	Replicas int32 `json:"replicas"`
	// ReplicaPods, when set, lists the indexes in Config.Pods of the
	// replicas, in increasing order; Replicas is then its length. A
	// sidecar's position in this list is its replica index, which
	// staggers the replicas' fail-open shares so that no two spend the
	// same share of the limit. In Kubernetes mode a sidecar whose pod is
	// not listed yet (it just became ready) derives its index from a hash
	// of its pod name until the manager lists it; a standalone sidecar on
	// Redis refuses a config that does not list it (docs/sidecar-config.md,
	// "Replicas and pod identity").
	ReplicaPods []int32 `json:"replicaPods,omitempty"`
	// TrustedProxies says how X-Forwarded-For is read. Nil means the
	// client IP is the socket peer.
	TrustedProxies *TrustedProxies `json:"trustedProxies,omitempty"`
	// JWT says how tokens are verified before their claims may key a rule.
	JWT *JWT `json:"jwt,omitempty"`
	// Exempt, when set, lists the requests none of the policy's HTTP rules
	// limit (see Exempt).
	Exempt *Exempt `json:"exempt,omitempty"`
	// Rules are the policy's limits; at least one.
	Rules []Rule `json:"rules"`
	// LoadShedding, when set, turns on the load shedder of the pods the
	// policy selects.
	LoadShedding *LoadShedding `json:"loadShedding,omitempty"`
	// Gateways are the Gateways, "<namespace>/<name>" (GatewayRef),
	// sorted and unique, that may ask the central rate-limit service
	// about the policy in a request descriptor when the service
	// authenticates its callers (floodgate-sidecar --grpc-client-ca-file):
	// a call whose client certificate names another gateway, or none, is
	// refused for it. floodgate-manager fills it for a policy with a
	// targetRef: the Gateways that accepted the targeted HTTPRoute (its
	// parentRefs with Accepted in status.parents), or the targeted
	// Gateway. Empty means no gateway may; a service that does not
	// authenticate its callers ignores it.
	Gateways []string `json:"gateways,omitempty"`
}

// TrustedProxies configures client-IP extraction. CIDRs is required:
// nothing a client sends is believed unless the connection comes from a
// trusted peer.
type TrustedProxies struct {
	// CIDRs are the proxies whose X-Forwarded-For entries (or Header) are
	// believed. The client IP is the right-most address not in these
	// ranges.
	CIDRs []string `json:"cidrs,omitempty"`
	// Hops, when non-zero, trusts exactly this many proxies in front of the
	// pod: the client IP is the Hops-th address from the right. The peer
	// must still be inside CIDRs.
	Hops int32 `json:"hops,omitempty"`
	// Header, when set, names a header that trusted peers set to the
	// client's address alone (X-Real-IP, True-Client-IP, ...), read
	// instead of X-Forwarded-For. Excludes Hops.
	Header string `json:"header,omitempty"`
}

// JWT configures the verification of bearer tokens.
type JWT struct {
	// Header carries the token; default "Authorization" with a "Bearer "
	// prefix.
	Header string `json:"header,omitempty"`
	// HMACSecretFile holds the HMAC key for HS256/HS384/HS512 tokens.
	HMACSecretFile string `json:"hmacSecretFile,omitempty"`
	// JWKSFile holds a JSON Web Key Set for RS*/ES*/EdDSA tokens.
	JWKSFile string `json:"jwksFile,omitempty"`
	// Issuer and Audience, when set, must match the token's claims.
	Issuer   string `json:"issuer,omitempty"`
	Audience string `json:"audience,omitempty"`
	// UpstreamVerified says a proxy in front of the pod already verified
	// the token, so its claims are read without checking the signature.
	UpstreamVerified bool `json:"upstreamVerified,omitempty"`
	// OnInvalidToken says what a request whose token is present but does
	// not verify (forged, expired, wrong issuer or audience, malformed)
	// gets from a rule that keys on a jwtClaim: "Reject" (default)
	// answers 401; "NextAlternative" keys it by the rule's next key
	// alternative, as if it carried no token. An invalid token never
	// makes a rule skip a request.
	OnInvalidToken string `json:"onInvalidToken,omitempty"`
}

// Rule is one limit with the requests it applies to.
type Rule struct {
	// Name is unique within its policy: letters, digits, '-', '_' and
	// '.', at most 63 characters.
	Name string `json:"name"`
	// Match selects the requests the rule applies to.
	Match Match `json:"match,omitempty"`
	// Key lists the descriptor parts whose values identify a counter: one
	// key alternative. An empty Key, with no Keys, gives the rule one
	// counter shared by every request (a global limit).
	Key []KeyPart `json:"key"`
	// Keys, instead of Key, lists key alternatives in order: a request is
	// keyed by the first alternative whose parts it all carries. Key is
	// the same as Keys with one alternative. See KeyAlternatives.
	Keys [][]KeyPart `json:"keys,omitempty"`
	// OnMissingKey says what happens to a request that carries no
	// complete key alternative: "Shared" (default) counts all such
	// requests in one counter, "Reject" answers 400, "Skip" means the rule
	// does not apply to it.
	OnMissingKey string `json:"onMissingKey,omitempty"`
	// Limit is the rule's limit: a rate. A rule has a Limit, or a
	// Concurrency, or neither when it only sets a Priority.
	Limit Limit `json:"limit,omitzero"`
	// Concurrency, when set, makes the rule a cap on the requests of a
	// key in flight instead of a rate.
	Concurrency *Concurrency `json:"concurrency,omitempty"`
	// Priority, when set, is the load-shedding class of the requests the
	// rule matches: Critical, Default or Sheddable.
	Priority string `json:"priority,omitempty"`
	// Cost says what each request spends.
	Cost Cost `json:"cost,omitzero"`
	// FailureMode is "Open" (default): fall back to a local bucket of
	// limit/replicas when the store is unreachable, or "Closed": answer
	// 503.
	FailureMode string `json:"failureMode,omitempty"`
	// Mode is "Enforce" (default) or "Shadow": count and report, never
	// block.
	Mode string `json:"mode,omitempty"`
	// Exempt, when set, lists requests the rule matches but never limits
	// (see Exempt). The policy's Exempt applies too.
	Exempt *Exempt `json:"exempt,omitempty"`
	// ResponseHeaders says which rate-limit response fields the answers
	// this rule binds carry: "Full" (default) all of them, "RetryAfter"
	// only Retry-After on a refusal, "None" none, and a refusal's body
	// then states no number. Only a rate rule takes it.
	ResponseHeaders string `json:"responseHeaders,omitempty"`
	// ReplacedBy lists the UIDs of other policies of the document. A
	// sidecar that enforces any of them does not enforce this rule: a
	// namespace's policy has replaced it there. floodgate-manager sets it
	// on the rules of a ClusterRateLimitPolicy's defaults that a
	// namespace's policy tightens.
	ReplacedBy []string `json:"replacedBy,omitempty"`
}

// Exempt lists requests that a rule matches but never limits: the client
// addresses in SourceCIDRs, and the requests for which every condition in
// When holds. Either is enough. An exempt request spends nothing and is
// counted in floodgate_sidecar_exempt_total.
type Exempt struct {
	// SourceCIDRs are client networks (the client IP read as the policy's
	// TrustedProxies say).
	SourceCIDRs []string `json:"sourceCIDRs,omitempty"`
	// When are CEL conditions (see CompileExpression); the request is
	// exempt when all of them hold.
	When []string `json:"when,omitempty"`
}

// Match selects the requests a rule applies to. An empty Match selects all;
// otherwise every field that is set must match.
type Match struct {
	// Path matches the cleaned request path.
	Path *PathMatch `json:"path,omitempty"`
	// Methods, when non-empty, lists the accepted request methods.
	Methods []string `json:"methods,omitempty"`
	// Headers must all match.
	Headers []HeaderMatch `json:"headers,omitempty"`
	// Hosts, when non-empty, lists the accepted hosts (the Host header,
	// or :authority, without its port, compared case-insensitively). An
	// entry "*.example.com" matches every name that ends in
	// ".example.com", with any number of labels before it, but not
	// "example.com" itself, as a Gateway API hostname does.
	Hosts []string `json:"hosts,omitempty"`
	// Query must all match, on the request's query parameters.
	Query []QueryMatch `json:"query,omitempty"`
	// SourceCIDRs, when non-empty, restricts the rule to client addresses
	// in these networks (the client IP read as the policy's TrustedProxies
	// say).
	SourceCIDRs []string `json:"sourceCIDRs,omitempty"`
	// When are CEL conditions over the request (see CompileExpression);
	// all must hold. A condition that cannot be evaluated on a request (it
	// reads a header the request lacks, for example) does not hold.
	When []string `json:"when,omitempty"`
	// Descriptors, when set, makes the rule a descriptor rule: it applies
	// to Envoy rate-limit service calls (ShouldRateLimit on the sidecar's
	// gRPC listener), never to HTTP requests through the proxy. Path,
	// Methods and Headers must then be empty, and so must the rule's Key,
	// OnMissingKey and Cost: the counter is keyed by the descriptor's
	// values and the cost is the call's hits_addend.
	Descriptors *DescriptorMatch `json:"descriptors,omitempty"`
}

// DescriptorMatch selects the Envoy rate-limit descriptors a rule applies
// to, with envoyproxy/ratelimit's matching: a request descriptor is walked
// entry by entry through the rules of its domain, preferring at each level
// an entry with an equal value, then a wildcard value, then a key-only
// entry, and the rules whose Entries the walk ends on exactly apply. A
// descriptor matches only rules with as many entries as it has.
type DescriptorMatch struct {
	// Domain is the rate-limit domain of the calls (RateLimitRequest.domain).
	Domain string `json:"domain"`
	// Entries match the descriptor's entries one for one, in order.
	Entries []DescriptorEntry `json:"entries"`
	// Replaces names rules of the same policy that this rule replaces: when
	// a call matches this rule and a replaced rule, the replaced rule is not
	// evaluated and its counter is untouched (envoyproxy/ratelimit's
	// replaces).
	Replaces []string `json:"replaces,omitempty"`
}

// DescriptorEntry matches one descriptor entry.
type DescriptorEntry struct {
	// Key must equal the entry's key.
	Key string `json:"key"`
	// Value, when set, must equal the entry's value; a Value ending in "*"
	// matches every value that starts with what precedes the "*". An empty
	// Value matches any value, and each distinct value then has its own
	// counter. Wildcard matches also count per distinct value.
	Value string `json:"value,omitempty"`
}

// Path match types.
const (
	PathExact             = "Exact"
	PathPrefix            = "Prefix"
	PathRegularExpression = "RegularExpression"
)

// PathMatch matches the request path, after the sidecar has cleaned it
// (path.Clean, keeping a trailing slash), so "/a/../admin" and "//admin" are
// matched as "/admin". The sidecar forwards the cleaned path to the
// application, so the application serves the path the rules matched.
//
// Matching ignores ASCII case and a trailing slash, because many
// applications serve "/login", "/login/" and "/LOGIN" alike, and a rule
// that a client could sidestep by changing case or adding a slash would be
// no limit. Exact compares the whole path. Prefix compares whole path
// elements, as the Gateway API's PathPrefix does: "/api" matches "/api",
// "/API/" and "/api/v1" but not "/apiv1". RegularExpression is an RE2
// expression that must match the whole path, and is matched without
// regard to case, against the path and against it without a trailing
// slash.
type PathMatch struct {
	// Type is Exact, Prefix or RegularExpression.
	Type string `json:"type"`
	// Value is the path, prefix or expression.
	Value string `json:"value"`
}

// HeaderMatch matches a request header. At most one of Value, Regex and
// Absent is set; with none, the header only has to be present.
type HeaderMatch struct {
	// Name is the header name, matched case-insensitively.
	Name string `json:"name"`
	// Value, when set, must equal one of the header's values.
	Value string `json:"value,omitempty"`
	// Regex, when set, is an RE2 expression that must match one of the
	// header's values whole.
	Regex string `json:"regex,omitempty"`
	// Absent requires the header to be missing.
	Absent bool `json:"absent,omitempty"`
	// Invert negates the match of Value, Regex or presence: the header
	// matches when it is missing or none of its values match. It cannot
	// go with Absent.
	Invert bool `json:"invert,omitempty"`
}

// QueryMatch matches a query parameter, as HeaderMatch matches a header:
// on each of the parameter's values, decoded. Parameter names are
// case-sensitive.
type QueryMatch struct {
	// Name is the parameter's name.
	Name string `json:"name"`
	// Value, when set, must equal one of the parameter's values.
	Value string `json:"value,omitempty"`
	// Regex, when set, must match one of the parameter's values whole.
	Regex string `json:"regex,omitempty"`
	// Absent requires the parameter to be missing.
	Absent bool `json:"absent,omitempty"`
	// Invert negates the match of Value, Regex or presence.
	Invert bool `json:"invert,omitempty"`
}

// KeyPart is one descriptor part. Exactly one field is set. The values read
// are hashed into the counter key, never embedded in it.
type KeyPart struct {
	// Header reads the named request header; several values are joined
	// with ",". An absent header is a missing part.
	Header string `json:"header,omitempty"`
	// Query reads the first value of the named query parameter. An absent
	// parameter is a missing part.
	Query string `json:"query,omitempty"`
	// ClientIP reads the client address: the socket peer, or the
	// X-Forwarded-For entry that the policy's TrustedProxies select. An
	// IPv6 address is keyed by its network prefix (/64 by default), since
	// one host commonly holds a whole /64.
	ClientIP *ClientIPKey `json:"clientIP,omitempty"`
	// JWTClaim reads a claim of the request's verified bearer token (see
	// Policy.JWT). A dotted name ("org.id") reads a nested claim when no
	// top-level claim has that exact name. A missing, unverifiable or
	// forged token is a missing part.
	JWTClaim string `json:"jwtClaim,omitempty"`
	// Path reads the cleaned request path.
	Path *struct{} `json:"path,omitempty"`
	// Method reads the request method.
	Method *struct{} `json:"method,omitempty"`
	// Expression computes the value with a CEL expression (see
	// CompileExpression) of type string, number or bool. An expression
	// that cannot be evaluated on a request, or computes a value longer
	// than MaxKeyValueLength bytes, is a missing part.
	Expression string `json:"expression,omitempty"`
}

// ClientIPKey is a clientIP key part. Its zero value, written {}, keys
// IPv4 clients by address and IPv6 clients by /64.
type ClientIPKey struct {
	// IPv4PrefixLength keys IPv4 clients by this many leading bits, 1-32;
	// 0 means 32.
	IPv4PrefixLength int32 `json:"ipv4PrefixLength,omitempty"`
	// IPv6PrefixLength keys IPv6 clients by this many leading bits, 1-128;
	// 0 means DefaultIPv6PrefixLength.
	IPv6PrefixLength int32 `json:"ipv6PrefixLength,omitempty"`
}

// DefaultIPv6PrefixLength is the prefix an IPv6 client is keyed by when the
// key part does not say: the /64 that one subscriber, host or container
// network usually gets, so that rotating through its 2^64 addresses earns
// no fresh counters.
const DefaultIPv6PrefixLength = 64

// KeyAlternatives returns the rule's key alternatives: Keys, or Key as the
// only one (which may be empty: a global rule).
func (r *Rule) KeyAlternatives() [][]KeyPart {
	if len(r.Keys) > 0 {
		return r.Keys
	}
	return [][]KeyPart{r.Key}
}

// Limit is a rule's limit.
type Limit struct {
	// Requests is the number of requests admitted per Per. A descriptor
	// rule may set 0, which denies every call it matches
	// (envoyproxy/ratelimit's requests_per_unit: 0); Per still sets the
	// window its answers report.
	Requests int64 `json:"requests"`
	// Per is the period, between 1s and 366d.
	Per metav1.Duration `json:"per"`
	// Burst is the bucket capacity for TokenBucket and GCRA; 0 means
	// Requests.
	Burst int64 `json:"burst,omitempty"`
	// Algorithm is TokenBucket (default), GCRA, SlidingWindow, FixedWindow
	// or SlidingLog.
	Algorithm string `json:"algorithm,omitempty"`
	// Unlimited, for descriptor rules only, makes the rule match and
	// answer OK without counting (envoyproxy/ratelimit's unlimited: true);
	// it stops a less specific rule from applying. Requests, Per, Burst and
	// Algorithm must then be empty.
	Unlimited bool `json:"unlimited,omitempty"`
	// Lease is "Auto" (the default when empty): a sidecar that sees a key
	// often takes a batch of its tokens from the store in one call and
	// admits against it locally; or "Off": every request is decided on the
	// shared count (strict). SlidingLog never leases.
	Lease string `json:"lease,omitempty"`
	// Split spreads each counter of the rule over this many sub-counters,
	// each on its own Redis slot with 1/Split of the limit, for keys whose
	// traffic exceeds what one shard can answer. 0 and 1 mean none; at
	// most limiter.MaxSplit.
	Split int32 `json:"split,omitempty"`
	// OnExceed is what a request over the limit gets: "Deny" (the default
	// when empty) answers 429; "Delay" holds it until its slot and then
	// passes it on, or answers 429 when its slot is more than MaxDelay
	// away. A Delay limit is metered with GCRA (Algorithm is empty,
	// TokenBucket or GCRA), takes no Burst (DelayAfter sets it), never
	// leases (Lease is empty or Off) and never splits.
	OnExceed string `json:"onExceed,omitempty"`
	// MaxDelay, required with Delay and refused without, is the longest a
	// request waits for its slot: between MinMaxDelay and
	// limiter.MaxMaxDelay, a whole number of microseconds.
	MaxDelay metav1.Duration `json:"maxDelay,omitzero"`
	// DelayAfter, with Delay only, is how many requests of a burst an idle
	// key passes at once without waiting (nginx limit_req's delay=): the
	// limiter's Burst. 0 means 1.
	DelayAfter int64 `json:"delayAfter,omitempty"`
}

// Cost says what a request spends.
type Cost struct {
	// FromHeader reads the cost from this request header, when present. A
	// header value that is not an integer between 1 and Max is answered
	// 400, so a client cannot claim a free (0) or negative cost.
	FromHeader string `json:"fromHeader,omitempty"`
	// Default is the cost when FromHeader is unset or absent; 0 means 1.
	Default int64 `json:"default,omitempty"`
	// Max bounds a header-supplied cost; larger values are rejected with
	// 400. 0 means the rule's capacity.
	Max int64 `json:"max,omitempty"`
}
