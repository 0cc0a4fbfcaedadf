package counterstore_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/counterstore/formation"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

var _ = Describe("An external CounterStore", func() {
	It("is observed, never changed, and reports lost slots", func(ctx SpecContext) {
		// An existing 3-master cluster, formed here by the formation
		// package (tested on its own); the controller must only observe it.
		const password = "external-secret-123"
		rc := redistest.StartCluster(GinkgoT(), redistest.Options{
			Masters: 3, Unformed: true, Password: password, NodeTimeout: time.Second, PartialCoverage: true,
		})
		nodes := rc.Nodes()
		spec := formation.Spec{Shards: 3}
		for i, n := range nodes {
			spec.Members = append(spec.Members, formation.Member{Name: "ext-" + string(rune('a'+i)), Addr: n.Addr()})
		}
		sess := formation.NewSession(formation.Dialer{Password: password})
		DeferCleanup(sess.Close)
		Eventually(func(g Gomega) {
			res, err := sess.Reconcile(ctx, spec, 10*time.Second)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(res.Pass.Converged()).To(BeTrue())
			g.Expect(formation.Assess(res.Snapshot, 0).Ready()).To(BeTrue())
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		topology := func() []string {
			GinkgoHelper()
			snap, err := sess.Observe(ctx, spec.Members)
			Expect(err).NotTo(HaveOccurred())
			var lines []string
			for _, n := range snap.Nodes {
				if n.Reachable {
					lines = append(lines, n.ID+" "+formation.FormatRanges(n.Self.Slots)+" "+n.Self.Flags.String())
				}
			}
			return lines
		}

		ns := "fg-" + rand.String(8)
		Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		Expect(k8sClient.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "redis-auth"},
			Data:       map[string][]byte{"pw": []byte(password)},
		})).To(Succeed())
		seed := nodes[0].Addr()
		name := "external-" + rand.String(6)
		cs := &v1alpha1.CounterStore{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.CounterStoreSpec{External: &v1alpha1.ExternalStore{
				Addresses:         []v1alpha1.HostPort{v1alpha1.HostPort(seed)},
				PasswordSecretRef: &v1alpha1.SecretKeySelector{Namespace: ns, Name: "redis-auth", Key: "pw"},
			}},
		}
		Expect(k8sClient.Create(ctx, cs)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cs))).To(Succeed()) })

		before := topology()
		Eventually(func(g Gomega) {
			cs := getStore(ctx, name)
			g.Expect(condStatus(cs, v1alpha1.ConditionReady)).To(Equal(metav1.ConditionTrue), describe(cs))
			g.Expect(condStatus(cs, v1alpha1.ConditionDegraded)).To(Equal(metav1.ConditionFalse), describe(cs))
			g.Expect(cs.Status.SlotsCovered).To(BeEquivalentTo(16384))
			g.Expect(cs.Status.Nodes.Primaries).To(BeEquivalentTo(3), "every master is found from one seed")
			g.Expect(cs.Status.Endpoints).To(Equal([]string{seed}), "an external store publishes its seeds")
			g.Expect(cs.Status.AuthSecretName).To(Equal(config.StoreAuthSecret), "the sidecars read the password from their own namespace's copy")
			g.Expect(storeMetric("floodgate_counterstore_ready", name, "")).To(Equal(1.0))
			g.Expect(storeMetric("floodgate_counterstore_slots_covered", name, "")).To(Equal(16384.0))
			g.Expect(storeMetric("floodgate_counterstore_nodes", name, "primary")).To(Equal(3.0))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Consistently(topology, 2*time.Second, 200*time.Millisecond).Should(Equal(before),
			"the controller changed an external cluster")

		// A master dies: with no replica its slots are lost, and Ready
		// says so.
		Expect(rc.Kill(nodes[2])).To(Succeed())
		Eventually(func(g Gomega) {
			cs := getStore(ctx, name)
			c := meta.FindStatusCondition(cs.Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse), describe(cs))
			g.Expect(c.Reason).To(Or(Equal(counterstore.ReasonSlotsUncovered), Equal(counterstore.ReasonClusterDown)))
			g.Expect(cs.Status.SlotsCovered).To(BeNumerically("<", 16384))
			g.Expect(storeMetric("floodgate_counterstore_ready", name, "")).To(Equal(0.0), "the not-Ready store must show in the metric alerts use")
			g.Expect(storeMetric("floodgate_counterstore_slots_covered", name, "")).To(BeNumerically("<", 16384))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		// Deleting the store removes its series.
		Expect(k8sClient.Delete(ctx, cs)).To(Succeed())
		Eventually(func() float64 { return storeMetric("floodgate_counterstore_ready", name, "") }).
			WithTimeout(30*time.Second).Should(Equal(-1.0), "a deleted store's series must go")
	})

	It("says why when its password Secret is missing", func(ctx SpecContext) {
		name := "external-" + rand.String(6)
		cs := &v1alpha1.CounterStore{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.CounterStoreSpec{External: &v1alpha1.ExternalStore{
				Addresses:         []v1alpha1.HostPort{"127.0.0.1:1"},
				PasswordSecretRef: &v1alpha1.SecretKeySelector{Namespace: "default", Name: "nope", Key: "pw"},
			}},
		}
		Expect(k8sClient.Create(ctx, cs)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(k8sClient.Delete(ctx, cs)).To(Succeed()) })
		Eventually(func(g Gomega) {
			c := meta.FindStatusCondition(getStore(ctx, name).Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(counterstore.ReasonSecretError))
			g.Expect(c.Message).To(ContainSubstring("default/nope"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
	})
})

var _ = Describe("CounterStore validation", func() {
	DescribeTable("rejects at admission",
		func(ctx SpecContext, name string, spec v1alpha1.CounterStoreSpec, want string) {
			err := k8sClient.Create(ctx, &v1alpha1.CounterStore{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec})
			Expect(err).To(HaveOccurred())
			Expect(strings.ToLower(err.Error())).To(ContainSubstring(strings.ToLower(want)))
		},
		Entry("both variants", "both",
			v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{Shards: 1}, External: &v1alpha1.ExternalStore{Addresses: []v1alpha1.HostPort{"a:1"}}},
			"set exactly one of managed or external"),
		Entry("neither variant", "neither", v1alpha1.CounterStoreSpec{}, "set exactly one of managed or external"),
		Entry("a managed name too long for its StatefulSet", strings.Repeat("a", 40),
			v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{Shards: 1}}, "at most 39 characters"),
		Entry("a managed name with a dot", "a.b",
			v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{Shards: 1}}, "DNS label"),
		Entry("a node timeout below 1s", "fast",
			v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{Shards: 1, NodeTimeout: &metav1.Duration{Duration: 500 * time.Millisecond}}},
			"between 1s and 60s"),
		Entry("too many shards", "huge",
			v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{Shards: 129}}, "spec.managed.shards"),
		Entry("an external address without a port", "noport",
			v1alpha1.CounterStoreSpec{External: &v1alpha1.ExternalStore{Addresses: []v1alpha1.HostPort{"redis"}}}, "spec.external.addresses"),
	)

	It("accepts a long name for an external store", func(ctx SpecContext) {
		name := strings.Repeat("e", 50)
		cs := &v1alpha1.CounterStore{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.CounterStoreSpec{External: &v1alpha1.ExternalStore{Addresses: []v1alpha1.HostPort{"127.0.0.1:1"}}}}
		Expect(k8sClient.Create(ctx, cs)).To(Succeed())
		Expect(k8sClient.Delete(ctx, cs)).To(Succeed())
	})
})

// storeMetric reads a CounterStore gauge from the registry the controller
// exports to, as a scrape of /metrics would; role selects a
// floodgate_counterstore_nodes series. It returns -1 when the series is
// absent.
func storeMetric(family, store, role string) float64 {
	GinkgoHelper()
	mfs, err := storeMetrics.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["store"] == store && labels["role"] == role {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}
