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
	// holds the store password under the key "password".
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
	// Replicas is the number of ready pods the policy targets. A rule that
	// fails open falls back to a local bucket of limit/Replicas. 0 (unset)
	// means 1; negative values are invalid.
	Replicas int32 `json:"replicas"`
	// TrustedProxies says how X-Forwarded-For is read. Nil means the
	// client IP is the socket peer.
	TrustedProxies *TrustedProxies `json:"trustedProxies,omitempty"`
	// JWT says how tokens are verified before their claims may key a rule.
	JWT *JWT `json:"jwt,omitempty"`
	// Rules are the policy's limits; at least one.
	Rules []Rule `json:"rules"`
}

// TrustedProxies configures client-IP extraction.
type TrustedProxies struct {
	// CIDRs are the proxies whose X-Forwarded-For entries are believed. The
	// client IP is the right-most address not in these ranges.
	CIDRs []string `json:"cidrs,omitempty"`
	// Hops, when non-zero, trusts exactly this many proxies in front of the
	// pod: the client IP is the Hops-th address from the right.
	Hops int32 `json:"hops,omitempty"`
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
}

// Rule is one limit with the requests it applies to.
type Rule struct {
	// Name is unique within its policy: letters, digits, '-', '_' and
	// '.', at most 63 characters.
	Name string `json:"name"`
	// Match selects the requests the rule applies to.
	Match Match `json:"match,omitempty"`
	// Key lists the descriptor parts whose values identify a counter. An
	// empty Key gives the rule one counter shared by every request.
	Key []KeyPart `json:"key"`
	// OnMissingKey says what happens when a key part cannot be read from a
	// request: "Skip" (default) means the rule does not apply, "Shared"
	// counts all such requests in one counter, "Reject" answers 400.
	OnMissingKey string `json:"onMissingKey,omitempty"`
	// Limit is the rule's limit.
	Limit Limit `json:"limit"`
	// Cost says what each request spends.
	Cost Cost `json:"cost,omitempty"`
	// FailureMode is "Open" (default): fall back to a local bucket of
	// limit/replicas when the store is unreachable, or "Closed": answer
	// 503.
	FailureMode string `json:"failureMode,omitempty"`
	// Mode is "Enforce" (default) or "Shadow": count and report, never
	// block.
	Mode string `json:"mode,omitempty"`
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
	// Hosts, when non-empty, lists the accepted request hosts, lower-case:
	// exact names, or wildcards "*.example.com" matching any name below
	// example.com. The request's host is its Host (:authority) without
	// the port, compared without case.
	Hosts []string `json:"hosts,omitempty"`
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
// matched as "/admin".
//
// Exact compares the whole path. Prefix compares whole path elements, as the
// Gateway API's PathPrefix does: "/api" matches "/api", "/api/" and
// "/api/v1" but not "/apiv1"; a trailing slash in Value is ignored.
// RegularExpression is an RE2 expression that must match the whole path.
type PathMatch struct {
	// Type is Exact, Prefix or RegularExpression.
	Type string `json:"type"`
	// Value is the path, prefix or expression.
	Value string `json:"value"`
}

// HeaderMatch matches a request header. Exact match on Value; an empty
// Value only requires the header to be present.
type HeaderMatch struct {
	// Name is the header name, matched case-insensitively.
	Name string `json:"name"`
	// Value, when set, must equal one of the header's values.
	Value string `json:"value,omitempty"`
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
	// X-Forwarded-For entry that the policy's TrustedProxies select.
	ClientIP *struct{} `json:"clientIP,omitempty"`
	// JWTClaim reads a claim of the request's verified bearer token (see
	// Policy.JWT). A dotted name ("org.id") reads a nested claim when no
	// top-level claim has that exact name. A missing, unverifiable or
	// forged token is a missing part.
	JWTClaim string `json:"jwtClaim,omitempty"`
	// Path reads the cleaned request path.
	Path *struct{} `json:"path,omitempty"`
	// Method reads the request method.
	Method *struct{} `json:"method,omitempty"`
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
