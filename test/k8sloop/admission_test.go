package k8sloop

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/floodgate-dev/floodgate/test/policycases"
)

// policyYAML is a RateLimitPolicy manifest whose one rule has the given
// match, key and limit blocks (YAML, indented for the rule).
func policyYAML(ns, name, extra string) string {
	return fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: %s
  namespace: %s
spec:
  podSelector: {matchLabels: {app: api}}
%s`, name, ns, extra)
}

var _ = Describe("the RateLimitPolicy validator", func() {
	It("rejects what CEL cannot check, with messages that name the field", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		for _, tc := range policycases.Webhook {
			out, err := kubectl.RunWithInput(ctx, []byte(policycases.Manifest(tc)), "apply", "-n", ns, "-f", "-")
			Expect(err).To(HaveOccurred(), "kubectl accepted %s", tc.Name)
			for _, w := range tc.Want {
				Expect(out).To(ContainSubstring(w), tc.Name)
			}
			AddReportEntry("policy rejection: "+tc.Name, out)
		}
	})

	It("admits a valid policy with warnings about what is not yet right", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		spec := `  storeRef: {name: nope}
  rules:
  - name: per-client
    key: [{header: X-Client}]
    limit: {requests: 10, per: 1m}
`
		out, err := kubectl.RunWithInput(ctx, []byte(policyYAML(ns, "api", spec)), "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring(`Warning: spec.storeRef.name: CounterStore "nope" does not exist`))
		Expect(out).To(ContainSubstring("ratelimitpolicy.ratelimit.floodgate.dev/api created"))

		out, err = kubectl.RunWithInput(ctx, []byte(policyYAML(ns, "api", strings.Replace(spec, "per-client", "per-key", 1))), "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring(`Warning: spec.rules: rule "per-client" was removed or renamed`))
		AddReportEntry("policy warnings", out)

		By("warning about a store different from the namespace's")
		// The validator reads the namespace's other policies from the
		// manager's cache: wait until the manager has seen api (its
		// controller reports the current generation, read from that cache).
		Eventually(func(g Gomega) {
			p := getPolicy(ctx, ns, "api")
			g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
		}).Should(Succeed())
		out, err = kubectl.RunWithInput(ctx, []byte(policyYAML(ns, "other", strings.Replace(spec, "nope", "default", 1))), "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring(`the namespace's sidecars share one CounterStore, "nope", used by policy "api"`))
	})

	It("rejects bad CEL, costly CEL and bad networks in the new matching fields, naming each field", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		cases := []struct {
			what, spec string
			want       []string
		}{{
			"a condition that does not compile",
			`  rules:
  - name: api
    match: {when: ["request.method == GET"]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}
`,
			[]string{`spec.rules[0].match.when[0]: Invalid value: "request.method == GET": not a valid CEL expression`, "undeclared reference to 'GET'"},
		}, {
			"a condition whose worst case costs too much",
			`  rules:
  - name: api
    match: {when: ["request.headers.all(a, request.headers.all(b, a != b))"]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}
`,
			[]string{`spec.rules[0].match.when[0]`, "its estimated worst-case cost", "exceeds the limit 1000000"},
		}, {
			"a key expression of the wrong type",
			`  rules:
  - name: api
    key: [{expression: "request.headers"}]
    limit: {requests: 10, per: 1m}
`,
			[]string{`spec.rules[0].key[0].expression`, "must compute a string, a number or a bool"},
		}, {
			"an exempt condition reading claims without jwt",
			`  exempt: {when: ["auth.claims.role == 'admin'"]}
  rules:
  - name: api
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}
`,
			[]string{`spec.exempt.when[0]`, "reads auth.claims, so the policy's jwt section must be set"},
		}, {
			"a client network with host bits (caught by the CRD's CEL rule first)",
			`  rules:
  - name: api
    match: {sourceCIDRs: [192.0.2.9/24]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}
`,
			[]string{`spec.rules[0].match.sourceCIDRs[0]`, "must be a CIDR with no host bits set"},
		}, {
			"a header regex that does not compile",
			`  rules:
  - name: api
    match: {headers: [{name: X-Tier, regex: "free|(trial"}]}
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}
`,
			[]string{`spec.rules[0].match.headers[0].regex: Invalid value: "free|(trial": not a valid RE2 regular expression`},
		}}
		for i, tc := range cases {
			out, err := kubectl.RunWithInput(ctx, []byte(policyYAML(ns, fmt.Sprintf("cel-%d", i), tc.spec)), "apply", "-f", "-")
			Expect(err).To(HaveOccurred(), "kubectl accepted %s", tc.what)
			for _, w := range tc.want {
				Expect(out).To(ContainSubstring(w), tc.what)
			}
			AddReportEntry("policy rejection: "+tc.what, out)
		}

		By("rejecting a ClusterRateLimitPolicy whose CEL does not compile")
		out, err := kubectl.RunWithInput(ctx, []byte(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: ClusterRateLimitPolicy
metadata: {name: bad-floor}
spec:
  namespaceSelector: {}
  podSelector: {}
  exempt: {sourceCIDRs: [10.0.0.0/8], when: ["request.path.startsWith('/health"]}
  defaults:
    rules:
    - name: per-ip
      key: [{clientIP: {}}]
      limit: {requests: 1000, per: 1s}
`), "apply", "-f", "-")
		Expect(err).To(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(`The ClusterRateLimitPolicy "bad-floor" is invalid: spec.exempt.when[0]`))
		Expect(out).To(ContainSubstring("not a valid CEL expression"))
		AddReportEntry("cluster policy rejection", out)

		By("admitting valid CEL")
		out, err = kubectl.RunWithInput(ctx, []byte(policyYAML(ns, "good-cel", `  exempt: {sourceCIDRs: [10.0.0.0/8]}
  rules:
  - name: api
    match: {when: ["request.path.startsWith('/api/')", "request.headers['x-tier'] == 'free'"], hosts: ["*.example.com"]}
    key: [{expression: "request.headers['x-org']"}]
    limit: {requests: 10, per: 1m}
`)), "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
	})

	It("warns about what lets requests past a rule, and about references that do not exist", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		out, err := kubectl.RunWithInput(ctx, []byte(policyYAML(ns, "risky", `  jwt: {hmacSecretRef: {name: jwt-key, key: hmac}}
  rules:
  - name: per-user
    keys: [[{jwtClaim: sub}], [{header: X-API-Key}]]
    onMissingKey: Skip
    limit: {requests: 10, per: 1m}
  - name: everyone
    limit: {requests: 1000, per: 1s}
`)), "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(`Warning: spec.rules[0].onMissingKey: Skip lets every request that carries none of the rule's keys past rule "per-user" unlimited`))
		Expect(out).To(ContainSubstring(`Warning: spec.rules[1]: rule "everyone" has no key: one counter for every request it matches`))
		Expect(out).To(ContainSubstring(`Warning: spec.jwt.hmacSecretRef.name: Secret "jwt-key" does not exist in namespace ` + ns))
		AddReportEntry("bypass warnings", out)

		By("defaulting onMissingKey to Shared and onInvalidToken to Reject")
		out, err = kubectl.RunWithInput(ctx, []byte(policyYAML(ns, "safe", `  jwt: {upstreamVerified: true}
  rules:
  - name: per-user
    key: [{jwtClaim: sub}]
    limit: {requests: 10, per: 1m}
`)), "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		// The namespace has no CounterStore, which is warned about; nothing
		// about the rules or the JWT keys is.
		Expect(out).NotTo(ContainSubstring("Warning: spec.rules"))
		Expect(out).NotTo(ContainSubstring("Warning: spec.jwt"))
		got, err := kubectl.Run(ctx, "get", "rlp", "safe", "-n", ns, "-o", "jsonpath={.spec.rules[0].onMissingKey} {.spec.jwt.onInvalidToken}")
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal("Shared Reject"))
	})

	It("refuses hops without trusted CIDRs, and key and keys together", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		out, err := kubectl.RunWithInput(ctx, []byte(policyYAML(ns, "hops", `  trustedProxies: {hops: 1}
  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 10, per: 1m}
`)), "apply", "-f", "-")
		Expect(err).To(HaveOccurred())
		Expect(out).To(ContainSubstring("spec.trustedProxies.cidrs: Invalid value"))
		Expect(out).To(ContainSubstring("hops alone is not enough"))

		out, err = kubectl.RunWithInput(ctx, []byte(policyYAML(ns, "both", `  rules:
  - name: r
    key: [{clientIP: {}}]
    keys: [[{header: X-API-Key}]]
    limit: {requests: 10, per: 1m}
`)), "apply", "-f", "-")
		Expect(err).To(HaveOccurred())
		Expect(out).To(ContainSubstring("spec.rules[0].keys: Invalid value"))
		Expect(out).To(ContainSubstring("set key or keys, not both"))
	})
})
