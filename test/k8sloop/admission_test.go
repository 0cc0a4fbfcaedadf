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
		out, err = kubectl.RunWithInput(ctx, []byte(policyYAML(ns, "other", strings.Replace(spec, "nope", "default", 1))), "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring(`the namespace's sidecars share one CounterStore, "nope", used by policy "api"`))
	})
})
