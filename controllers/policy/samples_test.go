package policy_test

import (
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

var _ = Describe("config/samples", func() {
	It("apply cleanly with kubectl, compile, and show the printer columns", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		samples := filepath.Join("..", "..", "config", "samples")
		DeferCleanup(func(ctx SpecContext) {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx,
				&v1alpha1.CounterStore{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.DefaultCounterStoreName}}))).To(Succeed())
		})

		// The objects the samples reference (refs/) go first, as the
		// samples' comments say.
		out, err := kubectl.Run(ctx, "apply", "-n", ns, "-f", filepath.Join(samples, "refs"))
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("configmap/auth-jwks created"))
		out, err = kubectl.Run(ctx, "apply", "-n", ns, "-f", samples)
		Expect(err).NotTo(HaveOccurred(), out)
		AddReportEntry("kubectl apply -f config/samples", out)
		Expect(out).To(ContainSubstring("counterstore.ratelimit.floodgate.dev/default created"))

		var policies v1alpha1.RateLimitPolicyList
		Expect(k8sClient.List(ctx, &policies, client.InNamespace(ns))).To(Succeed())
		Expect(policies.Items).To(HaveLen(5))

		By("compiling them once the store is Ready, as the store controller will mark it")
		setStoreReady(ctx, v1alpha1.DefaultCounterStoreName, true)
		createPod(ctx, ns, "api-0", map[string]string{"app": "api"})
		setPodReady(ctx, ns, "api-0", true)
		for _, p := range policies.Items {
			// The status read by kubectl get below: settled once it counts
			// api-0 for the policies that select it.
			targeted := int32(0)
			if sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector); err == nil && sel.Matches(labels.Set{"app": "api"}) {
				targeted = 1
			}
			Eventually(policyStatus(ctx, ns, p.Name), timeout, poll).Should(And(
				haveCondition(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted),
				haveCondition(v1alpha1.ConditionResolvedRefs, metav1.ConditionTrue, v1alpha1.ReasonResolvedRefs),
				haveCondition(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonWaitingForSidecars),
				HaveField("Status.TargetedPods", targeted),
			), p.Name)
		}
		Eventually(func(g Gomega) {
			c, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.Policies).To(HaveLen(5))
		}, timeout, poll).Should(Succeed())

		out, err = kubectl.Run(ctx, "get", "rlp", "-n", ns)
		Expect(err).NotTo(HaveOccurred(), out)
		AddReportEntry("kubectl get rlp", out)
		GinkgoWriter.Println(out)
		lines := strings.Split(out, "\n")
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "ACCEPTED", "PROGRAMMED", "ENFORCING", "STORE", "TARGET", "AGE"}))
		Expect(lines).To(HaveLen(6))
		// The pod has no sidecar: targeted, not enforcing.
		Expect(out).To(MatchRegexp(`(?m)^login\s+True\s+False\s+0/1\s+default\s+\S+$`))
		Expect(out).To(MatchRegexp(`(?m)^layered\s+True\s+False\s+0/0\s+default\s+\S+$`), "the layered sample selects app=reports")

		out, err = kubectl.Run(ctx, "get", "cstore")
		Expect(err).NotTo(HaveOccurred(), out)
		AddReportEntry("kubectl get cstore", out)
		Expect(strings.Fields(strings.Split(out, "\n")[0])).To(Equal([]string{"NAME", "READY", "DEGRADED", "SHARDS", "SLOTS", "AGE"}))
		Expect(out).To(MatchRegexp(`(?m)^default\s+True\s+3\s+16384\s+\S+$`))
	})
})
