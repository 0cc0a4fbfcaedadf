package policy_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

var _ = Describe("concurrency rules, priorities and load shedding", func() {
	It("compile with the API server's defaults and every other default written out", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, true)
		createPod(ctx, ns, "api-0", map[string]string{"app": "api"})
		setPodReady(ctx, ns, "api-0", true)
		createPod(ctx, ns, "api-1", map[string]string{"app": "api"})
		setPodReady(ctx, ns, "api-1", true)
		doc := fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: admission, namespace: %s}
spec:
  podSelector: {matchLabels: {app: api}}
  storeRef: {name: %s}
  loadShedding:
    reserved: {critical: 25}
    maxLimit: 200
  rules:
  - name: exports
    match: {path: {value: /exports}}
    key: [{header: X-Tenant}]
    concurrency: {max: 10}
  - name: streams
    key: [{clientIP: {}}]
    concurrency: {max: 3, leaseTTL: 45s}
    failureMode: Closed
    mode: Shadow
  - name: pay
    match: {path: {value: /pay}}
    priority: Critical
  - name: per-user
    key: [{header: X-User}]
    limit: {requests: 100, per: 1m}
    priority: Sheddable
`, ns, store)
		out, err := kubectl.RunWithInput(ctx, []byte(doc), "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(policyStatus(ctx, ns, "admission"), timeout, poll).Should(
			haveCondition(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))

		// The first document may predate the pods' readiness in the
		// manager's cache: read the one compiled from both ready pods.
		var c *config.Config
		Eventually(func(g Gomega) {
			var err error
			c, _, err = compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.Policies).To(HaveLen(1))
			g.Expect(c.Policies[0].Replicas).To(Equal(int32(2)))
		}, timeout, poll).Should(Succeed())
		Expect(c.Policies).To(HaveLen(1))
		p := c.Policies[0]
		Expect(p.Replicas).To(Equal(int32(2)))
		crit, deflt := int32(25), int32(config.DefaultDefaultReserve)
		Expect(p.LoadShedding).To(Equal(&config.LoadShedding{
			Mode:     config.ModeEnforce, // the API server's default
			Reserved: config.Reserved{Critical: &crit, Default: &deflt},
			MinLimit: config.DefaultSheddingMinLimit, MaxLimit: 200,
		}))
		Expect(p.Rules).To(HaveLen(4))

		By("writing a concurrency rule with no limit and no cost, and its lease TTL defaulted")
		exports := p.Rules[0]
		Expect(exports.Concurrency).To(Equal(&config.Concurrency{Max: 10, LeaseTTL: metav1.Duration{Duration: 10 * time.Second}}))
		Expect(exports.IsRate()).To(BeFalse())
		Expect(exports.Cost).To(BeZero())
		Expect(exports.Match.Path).To(Equal(&config.PathMatch{Type: config.PathPrefix, Value: "/exports"}))
		Expect(exports.FailureMode).To(Equal(config.FailureOpen))
		Expect(exports.Mode).To(Equal(config.ModeEnforce))
		streams := p.Rules[1]
		Expect(streams.Concurrency).To(Equal(&config.Concurrency{Max: 3, LeaseTTL: metav1.Duration{Duration: 45 * time.Second}}))
		Expect(streams.FailureMode).To(Equal(config.FailureClosed))
		Expect(streams.Mode).To(Equal(config.ModeShadow))

		By("writing a rule that only sets a priority as a match and a priority")
		pay := p.Rules[2]
		Expect(pay.Priority).To(Equal(config.PriorityCritical))
		Expect(pay.IsRate()).To(BeFalse())
		Expect(pay.Concurrency).To(BeNil())
		Expect(pay.Key).To(BeEmpty())

		By("keeping a rate rule's limit beside its priority")
		perUser := p.Rules[3]
		Expect(perUser.Priority).To(Equal(config.PrioritySheddable))
		Expect(perUser.Limit.Requests).To(Equal(int64(100)))
		Expect(perUser.Limit.Algorithm).To(Equal("TokenBucket"))
	})
})
