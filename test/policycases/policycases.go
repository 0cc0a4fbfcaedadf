// Package policycases holds the bad input that admission must refuse,
// each with what the refusal must say: the cases that the envtest suites
// apply with the real kubectl (controllers/policy and test/k8sloop), and
// that kubectl floodgate check's agreement test runs through both check and
// a real apply.
package policycases

import (
	"fmt"
	"strings"
)

// Bad is a manifest that `kubectl apply` must reject, with the substrings
// its error must contain: the field path and the reason.
type Bad struct {
	Name string
	// Doc is a RateLimitPolicy spec (indented by two spaces), or a whole
	// manifest when it starts with "apiVersion:".
	Doc  string
	Want []string
	// SchemaOnly marks input that does not decode into the Go types, or
	// that only the schema rejects (unknown fields), so ValidateSemantics
	// is not expected to see it.
	SchemaOnly bool
}

// Manifest is the manifest of b: Doc when it is whole, else a
// RateLimitPolicy named "bad" with Doc as its spec.
func Manifest(b Bad) string {
	if strings.HasPrefix(b.Doc, "apiVersion:") {
		return b.Doc + "\n"
	}
	return "apiVersion: ratelimit.floodgate.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: bad}\nspec:" + b.Doc + "\n"
}

// shouldMatch is how the schema words a pattern mismatch.
const shouldMatch = "should match"

// okRule is a valid rule for bad inputs that break something else.
const okRule = `
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`

// unsupported is how the API server refuses a value outside an enum.
const unsupported = "Unsupported value"

// atLeastOne is how the schema words a minimum of 1.
const atLeastOne = "should be greater than or equal to 1"

// limitSplit is the field path of the first rule's limit.split.
const limitSplit = "spec.rules[0].limit.split"

