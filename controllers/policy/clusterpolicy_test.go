package policy_test

import (
	"context"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/policy/compiler"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// labeledNamespace creates a namespace with labels for one spec.
func labeledNamespace(ctx context.Context, lbls map[string]string) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "crlp-" + rand.String(8), Labels: lbls}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, ns))).To(Succeed())
	})
	return ns.Name
}

// createSidecarPod creates a pod that runs floodgate's sidecar, Running
// and Ready.
func createSidecarPod(ctx context.Context, ns, name string, lbls map[string]string) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbls},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "app", Image: "registry.invalid/app:1"},
			{Name: config.ContainerName, Image: "registry.invalid/floodgate-sidecar:1"},
		}},
	}
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	setPodReady(ctx, ns, name, true)
}

// perIP is a rule keyed on the client IP.
func perIP(requests int64) v1alpha1.Rule {
	return v1alpha1.Rule{
		Name:  "per-ip",
		Key:   []v1alpha1.KeyPart{{ClientIP: &v1alpha1.ClientIPKey{}}},
		Limit: v1alpha1.Limit{Requests: requests, Per: metav1.Duration{Duration: time.Second}},
	}
}

// enforcedOn compiles the namespace's document for a pod with the labels,
// as its sidecar does, and returns the "<policy>.<rule>" names it
// enforces.
func enforcedOn(g Gomega, doc *config.Config, lbls map[string]string) []string {
	set, err := ruleset.Compile(doc, labels.Set(lbls), metrics.NewMetrics(prometheus.NewRegistry()))
	g.Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, r := range set.Rules {
		out = append(out, r.PolicyName)
	}
	slices.Sort(out)
	return out
}

var _ = Describe("a ClusterRateLimitPolicy", func() {
	It("applies its default to a namespace with no policy; a team policy tightens it; loosening is ignored and the status says so", func(ctx SpecContext) {
		store := newStore(ctx, true)
		floorLabel := "floor-" + rand.String(6)
		ns := labeledNamespace(ctx, map[string]string{"floodgate.dev/floor": floorLabel})
		other := labeledNamespace(ctx, map[string]string{"floodgate.dev/floor": "not-" + floorLabel})
		createSidecarPod(ctx, ns, "api-0", map[string]string{"app": "api"})
		createSidecarPod(ctx, ns, "web-0", map[string]string{"app": "web"})
		createSidecarPod(ctx, other, "api-0", map[string]string{"app": "api"})

		cp := &v1alpha1.ClusterRateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "floor-" + rand.String(6)},
			Spec: v1alpha1.ClusterRateLimitPolicySpec{
				NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"floodgate.dev/floor": floorLabel}},
				StoreRef:          &v1alpha1.StoreReference{Name: store},
				Defaults:          &v1alpha1.ClusterRules{Rules: []v1alpha1.Rule{perIP(1000)}},
			},
		}
		Expect(k8sClient.Create(ctx, cp)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cp))).To(Succeed())
		})
		floor := compiler.ClusterEntryName(cp.Name) + ".per-ip"

		By("applying the default to the selected namespace, which has no policy of its own")
		Eventually(func(g Gomega) {
			doc, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(doc.Store.Name).To(Equal(store))
			g.Expect(enforcedOn(g, doc, map[string]string{"app": "api"})).To(Equal([]string{floor}))
			g.Expect(doc.Policies[0].Rules[0].Limit.Requests).To(Equal(int64(1000)))
		}).Should(Succeed())
		Consistently(configMapGone(ctx, other), time.Second, poll).Should(BeTrue(), "a namespace the selector does not select got a document")
		Eventually(func(g Gomega) {
			var got v1alpha1.ClusterRateLimitPolicy
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cp), &got)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionAccepted)).To(BeTrue())
			g.Expect(got.Status.Namespaces).To(Equal(int32(1)))
		}).Should(Succeed())

		By("letting a team policy tighten the default on its pods")
		team := newPolicy(ns, "team", store)
		team.Spec.Rules = []v1alpha1.Rule{perIP(100)}
		Expect(k8sClient.Create(ctx, team)).To(Succeed())
		Eventually(func(g Gomega) {
			doc, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(enforcedOn(g, doc, map[string]string{"app": "api"})).To(Equal([]string{"team.per-ip"}),
				"the team's pods enforce the team's tighter rule in place of the default")
			g.Expect(enforcedOn(g, doc, map[string]string{"app": "web"})).To(Equal([]string{floor}),
				"the other pods keep the default")
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			st := policyStatus(ctx, ns, "team")(g).Status
			g.Expect(st.Rules).To(HaveLen(1))
			g.Expect(st.Rules[0].ClusterDefault).NotTo(BeNil())
			g.Expect(*st.Rules[0].ClusterDefault).To(And(
				HaveField("Policy", cp.Name), HaveField("Replaced", true), HaveField("Reason", v1alpha1.ReasonTightens)))
			g.Expect(st.ClusterRules).To(ContainElement(v1alpha1.ClusterRuleStatus{
				Policy: cp.Name, Rule: "per-ip", Kind: v1alpha1.ClusterRuleDefault, ReplacedBy: "per-ip"}))
			g.Expect(st.Store).To(Equal(store))
		}).Should(Succeed())

		By("ignoring a change that would loosen the default, and saying so")
		updatePolicy(ctx, ns, "team", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules = []v1alpha1.Rule{perIP(5000)} })
		Eventually(func(g Gomega) {
			doc, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(enforcedOn(g, doc, map[string]string{"app": "api"})).To(Equal([]string{floor, "team.per-ip"}),
				"the default keeps applying beside the looser rule: tightest wins")
		}).Should(Succeed())
		var loosened *v1alpha1.RateLimitPolicy
		Eventually(func(g Gomega) {
			loosened = policyStatus(ctx, ns, "team")(g)
			g.Expect(loosened.Status.ObservedGeneration).To(Equal(loosened.Generation))
			cd := loosened.Status.Rules[0].ClusterDefault
			g.Expect(cd).NotTo(BeNil())
			g.Expect(*cd).To(And(HaveField("Replaced", false), HaveField("Reason", v1alpha1.ReasonLoosens)))
			g.Expect(cd.Message).To(ContainSubstring("5000 per 1s is more than 1000 per 1s"))
			g.Expect(loosened.Status.ClusterRules).To(ContainElement(v1alpha1.ClusterRuleStatus{
				Policy: cp.Name, Rule: "per-ip", Kind: v1alpha1.ClusterRuleDefault}))
		}).Should(Succeed())
		AddReportEntry("a loosening rule, as status.rules reports it", loosened.Status.Rules[0].ClusterDefault.Message)

		By("removing the default's entry when the namespace stops being selected")
		Expect(k8sClient.Delete(ctx, team)).To(Succeed())
		var nsObj corev1.Namespace
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: ns}, &nsObj)).To(Succeed())
		nsObj.Labels["floodgate.dev/floor"] = "off"
		Expect(k8sClient.Update(ctx, &nsObj)).To(Succeed())
		Eventually(configMapGone(ctx, ns)).Should(BeTrue())
	})
})
