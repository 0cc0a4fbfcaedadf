package k8sloop

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/programmed"
	"github.com/floodgate-dev/floodgate/controllers/sidecaraccess"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

var _ = Describe("the policy loop", func() {
	It("runs a sidecar with an injected pod's identity: loads, reports, follows changes within 2 s, survives an API server restart and bad revisions", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, "s3cret")
		p := validPolicy(ns, "api", store)
		p.Spec.Rules[0].Limit.Requests = 1000
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		pod := injectedPod(ctx, ns, "api-0")

		By("granting the sidecars access and mirroring the store password")
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.SecretName}, &s)).To(Succeed())
			g.Expect(string(s.Data["password"])).To(Equal("s3cret"))
			var b rbacv1.RoleBinding
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.RoleName}, &b)).To(Succeed())
			g.Expect(b.Subjects).To(ContainElement(HaveField("Name", "default")), "the pod's service account is bound")
		}).Should(Succeed())
		// api-0 is targeted but never Ready: the document has the policy
		// on one replica and names no pod.
		rev := settled(ctx, ns, "api", 1)

		sc := startSidecar(ctx, pod, newUpstream().URL, 2*time.Second)

		By("reporting the loaded revision on its pod")
		Eventually(func(g Gomega) {
			c := loadedCondition(ctx, ns, "api-0")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(config.ReasonLoaded))
			g.Expect(c.Message).To(Equal(rev))
		}).Should(Succeed())
		Expect(sc.Status().Revision).To(Equal(rev))

		By("turning the condition into Programmed and enforcingPods")
		Eventually(func(g Gomega) {
			got := getPolicy(ctx, ns, "api")
			g.Expect(got.Status.EnforcingPods).To(Equal(int32(1)))
			g.Expect(got.Status.TargetedPods).To(Equal(int32(1)))
			c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgrammed)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(programmed.ReasonProgrammed))
			g.Expect(c.Message).To(ContainSubstring("enforced by all 1 targeted pods"))
		}).Should(Succeed())

		By("applying policy changes within 2 s")
		var latencies, fromSent []time.Duration
		limit := int64(0)
		for i, requests := range []int64{5, 7, 3, 6, 4} {
			before := sc.Status().Revision
			// Timed from the watch event of the stored change, the event
			// the policy controller reacts to: neither the retries of a
			// write that met the controller's status update nor the
			// write's own round trip (the validating webhook, etcd) are
			// the loop's latency.
			gen := getPolicy(ctx, ns, "api").Generation + 1
			stored := watchGeneration(ctx, ns, "api", gen)
			sent := updatePolicy(ctx, ns, "api", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Limit.Requests = requests })
			Eventually(func() string { return sc.Status().Revision }).WithTimeout(10 * time.Second).WithPolling(2 * time.Millisecond).
				ShouldNot(Equal(before))
			applied := time.Now()
			var seen time.Time
			Eventually(stored).Should(Receive(&seen), "the watch sees generation %d of the policy", gen)
			latency := applied.Sub(seen)
			latencies = append(latencies, latency)
			fromSent = append(fromSent, applied.Sub(sent))
			Expect(latency).To(BeNumerically("<", 2*time.Second), "change %d took %v from the watch event (%v from sending the write)", i, latency, applied.Sub(sent))
			Expect(sc.Status().Revision).To(Equal(settled(ctx, ns, "api", 1)))
			limit = requests
		}
		slices.Sort(latencies)
		slices.Sort(fromSent)
		AddReportEntry("policy change to sidecar applied (watch event of the stored RateLimitPolicy change -> controller -> ConfigMap -> watch -> runner)",
			fmt.Sprintf("min %v, median %v, max %v over %d changes (from sending the write: min %v, median %v, max %v)",
				latencies[0], latencies[len(latencies)/2], latencies[len(latencies)-1], len(latencies),
				fromSent[0], fromSent[len(fromSent)/2], fromSent[len(fromSent)-1]))
		Expect(sc.codes("client-a", int(limit)+1)).To(Equal(limited(int(limit))), "the sidecar enforces the last limit")
		Eventually(func() string { c := loadedCondition(ctx, ns, "api-0"); return c.Message }).Should(Equal(sc.Status().Revision))

		By("keeping its config while the API server is down (killed, then restarted)")
		inForce := sc.Status().Revision
		killAPIServer()
		stopped := time.Now()
		Expect(sc.codes("client-b", int(limit)+1)).To(Equal(limited(int(limit))), "the limit holds during the outage")
		Consistently(func() string { return sc.Status().Revision }, 3*time.Second).Should(Equal(inForce))
		Expect(sc.Ready()).To(BeTrue())
		Expect(testEnv.ControlPlane.APIServer.Start()).To(Succeed())
		AddReportEntry("API server outage", fmt.Sprintf("%v, the sidecar kept revision %s and kept limiting", time.Since(stopped).Round(time.Millisecond), inForce))
		managerFollows(ctx)

		By("following a change made after the restart")
		// The sidecar's own watch may still be backing off: it follows
		// within recovery.
		start := updatePolicy(ctx, ns, "api", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Limit.Requests = 2 })
		Eventually(func() string { return sc.Status().Revision }).WithTimeout(recovery).ShouldNot(Equal(inForce))
		AddReportEntry("first policy change after the API server restart", time.Since(start).Round(time.Millisecond).String())
		Expect(sc.Status().Revision).To(Equal(settled(ctx, ns, "api", 1)))
		Expect(sc.codes("client-c", 3)).To(Equal(limited(2)))
		Eventually(func(g Gomega) {
			c := loadedCondition(ctx, ns, "api-0")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(config.ReasonLoaded))
			g.Expect(c.Message).To(Equal(revision(ctx, ns)))
		}).WithTimeout(recovery).Should(Succeed())

		By("enforcing the other policies when one cannot be loaded")
		// A policy whose HMAC key Secret exists (so the manager resolves
		// it and compiles it) but is not mounted into the sidecar (it was
		// created after the pod): the sidecar loads the revision without
		// that policy, and the others stay in force.
		errorsBefore := sc.counter("config_errors_total")
		Expect(k8sClient.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "not-mounted"},
			Data:       map[string][]byte{"hmac": []byte("a-key-the-sidecar-never-sees-000")},
		})).To(Succeed())
		jwtPolicy := validPolicy(ns, "jwt", store)
		jwtPolicy.Spec.JWT = &v1alpha1.JWT{HMACSecretRef: &v1alpha1.KeyReference{Name: "not-mounted", Key: "hmac"}}
		jwtPolicy.Spec.Rules[0].Key = []v1alpha1.KeyPart{{JWTClaim: "sub"}}
		Expect(k8sClient.Create(ctx, jwtPolicy)).To(Succeed())
		Eventually(func(g Gomega) {
			c := loadedCondition(ctx, ns, "api-0")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionTrue), "the pod keeps serving")
			g.Expect(c.Reason).To(Equal(config.ReasonPartiallyLoaded))
			rev, failed, complete := config.ParsePartialMessage(c.Message)
			g.Expect(rev).To(Equal(revision(ctx, ns)))
			g.Expect(failed).To(ConsistOf("jwt"))
			g.Expect(complete).To(BeTrue())
		}).Should(Succeed())
		AddReportEntry("a policy the sidecar cannot load, pod condition", loadedCondition(ctx, ns, "api-0").Message)
		Expect(sc.Status().Revision).To(Equal(revision(ctx, ns)))
		Expect(sc.counter("config_errors_total")).To(Equal(errorsBefore), "the revision itself was not rejected")
		Expect(sc.codes("client-d", 3)).To(Equal(limited(2)), "the other policy still limits")
		Eventually(func(g Gomega) {
			got := getPolicy(ctx, ns, "jwt")
			c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgrammed)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWaitingForSidecars))
			g.Expect(c.Message).To(ContainSubstring("api-0 (its sidecar could not load this policy"))
			g.Expect(got.Status.EnforcingPods).To(BeZero())
		}).Should(Succeed())
		AddReportEntry("Programmed of a policy the sidecars cannot load", meta.FindStatusCondition(getPolicy(ctx, ns, "jwt").Status.Conditions, v1alpha1.ConditionProgrammed).Message)
		Eventually(func(g Gomega) {
			c := meta.FindStatusCondition(getPolicy(ctx, ns, "api").Status.Conditions, v1alpha1.ConditionProgrammed)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "the other policy is still enforced: %s", c.Message)
		}).Should(Succeed())
		Expect(k8sClient.Delete(ctx, jwtPolicy)).To(Succeed())
		Eventually(func(g Gomega) {
			c := loadedCondition(ctx, ns, "api-0")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(config.ReasonLoaded))
			g.Expect(c.Message).To(Equal(revision(ctx, ns)))
		}).Should(Succeed())

		By("stopping the limits once the namespace's last policy is gone and the grace period has passed")
		Expect(k8sClient.Delete(ctx, getPolicy(ctx, ns, "api"))).To(Succeed())
		Eventually(func(g Gomega) {
			c := loadedCondition(ctx, ns, "api-0")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionTrue), "the pod stays ready")
			g.Expect(c.Reason).To(Equal(config.ReasonNoPolicies))
		}).Should(Succeed())
		Expect(sc.codes("client-a", 10)).To(HaveEach(http.StatusOK), "no policy is enforced any more")
	})

	It("does not load a document before its sidecar has access, and reports why", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		pod := injectedPod(ctx, ns, "api-0")
		Eventually(func(g Gomega) {
			var b rbacv1.RoleBinding
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.RoleName}, &b)).To(Succeed())
			g.Expect(b.Subjects).To(ContainElement(HaveField("Name", "default")))
		}).Should(Succeed(), "an opted-in pod alone gets its namespace sidecar access")
		// The namespace has no policy, so no store and no password
		// mirror: start the sidecar with an empty one.
		Expect(k8sClient.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sidecaraccess.SecretName},
			Data:       map[string][]byte{"password": nil},
		})).To(Succeed())
		sc := startSidecar(ctx, pod, newUpstream().URL, time.Second)
		Eventually(func(g Gomega) {
			c := loadedCondition(ctx, ns, "api-0")
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(corev1.ConditionFalse), "the readiness gate keeps the pod out of its Services")
			g.Expect(c.Reason).To(Equal(config.ReasonWaitingForConfigMap))
		}).Should(Succeed())
		Expect(sc.Ready()).To(BeFalse())
		Expect(sc.get("x")).To(Equal(http.StatusServiceUnavailable))
	})
})
