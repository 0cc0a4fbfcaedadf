package k8sloop

import (
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// forged is appPod(ns, name, annotated) carrying labels it gave itself.
func forged(ns, name string, annotated bool, labels map[string]string) *corev1.Pod {
	pod := appPod(ns, name, annotated)
	for k, v := range labels {
		pod.Labels[k] = v
	}
	return pod
}

// waitLabelPolicy waits until the API server enforces the pod labels
// policy (config/webhook/pod_labels_policy.yaml) in ns: it takes effect
// once the API server's policy source has loaded the policy, its bindings
// and their param, some time after they were written. The probe is a dry
// run of a pod that labels itself.
func waitLabelPolicy(ctx context.Context, ns string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		err := k8sClient.Create(ctx, forged(ns, "probe", false, map[string]string{injection.LabelInjected: "true"}), client.DryRunAll)
		g.Expect(isForbidden(err)).To(BeTrue(), "a dry run of a self-labelled pod: %v", err)
		g.Expect(err.Error()).To(ContainSubstring("label floodgate.dev/injected is set only by floodgate's sidecar injector"))
	}).Should(Succeed(), "the API server enforces the pod labels policy in %s", ns)
}

var _ = Describe("the labels a store's NetworkPolicy trusts", func() {
	It("are refused on a pod that floodgate did not label, at creation and by kubectl label, and kept on the pods the injector injects", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		waitLabelPolicy(ctx, ns)
		injected := map[string]string{injection.LabelInjected: "true"}

		By("admitting a pod the injector really injected, with its label")
		api := injectedPod(ctx, ns, "api-0")
		Expect(api.Labels).To(HaveKeyWithValue(injection.LabelInjected, "true"))
		var stored corev1.Pod
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(api), &stored)).To(Succeed())
		Expect(stored.Labels).To(HaveKeyWithValue(injection.LabelInjected, "true"))

		By("refusing the label on pods the injector did not inject")
		sidecar := func(pod *corev1.Pod) *corev1.Pod {
			// A hand-written container posing as the sidecar.
			pod.Spec.InitContainers = []corev1.Container{{
				Name: config.ContainerName, Image: "registry.example/anything:1", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				SecurityContext: pod.Spec.Containers[0].SecurityContext,
			}}
			return pod
		}
		for _, tc := range []struct {
			what string
			pod  *corev1.Pod
			why  string
		}{
			{"a pod that does not ask for injection", forged(ns, "plain-forged", false, injected),
				`the pod does not ask for injection (annotation floodgate.dev/inject: "true")`},
			{"a pod with a container of its own named floodgate-sidecar", sidecar(forged(ns, "lookalike", false, injected)),
				"the pod does not ask for injection"},
			// The webhook's namespaceSelector leaves these out: it never runs.
			{"an opted-in pod in the manager's namespace", sidecar(forged(managerNamespace, "manager-ns", true, injected)),
				"the injector does not serve namespace " + managerNamespace},
			{"an opted-in pod in kube-system", sidecar(forged("kube-system", "system", true, injected)),
				"the injector does not serve namespace kube-system"},
		} {
			err := k8sClient.Create(ctx, tc.pod)
			Expect(isForbidden(err)).To(BeTrue(), "%s: %v", tc.what, err)
			Expect(err.Error()).To(ContainSubstring("label floodgate.dev/injected is set only by floodgate's sidecar injector"), tc.what)
			Expect(err.Error()).To(ContainSubstring(tc.why), tc.what)
		}
		err := k8sClient.Create(ctx, forged(ns, "client", false, map[string]string{counterstore.StoreClientLabel: "true"}))
		Expect(isForbidden(err)).To(BeTrue(), "a pod labelled store-client outside the manager's namespace: %v", err)
		Expect(err.Error()).To(ContainSubstring("label ratelimit.floodgate.dev/store-client is set only on floodgate's own pods"))
		Expect(err.Error()).To(ContainSubstring("this pod is in namespace " + ns))
		AddReportEntry("a self-labelled pod, at creation", err.Error())

		By("leaving every other pod alone")
		plain := appPod(ns, "plain", false)
		Expect(k8sClient.Create(ctx, plain)).To(Succeed())
		_, err = kubectl.Run(ctx, "-n", ns, "label", "pod", "plain", "tier=web")
		Expect(err).NotTo(HaveOccurred())
		_, err = kubectl.Run(ctx, "-n", ns, "annotate", "pod", "api-0", "example.com/note=kept")
		Expect(err).NotTo(HaveOccurred(), "an injected pod keeps its label through other changes")

		By("refusing the labels added to a running pod with kubectl label")
		for _, label := range []string{injection.LabelInjected + "=true", counterstore.StoreClientLabel + "=true"} {
			out, err := kubectl.Run(ctx, "-n", ns, "label", "pod", "plain", label)
			Expect(err).To(HaveOccurred(), "kubectl label pod plain %s: %s", label, out)
			Expect(out).To(ContainSubstring("label " + label[:len(label)-len("=true")] + " cannot be added to or changed on an existing pod"))
		}
		out, err := kubectl.Run(ctx, "-n", ns, "label", "--overwrite", "pod", "api-0", injection.LabelInjected+"=false")
		Expect(err).To(HaveOccurred(), "changing the injected label: %s", out)
		Expect(out).To(ContainSubstring("label floodgate.dev/injected cannot be added to or changed on an existing pod"))
		AddReportEntry("kubectl label pod api-0 floodgate.dev/injected=false --overwrite", out)

		By("letting the label go, and not come back")
		_, err = kubectl.Run(ctx, "-n", ns, "label", "pod", "api-0", injection.LabelInjected+"-")
		Expect(err).NotTo(HaveOccurred())
		out, err = kubectl.Run(ctx, "-n", ns, "label", "pod", "api-0", injection.LabelInjected+"=true")
		Expect(err).To(HaveOccurred(), "adding the label back: %s", out)
		Expect(out).To(ContainSubstring("label floodgate.dev/injected cannot be added"))
	})
})

