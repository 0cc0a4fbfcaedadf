package e2e

import (
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
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
		fleet := startFleet(ctx, ns, "shadow", "trial", 1, exactStore...)
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

		By("showing the would-have-denied count in the policy's status within 30 s")
		start := time.Now()
		var status string
		Eventually(func(g Gomega) {
			status = kubectl(ctx, "-n", ns, "get", "rlp", "trial", "-o", "yaml")
			var p v1alpha1.RateLimitPolicy
			g.Expect(yaml.Unmarshal([]byte(status), &p)).To(Succeed())
			g.Expect(p.Status.Rules).To(HaveLen(1))
			r := p.Status.Rules[0]
			g.Expect(r.Name).To(Equal("per-tenant-trial"))
			g.Expect(r.Mode).To(Equal(v1alpha1.ModeShadow))
			g.Expect(r.WouldHaveDenied).To(HaveValue(Equal(int64(7))))
			g.Expect(r.Denied).To(BeNil())
			g.Expect(p.Status.Usage).NotTo(BeNil())
			g.Expect(p.Status.Usage.Pods).To(Equal(int32(1)))
			g.Expect(p.Status.Enforcing).To(Equal("1/1"))
			g.Expect(p.Status.Store).To(Equal(storeName))
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
		took := time.Since(start).Round(100 * time.Millisecond)
		AddReportEntry(fmt.Sprintf("kubectl get rlp -o yaml, %v after the traffic", took), status)
		out := kubectl(ctx, "-n", ns, "get", "rlp", "trial")
		AddReportEntry("kubectl get rlp", out)
		Expect(out).To(MatchRegexp(`(?m)^trial\s+True\s+True\s+1/1\s+` + storeName + `\s+\S+$`))
	})
})