// Schema are the inputs that the CRD's OpenAPI schema and CEL rules
// refuse, RateLimitPolicies and CounterStores.
var Schema = []Bad{
	{Name: "duplicate rule names", Doc: `
  podSelector: {}
  rules:` + okRule + okRule,
		Want: []string{"spec.rules", "rule names must be unique within a policy"}},
	{Name: "no rules", Doc: `
  podSelector: {}
  rules: []`,
		Want: []string{"spec.rules", "should have at least 1 items"}},
	{Name: "no podSelector", Doc: `
  rules:` + okRule,
		Want: []string{"spec.podSelector", "set exactly one of podSelector (the pods whose sidecars enforce the policy) and targetRef"}, SchemaOnly: true},
	{Name: "requests is 0", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 0, per: 1s}`,
		Want: []string{"spec.rules[0].limit.requests", atLeastOne}},
	{Name: "negative burst", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, burst: -1}`,
		Want: []string{"spec.rules[0].limit.burst", "should be greater than or equal to 0"}},
	{Name: "period below 1s", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 500ms}`,
		Want: []string{"spec.rules[0].limit.per", "must be between 1s and 366d (8784h)"}},
	{Name: "period above 366d", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 9000h}`,
		Want: []string{"spec.rules[0].limit.per", "must be between 1s and 366d (8784h)"}},
	{Name: "period in days, which Go durations lack", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1d}`,
		Want: []string{"spec.rules[0].limit.per", shouldMatch}, SchemaOnly: true},
	{Name: "burst with a window algorithm", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m, burst: 20, algorithm: SlidingWindow}`,
		Want: []string{"spec.rules[0].limit.burst", "burst is only valid with the TokenBucket and GCRA algorithms"}},
	{Name: "unknown algorithm", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m, algorithm: LeakyBucket}`,
		Want: []string{"spec.rules[0].limit.algorithm", unsupported, "LeakyBucket"}},
	{Name: "SlidingLog above 100000 requests", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100001, per: 1h, algorithm: SlidingLog}`,
		Want: []string{"spec.rules[0].limit.requests", "SlidingLog keeps one entry per admitted request, so requests must be at most 100000"}},
	{Name: "cost.max above capacity", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    cost: {fromHeader: X-Cost, max: 11}`,
		Want: []string{"spec.rules[0].cost.max", "must not exceed the rule's capacity"}},
	{Name: "cost.default above capacity", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100, per: 1s, burst: 5}
    cost: {default: 6}`,
		Want: []string{"spec.rules[0].cost.default", "must not exceed the rule's capacity"}},
	{Name: "an unknown lease mode", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, lease: Always}`,
		Want: []string{"spec.rules[0].limit.lease", unsupported, "Always"}},
	{Name: "split above 16", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100, per: 1s, split: 17}`,
		Want: []string{limitSplit, "should be less than or equal to 16"}},
	{Name: "split above requests", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 2, per: 1s, split: 3}`,
		Want: []string{limitSplit, "split must not exceed requests"}},
	{Name: "split above burst", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100, per: 1s, burst: 2, split: 3}`,
		Want: []string{limitSplit, "split must not exceed burst"}},
	{Name: "cost.default above one sub-counter", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, split: 3}
    cost: {default: 4}`,
		Want: []string{"spec.rules[0].cost.default", "cost.default must fit one sub-counter"}},
	{Name: "cost.max above one sub-counter", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, split: 2}
    cost: {fromHeader: X-Cost, max: 6}`,
		Want: []string{"spec.rules[0].cost.max", "cost.max must fit one sub-counter"}},
	{Name: "cost.max without fromHeader", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    cost: {max: 5}`,
		Want: []string{"spec.rules[0].cost.max", "max bounds a header-supplied cost, so it needs fromHeader"}},
	{Name: "cost 0", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    cost: {default: 0}`,
		// In Go an explicit 0 is the unset default, so only the schema sees it.
		Want: []string{"spec.rules[0].cost.default", atLeastOne}, SchemaOnly: true},
	{Name: "a pattern in a Prefix path", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {path: {type: Prefix, value: "/api/.*"}}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.path.value", "must be a literal absolute path", "use type RegularExpression"}},
	{Name: "a relative Exact path", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {path: {type: Exact, value: login}}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.path.value", "must be a literal absolute path"}},
	{Name: "unknown method", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {methods: [FETCH]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.methods[0]", unsupported, "FETCH"}},
	{Name: "key and keys", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    keys: [[{header: X-API-Key}]]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].keys", "set key or keys, not both"}},
	{Name: "no key alternative", Doc: `
  podSelector: {}
  rules:
  - name: r
    keys: []
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].keys", "should have at least 1 items"}},
	{Name: "hops without cidrs", Doc: `
  podSelector: {}
  trustedProxies: {hops: 1}
  rules:
  - name: r
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.trustedProxies.cidrs", "hops alone is not enough"}},
	{Name: "a key part with two fields", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{header: X-API-Key, clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].key[0]", "exactly one of header, query, clientIP, jwtClaim, path, method or expression"}},
	{Name: "an empty key part", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].key[0]", "exactly one of header, query, clientIP, jwtClaim, path, method or expression"}},
	{Name: "a header key that is not a header name", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{header: "X API Key"}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].key[0].header", shouldMatch}},
	{Name: "a rule name that is not a DNS label", Doc: `
  podSelector: {}
  rules:
  - name: Per_User
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].name", shouldMatch}},
	{Name: "unknown failureMode", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    failureMode: Maybe`,
		Want: []string{"spec.rules[0].failureMode", unsupported, "Maybe"}},
	{Name: "unknown responseHeaders", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    responseHeaders: Limit`,
		Want: []string{"spec.rules[0].responseHeaders", unsupported, "Limit"}},
	{Name: "responseHeaders on a concurrency rule", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    concurrency: {max: 10}
    responseHeaders: None`,
		Want: []string{"spec.rules[0].responseHeaders", "rate limits only"}},
	{Name: "unknown mode", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    mode: Audit`,
		Want: []string{"spec.rules[0].mode", unsupported, "Audit"}},
	{Name: "a CIDR with host bits", Doc: `
  podSelector: {}
  trustedProxies: {cidrs: [10.1.2.3/8]}
  rules:` + okRule,
		Want: []string{"spec.trustedProxies.cidrs[0]", "must be a CIDR with no host bits set"}},
	{Name: "not a CIDR", Doc: `
  podSelector: {}
  trustedProxies: {cidrs: [10.0.0.1]}
  rules:` + okRule,
		Want: []string{"spec.trustedProxies.cidrs[0]", "must be a CIDR with no host bits set"}},
	{Name: "empty trustedProxies", Doc: `
  podSelector: {}
  trustedProxies: {}
  rules:` + okRule,
		Want: []string{"spec.trustedProxies.cidrs", "cidrs is required"}},
	{Name: "too many hops", Doc: `
  podSelector: {}
  trustedProxies: {hops: 33}
  rules:` + okRule,
		Want: []string{"spec.trustedProxies.hops", "should be less than or equal to 32"}},
	{Name: "a jwtClaim key without jwt", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{jwtClaim: sub}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.jwt", "jwt must be set when a rule keys on a jwtClaim"}},
	{Name: "jwt with two key sources", Doc: `
  podSelector: {}
  jwt:
    hmacSecretRef: {name: k, key: hmac}
    jwksConfigMapRef: {name: j, key: jwks.json}
  rules:` + okRule,
		Want: []string{"spec.jwt", "set exactly one of hmacSecretRef, jwksConfigMapRef, or upstreamVerified: true"}},
	{Name: "a typo in a field name", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limt: {requests: 10, per: 1s}`,
		Want: []string{`unknown field "spec.rules[0].limt"`}, SchemaOnly: true},
	{Name: "a storeRef that is not a name", Doc: `
  podSelector: {}
  storeRef: {name: "Main Store"}
  rules:` + okRule,
		Want: []string{"spec.storeRef.name", shouldMatch}},
	{Name: "a header match with value and regex", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {headers: [{name: X-Tier, value: free, regex: "fr.*"}]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.headers[0]", "set at most one of value, regex and absent"}},
	{Name: "a header both absent and inverted", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {headers: [{name: X-Tier, absent: true, invert: true}]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.headers[0].invert", "invert cannot go with absent"}},
	{Name: "a query match with value and absent", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {query: [{name: page, value: "1", absent: true}]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.query[0]", "set at most one of value, regex and absent"}},
	{Name: "a host with a port", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {hosts: ["api.example.com:443"]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.hosts[0]", shouldMatch}},
	{Name: "a source network with host bits", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {sourceCIDRs: [10.1.2.3/8]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.sourceCIDRs[0]", "must be a CIDR with no host bits set"}},
	{Name: "an exempt network that is not a CIDR", Doc: `
  podSelector: {}
  exempt: {sourceCIDRs: [internal]}
  rules:` + okRule,
		Want: []string{"spec.exempt.sourceCIDRs[0]", "must be a CIDR with no host bits set"}},
	{Name: "an empty exemption", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    exempt: {}`,
		Want: []string{"spec.rules[0].exempt", "set sourceCIDRs, when, or both"}},
	{Name: "a key part with an expression and a header", Doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{expression: "request.path", header: X-Key}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].key[0]", "exactly one of header, query, clientIP, jwtClaim, path, method or expression"}},
	{Name: "an empty condition", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {when: [""]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.when[0]", "should be at least 1 chars long"}},
	{Name: "nine conditions", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {when: ["true", "true", "true", "true", "true", "true", "true", "true", "true"]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.when", "must have at most 8 items"}},
	{Name: "a condition longer than 2048 characters", Doc: `
  podSelector: {}
  rules:
  - name: r
    match: {when: ["` + strings.Repeat("true && ", 256) + `true"]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		Want: []string{"spec.rules[0].match.when[0]", "Too long", "2048"}},
	{Name: "a CounterStore both managed and external", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata: {name: both}
spec:
  managed: {shards: 3}
  external: {addresses: ["redis:6379"]}`,
		Want: []string{"spec", "set exactly one of managed or external"}, SchemaOnly: true},
	{Name: "a CounterStore address without a port", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata: {name: noport}
spec:
  external: {addresses: ["redis.example"]}`,
		Want: []string{"spec.external.addresses[0]", shouldMatch}, SchemaOnly: true},
	{Name: "a CounterStore nodeTimeout above 60s", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata: {name: slow}
spec:
  managed: {nodeTimeout: 2m}`,
		Want: []string{"spec.managed.nodeTimeout", "must be between 1s and 60s"}, SchemaOnly: true},
	{Name: "a CounterStore with no shards", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata: {name: empty}
spec:
  managed: {shards: 0}`,
		Want: []string{"spec.managed.shards", atLeastOne}, SchemaOnly: true},
}

// ClusterSchema are the ClusterRateLimitPolicies that the CRD's schema and
// CEL rules refuse.
var ClusterSchema = []Bad{
	{Name: "a ClusterRateLimitPolicy with no rules", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: ClusterRateLimitPolicy
metadata: {name: bad-empty}
spec:
  namespaceSelector: {}
  podSelector: {}`,
		Want: []string{"spec", "set defaults, overrides, or both"}},
	{Name: "a ClusterRateLimitPolicy name too long for the sidecars", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: ClusterRateLimitPolicy
metadata: {name: ` + strings.Repeat("n", 56) + `}
spec:
  namespaceSelector: {}
  podSelector: {}
  defaults:
    rules:` + strings.ReplaceAll(okRule, "\n  ", "\n      "),
		Want: []string{"the name must be at most 55 characters"}},
	{Name: "a ClusterRateLimitPolicy keyed on a jwtClaim", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: ClusterRateLimitPolicy
metadata: {name: bad-jwt}
spec:
  namespaceSelector: {}
  podSelector: {}
  overrides:
    rules:
    - name: r
      key: [{jwtClaim: sub}]
      limit: {requests: 10, per: 1s}`,
		Want: []string{"cannot key on jwtClaim"}},
	{Name: "a ClusterRateLimitPolicy rule both default and override", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: ClusterRateLimitPolicy
metadata: {name: bad-both}
spec:
  namespaceSelector: {}
  podSelector: {}
  defaults:
    rules:` + strings.ReplaceAll(okRule, "\n  ", "\n      ") + `
  overrides:
    rules:` + strings.ReplaceAll(okRule, "\n  ", "\n      "),
		Want: []string{"spec.overrides", "a rule name is either a default or an override, not both"}},
}

// Webhook are the inputs that the CRD's schema and CEL rules admit and
// floodgate's validating webhook refuses (but the last, which the CEL rule
// catches first).
var Webhook = []Bad{
	{Name: "a regular expression that does not compile", Doc: `
  podSelector: {matchLabels: {app: api}}
  rules:
  - name: api
    match: {path: {type: RegularExpression, value: "/api/(v1"}}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}`,
		Want: []string{`spec.rules[0].match.path.value: Invalid value: "/api/(v1": not a valid RE2 regular expression`}},
	{Name: "a label selector with an unknown operator", Doc: `
  podSelector: {matchExpressions: [{key: tier, operator: Near, values: [a]}]}
  rules:
  - name: api
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}`,
		Want: []string{`spec.podSelector.matchExpressions[0].operator: Invalid value: "Near"`}},
	{Name: "a period the limiter cannot represent", Doc: `
  podSelector: {matchLabels: {app: api}}
  rules:
  - name: api
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1.0000005s}`,
		Want: []string{`spec.rules[0].limit.per: Invalid value: "1.0000005s": must be a whole number of microseconds`}},
	{Name: "a bucket that takes more than a century to refill", Doc: `
  podSelector: {matchLabels: {app: api}}
  rules:
  - name: api
    key: [{clientIP: {}}]
    limit: {requests: 1, per: 8784h, burst: 1000}`,
		Want: []string{`spec.rules[0].limit.burst: Invalid value: 1000: a capacity of 1000 at 1 per 8784h0m0s takes longer than`}},
	{Name: "several problems at once", Doc: `
  podSelector: {matchLabels: {app: api}}
  rules:
  - name: a
    match: {path: {type: RegularExpression, value: "["}}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}
  - name: b
    match: {path: {type: RegularExpression, value: "(?<"}}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}`,
		Want: []string{"spec.rules[0].match.path.value", "spec.rules[1].match.path.value"}},
	{Name: "a name the compiled document cannot carry (the compiler's own check)", Doc: fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: %[1]s}
spec:
  podSelector: {matchLabels: {app: api}}
  rules:
  - name: api
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}`, LongName),
		Want: []string{`The RateLimitPolicy "` + LongName + `" is invalid: spec: Invalid value: the compiled policy fails the sidecar's validation: policies[0].name: must be 1-63`}},
	{Name: "a condition that is not a condition", Doc: `
  podSelector: {matchLabels: {app: api}}
  rules:
  - name: api
    match: {when: ["request.method"]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}`,
		Want: []string{`spec.rules[0].match.when[0]: Invalid value: "request.method": must be a condition (of type bool), but is of type string`}},
	{Name: "a condition whose worst case costs too much", Doc: `
  podSelector: {matchLabels: {app: api}}
  rules:
  - name: api
    match: {when: ["request.headers.all(a, request.headers.all(b, a != b))"]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}`,
		Want: []string{"spec.rules[0].match.when[0]", "its estimated worst-case cost", "exceeds the limit 1000000"}},
	{Name: "a ClusterRateLimitPolicy key expression that does not compile", Doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: ClusterRateLimitPolicy
metadata: {name: bad-expression}
spec:
  namespaceSelector: {}
  podSelector: {}
  defaults:
    rules:
    - name: per-org
      key: [{expression: "request.headers['x-org'"}]
      limit: {requests: 10, per: 1m}`,
		Want: []string{`spec.defaults.rules[0].key[0].expression`, "not a valid CEL expression"}},
	{Name: "a jwtClaim key without a verified key source (caught by the CRD's CEL rule first)", Doc: `
  podSelector: {matchLabels: {app: api}}
  rules:
  - name: api
    key: [{jwtClaim: sub}]
    limit: {requests: 10, per: 1m}`,
		Want: []string{"spec.jwt", "jwt must be set when a rule keys on a jwtClaim"}},
}

// LongName is a valid object name that the compiled sidecar config cannot
// carry (more than 63 characters).
var LongName = strings.Repeat("a", 70)
