package k8sloop

import (
	"context"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/controllers/sidecaraccess"
	"github.com/floodgate-dev/floodgate/test/kubetest"
)

// conditionPatch sets one pod condition with a strategic merge patch of
// pods/status, as the sidecar's reporter does.
func conditionPatch(typ, status string) []byte {
	return fmt.Appendf(nil, `{"status":{"conditions":[{"type":%q,"status":%q,"reason":"Test","message":"pod status test"}]}}`, typ, status)
}

// patchStatus patches pod ns/name's status as cfg.
func patchStatus(ctx context.Context, cfg *rest.Config, ns, name string, patch []byte) error {
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	_, err = cs.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// waitStatusPolicy waits until the API server enforces the sidecar pod
// status policy (config/rbac/sidecar_pod_status_policy.yaml) in ns. The
// ValidatingAdmissionPolicy, and the sidecar Role it takes as its param,
// take effect when the API server's policy source has loaded them, which
// it does on a timer, some time after the writes (and again after an API
// server restart). The probe is a dry run of a patch the policy refuses:
// the sidecar of another pod (as other) writing pod's condition.
func waitStatusPolicy(ctx context.Context, other *rest.Config, ns, pod string) {
	GinkgoHelper()
	cs, err := kubernetes.NewForConfig(other)
	Expect(err).NotTo(HaveOccurred())
	Eventually(func(g Gomega) {
		_, err := cs.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType, conditionPatch("floodgate.dev/policy-loaded", "False"),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
		g.Expect(isForbidden(err)).To(BeTrue(), "a dry run of another pod's sidecar patching %s: %v", pod, err)
		g.Expect(err.Error()).To(ContainSubstring("may write only the status of the pod its token is bound to"))
	}).Should(Succeed(), "the API server enforces the pod status policy in %s", ns)
}

// canIList runs kubectl auth can-i --list in ns as cfg and returns the
// rules on namespaced resources.
func canIList(ctx context.Context, cfg *rest.Config, ns, name string) string {
	GinkgoHelper()
	k, err := kubetest.ForConfig(cfg, GinkgoT().TempDir(), name)
	Expect(err).NotTo(HaveOccurred())
	out, err := k.Run(ctx, "auth", "can-i", "--list", "-n", ns)
	Expect(err).NotTo(HaveOccurred())
	// Keep the header and the rules on resources; the non-resource URLs
	// and the self-reviews every authenticated user has are noise here.
	var keep []string
	for i, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) > 0 && !strings.HasPrefix(f[0], "[") && !strings.Contains(f[0], ".authorization.k8s.io") &&
			!strings.Contains(f[0], ".authentication.k8s.io") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

var _ = Describe("a sidecar's access to pod status", func() {
	It("lets a sidecar change only its own pod's condition: kubectl auth can-i and denied patches from other pods' credentials", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, "s3cret")
		Expect(k8sClient.Create(ctx, validPolicy(ns, "api", store))).To(Succeed())
		a := injectedPod(ctx, ns, "api-0")
		b := injectedPod(ctx, ns, "api-1")
		batch := appPod(ns, "batch-0", false)
		batch.Spec.ServiceAccountName = "batch"
		Expect(k8sClient.Create(ctx, batch)).To(Succeed())

		By("binding the sidecar Role to the service accounts of the pods with a sidecar only")
		Eventually(func(g Gomega) {
			var rb rbacv1.RoleBinding
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.RoleName}, &rb)).To(Succeed())
			g.Expect(rb.Subjects).To(Equal([]rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: ns}}))
		}).Should(Succeed())

		asA, asB, asBatch := podIdentity(ctx, a), podIdentity(ctx, b), podIdentity(ctx, batch)
		loaded := conditionPatch("floodgate.dev/policy-loaded", "True")

		By("waiting until the API server has the binding and the policy with its Role in force")
		waitAllowed(ctx, asA, ns, "patch", "pods", "status", a.Name)
		waitAllowed(ctx, asB, ns, "patch", "pods", "status", b.Name)
		waitStatusPolicy(ctx, asB, ns, a.Name)

		By("letting a sidecar write its own pod's condition")
		Expect(patchStatus(ctx, asA, ns, a.Name, loaded)).To(Succeed())
		Expect(patchStatus(ctx, asB, ns, b.Name, loaded)).To(Succeed())

		By("denying another pod's credentials, though RBAC allows pods/status")
		err := patchStatus(ctx, asB, ns, a.Name, conditionPatch("floodgate.dev/policy-loaded", "False"))
		Expect(isForbidden(err)).To(BeTrue(), "api-1 patching api-0: %v", err)
		Expect(err.Error()).To(ContainSubstring("may write only the status of the pod its token is bound to"))
		Expect(err.Error()).To(ContainSubstring("is bound to pod api-1, not to api-0"))
		AddReportEntry("api-1's sidecar token patching api-0's status", err.Error())
		err = patchStatus(ctx, asB, ns, batch.Name, conditionPatch("Ready", "True"))
		Expect(isForbidden(err)).To(BeTrue(), "api-1 patching a pod without a sidecar: %v", err)

		By("denying a sidecar anything but its own condition on its own pod")
		for what, patch := range map[string][]byte{
			"mark its pod Ready":      conditionPatch("Ready", "True"),
			"move its pod's address":  []byte(`{"status":{"podIP":"10.9.9.9","podIPs":[{"ip":"10.9.9.9"}]}}`),
			"end its pod's lifecycle": []byte(`{"status":{"phase":"Succeeded"}}`),
		} {
			err := patchStatus(ctx, asA, ns, a.Name, patch)
			Expect(isForbidden(err)).To(BeTrue(), "%s: %v", what, err)
			Expect(err.Error()).To(ContainSubstring("may change only the floodgate.dev/policy-loaded condition"), what)
		}

		By("denying a token that is not bound to a pod, and a service account without a sidecar")
		cs, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "default", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		unbound := rest.AnonymousClientConfig(cfg)
		unbound.BearerToken = tr.Status.Token
		err = patchStatus(ctx, unbound, ns, a.Name, loaded)
		Expect(isForbidden(err)).To(BeTrue(), "an unbound token: %v", err)
		Expect(err.Error()).To(ContainSubstring("has no pod-bound token"))
		err = patchStatus(ctx, asBatch, ns, batch.Name, loaded)
		Expect(isForbidden(err)).To(BeTrue(), "batch's own pod: %v", err)
		Expect(err.Error()).To(ContainSubstring(`cannot patch resource "pods/status"`), "RBAC, not the policy, refuses it")

		By("leaving alone a service account that RBAC allows to update pod status by other means")
		Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ctrl"}})).To(Succeed())
		Expect(k8sClient.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ctrl"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"get", "update", "patch"}}}})).To(Succeed())
		Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ctrl"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ctrl"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "ctrl", Namespace: ns}}})).To(Succeed())
		tr, err = cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "ctrl", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		controller := rest.AnonymousClientConfig(cfg)
		controller.BearerToken = tr.Status.Token
		Eventually(func() error {
			return patchStatus(ctx, controller, ns, a.Name, conditionPatch("example.com/gate", "True"))
		}).Should(Succeed())

		By("listing what each identity may do (kubectl auth can-i --list)")
		after := canIList(ctx, asA, ns, "sidecar")
		Expect(after).To(ContainSubstring("configmaps"))
		Expect(after).To(MatchRegexp(`pods/status\s+\[\]\s+\[\]\s+\[get patch\]`))
		afterOther := canIList(ctx, asBatch, ns, "batch")
		Expect(afterOther).NotTo(ContainSubstring("pods/status"))
		Expect(afterOther).NotTo(ContainSubstring("floodgate-policies"))

		// Before: floodgate bound the same Role to the group of every
		// service account of the namespace. Rebuilt by hand, unlabelled so
		// that the manager leaves it, in a namespace of its own.
		legacy := newNamespace(ctx)
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: legacy, Name: "floodgate-sidecar-before"}, Rules: sidecaraccess.Rules()}
		Expect(k8sClient.Create(ctx, role)).To(Succeed())
		Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: legacy, Name: "floodgate-sidecar-before"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts:" + legacy}}})).To(Succeed())
		oldBatch := appPod(legacy, "batch-0", false)
		oldBatch.Spec.ServiceAccountName = "batch"
		Expect(k8sClient.Create(ctx, oldBatch)).To(Succeed())
		asOldBatch := podIdentity(ctx, oldBatch)
		waitAllowed(ctx, asOldBatch, legacy, "patch", "pods", "status", oldBatch.Name)
		before := canIList(ctx, asOldBatch, legacy, "before")
		Expect(before).To(MatchRegexp(`pods/status\s+\[\]\s+\[\]\s+\[get patch\]`), "before, any service account could patch any pod's status")

		AddReportEntry("kubectl auth can-i --list, a sidecar's token (pod api-0, service account default), after", after)
		AddReportEntry("kubectl auth can-i --list, another workload's token (pod batch-0, service account batch), after", afterOther)
		AddReportEntry("kubectl auth can-i --list, another workload's token (pod batch-0, service account batch), before (group binding)", before)
		GinkgoWriter.Printf("can-i --list after, sidecar api-0:\n%s\n\nafter, batch-0:\n%s\n\nbefore, batch-0:\n%s\n", after, afterOther, before)
	})
})
