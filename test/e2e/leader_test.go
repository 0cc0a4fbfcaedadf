package e2e

import (
	"fmt"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/test/simnode"
)

// leaseName is floodgate-manager's default --leader-election-id.
const leaseName = "floodgate-manager.ratelimit.floodgate.dev"

var _ = Describe("two manager replicas", func() {
	It("elect a new leader within 15 s of the leader's SIGKILL, which then reconciles", func(ctx SpecContext) {
		lease := func() string {
			l, err := stack.Kube.CoordinationV1().Leases(stack.OperatorNamespace()).Get(ctx, leaseName, metav1.GetOptions{})
			if err != nil || l.Spec.HolderIdentity == nil {
				return ""
			}
			return *l.Spec.HolderIdentity
		}
		leads := func(m *simnode.Manager) float64 {
			v, err := simnode.MetricSum(ctx, "http://"+m.MetricsAddr+"/metrics", "leader_election_master_status", nil)
			if err != nil {
				return -1
			}
			return v
		}
		By("starting a second replica beside the suite's manager, which leads")
		Eventually(func() float64 { return leads(manager) }).WithContext(ctx).Should(Equal(1.0))
		holder := lease()
		Expect(holder).NotTo(BeEmpty())
		standby, err := stack.StartManagerReplica(ctx, "floodgate-manager-standby", false)
		Expect(err).NotTo(HaveOccurred())
		// Ready on its probe port, it may not serve metrics yet (the
		// metrics server binds its port as it starts): the window starts
		// once it does.
		Eventually(func() float64 { return leads(standby) }).WithContext(ctx).Should(BeNumerically(">=", 0), "the standby serves its metrics")
		Consistently(func() float64 { return leads(standby) }).WithContext(ctx).WithTimeout(3 * time.Second).Should(BeZero())

		ns := newNamespace(ctx, "leader")
		policy := func(requests int) string {
			return fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: leader
  namespace: %s
spec:
  podSelector:
    matchLabels: {app: leader}
  storeRef: {name: %s}
  rules:
  - name: per-tenant
    key:
    - header: X-Tenant
    limit: {requests: %d, per: 1s}
`, ns, storeName, requests)
		}
		apply(ctx, "leader-policy.yaml", policy(10))
		Eventually(func() string { return condition(ctx, ns, "leader", "Accepted") }).WithContext(ctx).Should(Equal("True/Accepted"))

		By("killing the leader with SIGKILL: it cannot release its lease")
		Expect(syscall.Kill(manager.Proc.Pid(), syscall.SIGKILL)).To(Succeed())
		killed := time.Now()
		<-manager.Proc.Done()
		Eventually(func(g Gomega) {
			g.Expect(leads(standby)).To(Equal(1.0))
			g.Expect(lease()).NotTo(Equal(holder))
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		took := time.Since(killed)
		AddReportEntry("leader SIGKILLed -> the standby leads (bound 15s; lease 8s, retry 1s)", took.Round(time.Millisecond).String())
		Expect(took).To(BeNumerically("<=", 15*time.Second))

		By("bringing a replica back on the registered webhook port, as the Deployment would: the webhooks' Service reaches every replica, leader or not, and the standby here serves them on a port of its own")
		m, err := stack.StartManagerReplica(ctx, "floodgate-manager-2", true)
		Expect(err).NotTo(HaveOccurred())
		manager = m
		Eventually(func() float64 { return leads(m) }).WithContext(ctx).Should(BeNumerically(">=", 0), "the new replica serves its metrics")
		Consistently(func() float64 { return leads(m) }).WithContext(ctx).WithTimeout(2*time.Second).Should(BeZero(), "the standby keeps the lead")

		By("reconciling under the new leader, observedGeneration included")
		apply(ctx, "leader-policy.yaml", policy(20))
		changed := time.Now()
		Eventually(func(g Gomega) {
			gen := jsonpath(ctx, "{.metadata.generation}", "-n", ns, "get", "ratelimitpolicy", "leader")
			g.Expect(gen).To(Equal("2"))
			g.Expect(jsonpath(ctx, "{.status.observedGeneration}", "-n", ns, "get", "ratelimitpolicy", "leader")).To(Equal(gen))
			g.Expect(jsonpath(ctx, `{.status.conditions[?(@.type=="Accepted")].observedGeneration}`, "-n", ns, "get", "ratelimitpolicy", "leader")).To(Equal(gen))
			c := compiled(ctx, ns)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Policies).NotTo(BeEmpty())
			g.Expect(c.Policies[0].Rules[0].Limit.Requests).To(BeEquivalentTo(20))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		AddReportEntry("policy change under the new leader -> status and ConfigMap", time.Since(changed).Round(time.Millisecond).String())

		By("stopping the standby, which releases its lease: the suite's manager leads again")
		standby.Proc.Stop(10 * time.Second)
		Eventually(func() float64 { return leads(m) }).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal(1.0))
	})
})