// variantInjector is an injector configuration for the pod labels
// policy to read, as a hand-edited one would be, that the API server
// never calls (its only match condition is false): the policy is bound to
// it, for the pods labelled variantLabel=name only, beside its binding
// to the real injector.
func variantInjector(ctx context.Context, name string, edit func(*admissionregistrationv1.MutatingWebhook)) {
	GinkgoHelper()
	cfgName := "floodgate-test-injector-" + name
	wh := admissionregistrationv1.MutatingWebhook{
		Name:                    "inject.floodgate.dev",
		ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/never")},
		Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
		MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: "never", Expression: "false"}},
	}
	edit(&wh)
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: cfgName}, Webhooks: []admissionregistrationv1.MutatingWebhook{wh}}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: cfgName},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        "floodgate-pod-labels",
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			ParamRef:          &admissionregistrationv1.ParamRef{Name: cfgName, ParameterNotFoundAction: ptr.To(admissionregistrationv1.DenyAction)},
			MatchResources: &admissionregistrationv1.MatchResources{ObjectSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{variantLabel: name},
			}},
		},
	}
	for _, o := range []client.Object{mwc, binding} {
		Expect(k8sClient.Create(ctx, o)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, o))).To(Succeed()) })
	}
}

// variantLabel selects the pods that a variant injector's binding checks.
const variantLabel = "test.floodgate.dev/injector-variant"

var _ = Describe("the pod labels policy", func() {
	It("reads which pods the injector labels from its configuration: namespaces, objects, failure policy", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		waitLabelPolicy(ctx, ns)
		variantInjector(ctx, "ignore", func(w *admissionregistrationv1.MutatingWebhook) {
			w.FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
		})
		variantInjector(ctx, "namespaces", func(w *admissionregistrationv1.MutatingWebhook) {
			w.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"test.floodgate.dev/injected-here": "yes"}}
		})
		variantInjector(ctx, "objects", func(w *admissionregistrationv1.MutatingWebhook) {
			w.ObjectSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web"},
			}}}
		})
		variantInjector(ctx, "renamed", func(w *admissionregistrationv1.MutatingWebhook) { w.Name = "other.example.com" })

		// Each pod asks for injection and is injected by the real
		// injector: only the variant configuration can refuse its label.
		n := 0
		create := func(variant string, labels map[string]string) error {
			n++
			pod := appPod(ns, fmt.Sprintf("%s-%d", variant, n), true)
			pod.Labels[variantLabel] = variant
			for k, v := range labels {
				pod.Labels[k] = v
			}
			return k8sClient.Create(ctx, pod)
		}
		for variant, why := range map[string]string{
			"ignore":     "the injector's failurePolicy is Ignore, not Fail, so the label does not show that it ran",
			"namespaces": "the injector does not serve namespace " + ns,
			"objects":    "the injector's objectSelector does not select the pod",
			"renamed":    "MutatingWebhookConfiguration floodgate-test-injector-renamed has no webhook inject.floodgate.dev",
		} {
			Eventually(func(g Gomega) {
				err := create(variant, nil)
				g.Expect(isForbidden(err)).To(BeTrue(), "%s: %v", variant, err)
				g.Expect(err.Error()).To(ContainSubstring("label floodgate.dev/injected is set only by floodgate's sidecar injector"))
				g.Expect(err.Error()).To(ContainSubstring(why))
			}).Should(Succeed(), variant)
		}

		By("admitting the label once the configuration selects the pod and its namespace")
		Expect(create("objects", map[string]string{"tier": "web"})).To(Succeed())
		_, err := kubectl.Run(ctx, "label", "namespace", ns, "test.floodgate.dev/injected-here=yes")
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() error { return create("namespaces", nil) }).Should(Succeed())
	})
})
