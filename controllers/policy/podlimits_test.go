package policy_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/podlimits"
)

var _ = Describe("the limit-rps pod annotation", func() {
	It("creates an implicit per-client-IP policy that shows in status like any other, and removes it with the annotation", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		newStoreNamed(ctx, v1alpha1.DefaultCounterStoreName)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "api-5d8f9-x", Namespace: ns,
				Labels: map[string]string{"app": "api", "pod-template-hash": "5d8f9"},
				Annotations: map[string]string{
					podlimits.AnnotationRPS:       "20",
					podlimits.AnnotationWhitelist: "10.0.0.0/8,192.0.2.7",
				},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "api-5d8f9",
					UID: "00000000-0000-4000-8000-0000000000aa", Controller: ptr.To(true)}},
			},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
		}
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())
		setPodReady(ctx, ns, pod.Name, true)

		By("creating limit-api, compiled and reported like any other policy")
		Eventually(func(g Gomega) {
			p := policyStatus(ctx, ns, "limit-api")(g)
			g.Expect(p.Labels).To(HaveKeyWithValue(podlimits.ImplicitLabel, podlimits.ImplicitValue))
			g.Expect(p.Spec.PodSelector.MatchLabels).To(Equal(map[string]string{"app": "api"}))
			g.Expect(p.Spec.Rules).To(HaveLen(1))
			g.Expect(p.Spec.Rules[0].Limit).To(Equal(v1alpha1.Limit{Requests: 20, Per: metav1.Duration{Duration: time.Second},
				Burst: 100, Algorithm: v1alpha1.AlgorithmTokenBucket}))
			g.Expect(p.Spec.Exempt.SourceCIDRs).To(Equal([]v1alpha1.CIDR{"10.0.0.0/8", "192.0.2.7/32"}))
			g.Expect(p).To(haveCondition(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted))
			g.Expect(p.Status.Rules).To(ConsistOf(HaveField("Name", "limit-rps")))
			g.Expect(p.Status.Enforcing).To(Equal("0/1"))
			g.Expect(p.Status.Store).To(Equal(v1alpha1.DefaultCounterStoreName))
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			doc, _, err := compiled(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(doc.Policies).To(ContainElement(HaveField("Name", "limit-api")))
		}).Should(Succeed())

		By("rewriting a hand edit from the annotations")
		updatePolicy(ctx, ns, "limit-api", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Limit.Requests = 999 })
		Eventually(func(g Gomega) int64 {
			return policyStatus(ctx, ns, "limit-api")(g).Spec.Rules[0].Limit.Requests
		}).Should(Equal(int64(20)))

		By("warning on the pod about an annotation that does not parse")
		var cur corev1.Pod
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), &cur)).To(Succeed())
		cur.Annotations[podlimits.AnnotationRPS] = "lots"
		Expect(k8sClient.Update(ctx, &cur)).To(Succeed())
		Eventually(func(g Gomega) []string {
			var list eventsv1.EventList
			g.Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			var notes []string
			for _, e := range list.Items {
				if e.Regarding.Kind == "Pod" && e.Reason == podlimits.ReasonInvalidAnnotation {
					notes = append(notes, e.Note)
				}
			}
			return notes
		}).Should(ContainElement(ContainSubstring(`annotation floodgate.dev/limit-rps: "lots": must be an integer`)))

		By("deleting the policy once no pod asks for it")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), &cur)).To(Succeed())
		delete(cur.Annotations, podlimits.AnnotationRPS)
		Expect(k8sClient.Update(ctx, &cur)).To(Succeed())
		Eventually(func() bool {
			var p v1alpha1.RateLimitPolicy
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "limit-api"}, &p))
		}).Should(BeTrue())
	})
})
