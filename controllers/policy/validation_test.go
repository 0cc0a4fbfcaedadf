package policy_test

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

// badInput is a manifest that `kubectl apply` must reject, with the
// substrings its error must contain: the field path and the reason.
type badInput struct {
	name string
	// doc is a RateLimitPolicy spec (indented by two spaces), or a whole
	// manifest when it starts with "apiVersion:".
	doc  string
	want []string
	// schemaOnly marks input that does not decode into the Go types, or
	// that only the schema rejects (unknown fields), so ValidateSemantics
	// is not expected to see it.
	schemaOnly bool
}

// okRule is a valid rule for bad inputs that break something else.
const okRule = `
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`

var badInputs = []badInput{
	{name: "duplicate rule names", doc: `
  podSelector: {}
  rules:` + okRule + okRule,
		want: []string{"spec.rules", "rule names must be unique within a policy"}},
	{name: "no rules", doc: `
  podSelector: {}
  rules: []`,
		want: []string{"spec.rules", "should have at least 1 items"}},
	{name: "no podSelector", doc: `
  rules:` + okRule,
		want: []string{"spec.podSelector", "Required value"}, schemaOnly: true},
	{name: "requests is 0", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 0, per: 1s}`,
		want: []string{"spec.rules[0].limit.requests", "should be greater than or equal to 1"}},
	{name: "negative burst", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, burst: -1}`,
		want: []string{"spec.rules[0].limit.burst", "should be greater than or equal to 0"}},
	{name: "period below 1s", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 500ms}`,
		want: []string{"spec.rules[0].limit.per", "must be between 1s and 366d (8784h)"}},
	{name: "period above 366d", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 9000h}`,
		want: []string{"spec.rules[0].limit.per", "must be between 1s and 366d (8784h)"}},
	{name: "period in days, which Go durations lack", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1d}`,
		want: []string{"spec.rules[0].limit.per", "should match"}, schemaOnly: true},
	{name: "burst with a window algorithm", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m, burst: 20, algorithm: SlidingWindow}`,
		want: []string{"spec.rules[0].limit.burst", "burst is only valid with the TokenBucket and GCRA algorithms"}},
	{name: "unknown algorithm", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m, algorithm: LeakyBucket}`,
		want: []string{"spec.rules[0].limit.algorithm", "Unsupported value", "LeakyBucket"}},
	{name: "SlidingLog above 100000 requests", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100001, per: 1h, algorithm: SlidingLog}`,
		want: []string{"spec.rules[0].limit.requests", "SlidingLog keeps one entry per admitted request, so requests must be at most 100000"}},
	{name: "cost.max above capacity", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    cost: {fromHeader: X-Cost, max: 11}`,
		want: []string{"spec.rules[0].cost.max", "must not exceed the rule's capacity"}},
	{name: "cost.default above capacity", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100, per: 1s, burst: 5}
    cost: {default: 6}`,
		want: []string{"spec.rules[0].cost.default", "must not exceed the rule's capacity"}},
	{name: "an unknown lease mode", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, lease: Always}`,
		want: []string{"spec.rules[0].limit.lease", "Unsupported value", "Always"}},
	{name: "split above 16", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100, per: 1s, split: 17}`,
		want: []string{"spec.rules[0].limit.split", "should be less than or equal to 16"}},
	{name: "split above requests", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 2, per: 1s, split: 3}`,
		want: []string{"spec.rules[0].limit.split", "split must not exceed requests"}},
	{name: "split above burst", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 100, per: 1s, burst: 2, split: 3}`,
		want: []string{"spec.rules[0].limit.split", "split must not exceed burst"}},
	{name: "cost.default above one sub-counter", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, split: 3}
    cost: {default: 4}`,
		want: []string{"spec.rules[0].cost.default", "cost.default must fit one sub-counter"}},
	{name: "cost.max above one sub-counter", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s, split: 2}
    cost: {fromHeader: X-Cost, max: 6}`,
		want: []string{"spec.rules[0].cost.max", "cost.max must fit one sub-counter"}},
	{name: "cost.max without fromHeader", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    cost: {max: 5}`,
		want: []string{"spec.rules[0].cost.max", "max bounds a header-supplied cost, so it needs fromHeader"}},
	{name: "cost 0", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    cost: {default: 0}`,
		// In Go an explicit 0 is the unset default, so only the schema sees it.
		want: []string{"spec.rules[0].cost.default", "should be greater than or equal to 1"}, schemaOnly: true},
	{name: "a pattern in a Prefix path", doc: `
  podSelector: {}
  rules:
  - name: r
    match: {path: {type: Prefix, value: "/api/.*"}}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		want: []string{"spec.rules[0].match.path.value", "must be a literal absolute path", "use type RegularExpression"}},
	{name: "a relative Exact path", doc: `
  podSelector: {}
  rules:
  - name: r
    match: {path: {type: Exact, value: login}}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		want: []string{"spec.rules[0].match.path.value", "must be a literal absolute path"}},
	{name: "unknown method", doc: `
  podSelector: {}
  rules:
  - name: r
    match: {methods: [FETCH]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		want: []string{"spec.rules[0].match.methods[0]", "Unsupported value", "FETCH"}},
	{name: "no key parts", doc: `
  podSelector: {}
  rules:
  - name: r
    key: []
    limit: {requests: 10, per: 1s}`,
		want: []string{"spec.rules[0].key", "should have at least 1 items"}},
	{name: "a key part with two fields", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{header: X-API-Key, clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		want: []string{"spec.rules[0].key[0]", "exactly one of header, query, clientIP, jwtClaim, path or method"}},
	{name: "an empty key part", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{}]
    limit: {requests: 10, per: 1s}`,
		want: []string{"spec.rules[0].key[0]", "exactly one of header, query, clientIP, jwtClaim, path or method"}},
	{name: "a header key that is not a header name", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{header: "X API Key"}]
    limit: {requests: 10, per: 1s}`,
		want: []string{"spec.rules[0].key[0].header", "should match"}},
	{name: "a rule name that is not a DNS label", doc: `
  podSelector: {}
  rules:
  - name: Per_User
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}`,
		want: []string{"spec.rules[0].name", "should match"}},
	{name: "unknown failureMode", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    failureMode: Maybe`,
		want: []string{"spec.rules[0].failureMode", "Unsupported value", "Maybe"}},
	{name: "unknown mode", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1s}
    mode: Audit`,
		want: []string{"spec.rules[0].mode", "Unsupported value", "Audit"}},
	{name: "a CIDR with host bits", doc: `
  podSelector: {}
  trustedProxies: {cidrs: [10.1.2.3/8]}
  rules:` + okRule,
		want: []string{"spec.trustedProxies.cidrs[0]", "must be a CIDR with no host bits set"}},
	{name: "not a CIDR", doc: `
  podSelector: {}
  trustedProxies: {cidrs: [10.0.0.1]}
  rules:` + okRule,
		want: []string{"spec.trustedProxies.cidrs[0]", "must be a CIDR with no host bits set"}},
	{name: "empty trustedProxies", doc: `
  podSelector: {}
  trustedProxies: {}
  rules:` + okRule,
		want: []string{"spec.trustedProxies", "set cidrs, hops, or both"}},
	{name: "too many hops", doc: `
  podSelector: {}
  trustedProxies: {hops: 33}
  rules:` + okRule,
		want: []string{"spec.trustedProxies.hops", "should be less than or equal to 32"}},
	{name: "a jwtClaim key without jwt", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{jwtClaim: sub}]
    limit: {requests: 10, per: 1s}`,
		want: []string{"spec.jwt", "jwt must be set when a rule keys on a jwtClaim"}},
	{name: "jwt with two key sources", doc: `
  podSelector: {}
  jwt:
    hmacSecretRef: {name: k, key: hmac}
    jwksConfigMapRef: {name: j, key: jwks.json}
  rules:` + okRule,
		want: []string{"spec.jwt", "set exactly one of hmacSecretRef, jwksConfigMapRef, or upstreamVerified: true"}},
	{name: "a typo in a field name", doc: `
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
    limt: {requests: 10, per: 1s}`,
		want: []string{`unknown field "spec.rules[0].limt"`}, schemaOnly: true},
	{name: "a storeRef that is not a name", doc: `
  podSelector: {}
  storeRef: {name: "Main Store"}
  rules:` + okRule,
		want: []string{"spec.storeRef.name", "should match"}},
	{name: "a CounterStore both managed and external", doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata: {name: both}
spec:
  managed: {shards: 3}
  external: {addresses: ["redis:6379"]}`,
		want: []string{"spec", "set exactly one of managed or external"}, schemaOnly: true},
	{name: "a CounterStore address without a port", doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata: {name: noport}
spec:
  external: {addresses: ["redis.example"]}`,
		want: []string{"spec.external.addresses[0]", "should match"}, schemaOnly: true},
	{name: "a CounterStore nodeTimeout above 60s", doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata: {name: slow}
spec:
  managed: {nodeTimeout: 2m}`,
		want: []string{"spec.managed.nodeTimeout", "must be between 1s and 60s"}, schemaOnly: true},
	{name: "a CounterStore with no shards", doc: `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata: {name: empty}
spec:
  managed: {shards: 0}`,
		want: []string{"spec.managed.shards", "should be greater than or equal to 1"}, schemaOnly: true},
}

func manifest(in badInput) string {
	if strings.HasPrefix(in.doc, "apiVersion:") {
		return in.doc + "\n"
	}
	return "apiVersion: ratelimit.floodgate.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: bad}\nspec:" + in.doc + "\n"
}

var _ = Describe("kubectl apply of bad input", func() {
	It("rejects each bad input with a message naming the field", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		var report strings.Builder
		for _, in := range badInputs {
			doc := manifest(in)
			out, err := kubectl.RunWithInput(ctx, []byte(doc), "apply", "-n", ns, "-f", "-")
			Expect(err).To(HaveOccurred(), "%s: kubectl apply accepted:\n%s", in.name, doc)
			for _, w := range in.want {
				Expect(out).To(ContainSubstring(w), "%s: the error does not say %q", in.name, w)
			}
			fmt.Fprintf(&report, "- %s\n  %s\n", in.name, out)

			if in.schemaOnly {
				continue
			}
			// The Go validation, which a webhook will run, agrees.
			var p v1alpha1.RateLimitPolicy
			Expect(yaml.Unmarshal([]byte(doc), &p)).To(Succeed(), in.name)
			errs := p.ValidateSemantics()
			Expect(errs).NotTo(BeEmpty(), "%s: ValidateSemantics accepts what the API server rejects", in.name)
		}
		AddReportEntry("kubectl apply rejections", report.String())
		GinkgoWriter.Print(report.String())
	})

	It("accepts, at apply time, what only the controller can check, and reports it in status", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		doc := manifest(badInput{doc: `
  podSelector: {}
  storeRef: {name: nowhere}
  rules:
  - name: r
    match: {path: {type: RegularExpression, value: "^/items/(unclosed"}}
    key: [{path: {}}]
    limit: {requests: 10, per: 1s}`})
		out, err := kubectl.RunWithInput(ctx, []byte(doc), "apply", "-n", ns, "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(policyStatus(ctx, ns, "bad"), timeout, poll).Should(
			haveCondition(v1alpha1.ConditionAccepted, "False", v1alpha1.ReasonInvalid))
		msg := conditionMessage(policyStatus(ctx, ns, "bad")(Default), v1alpha1.ConditionAccepted)
		Expect(msg).To(ContainSubstring("spec.rules[0].match.path.value"))
		Expect(msg).To(ContainSubstring("missing closing )"))
		AddReportEntry("accepted by kubectl, rejected by the controller", msg)
	})
})
