package e2e

import (
	"fmt"
	"net/http"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("a shadow-mode rule", func() {
	It("never blocks, and counts its would-deny in the sidecar's metrics", func(ctx SpecContext) {
		ns := newNamespace(ctx, "shadow")
		// 5 per hour: 12 requests in a row would leave 7 denied.
		apply(ctx, "shadow-policy.yaml", fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: trial
  namespace: %s
spec:
  podSelector:
    matchLabels: {app: shadow}
  storeRef: {name: %s}
  rules:
  - name: per-tenant-trial
    key:
    - header: X-Tenant
    limit: {requests: 5, per: 1h, algorithm: TokenBucket}
    mode: Shadow
`, ns, storeName))
		Eventually(func() string { return condition(ctx, ns, "trial", "Accepted") }).WithContext(ctx).Should(Equal("True/Accepted"))
		fleet := startFleet(ctx, ns, "shadow", "trial", 1)
		m := fleet[0]

		match := func(result string) map[string]string {
			return map[string]string{"policy": "trial", "rule": "per-tenant-trial", "result": result}
		}
		for i := range 12 {
			r := mustSend(ctx, m.sidecar.URL, http.MethodGet, "/catalog", "X-Tenant", "acme")
			Expect(r.status).To(Equal(http.StatusOK), "request %d", i)
			Expect(r.header.Get("Retry-After")).To(BeEmpty(), "request %d", i)
		}
		Expect(m.backend.Hits()).To(Equal(int64(12)), "the app receives everything")
		allowed, err := m.sidecar.Metric(ctx, "floodgate_sidecar_decisions_total", match("allowed"))
		Expect(err).NotTo(HaveOccurred())
		shadowDenied, err := m.sidecar.Metric(ctx, "floodgate_sidecar_decisions_total", match("shadow_denied"))
		Expect(err).NotTo(HaveOccurred())
		denied, err := m.sidecar.Metric(ctx, "floodgate_sidecar_decisions_total", match("denied"))
		Expect(err).NotTo(HaveOccurred())
		proxied, err := m.sidecar.Metric(ctx, "floodgate_sidecar_requests_total", map[string]string{"outcome": "proxied"})
		Expect(err).NotTo(HaveOccurred())
		AddReportEntry("shadow rule, 12 requests against 5 per hour",
			fmt.Sprintf("allowed %.0f, shadow_denied %.0f, denied %.0f, proxied %.0f", allowed, shadowDenied, denied, proxied))
		Expect(allowed).To(Equal(5.0))
		Expect(shadowDenied).To(Equal(7.0))
		Expect(denied).To(BeZero())
		Expect(proxied).To(Equal(12.0))
	})
})
