package k8sloop

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/sidecaraccess"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/kubetest"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

var _ = Describe("the sidecar's identity", func() {
	It("may read its namespace's policies ConfigMap and write pod status, and nothing else", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		other := newNamespace(ctx)
		store := newStore(ctx, "s3cret")
		for _, n := range []string{ns, other} {
			Expect(k8sClient.Create(ctx, validPolicy(n, "api", store))).To(Succeed())
			Expect(k8sClient.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "app-settings"},
				Data:       map[string]string{"k": "v"},
			})).To(Succeed())
		}
		pod := injectedPod(ctx, ns, "api-0")
		Eventually(func(g Gomega) {
			g.Expect(revision(ctx, ns)).NotTo(BeEmpty())
			var s corev1.Secret
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.SecretName}, &s)).To(Succeed())
			var b rbacv1.RoleBinding
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.RoleName}, &b)).To(Succeed())
			g.Expect(b.Subjects).To(ContainElement(HaveField("Name", "default")), "the pod's service account is bound")
		}).Should(Succeed())

		id := podIdentity(ctx, pod)
		waitAllowed(ctx, id, ns, "get", "configmaps", "", config.ConfigMapName)
		waitAllowed(ctx, id, ns, "patch", "pods", "status", pod.Name)
		cs, err := kubernetes.NewForConfig(id)
		Expect(err).NotTo(HaveOccurred())
		cms := cs.CoreV1().ConfigMaps(ns)

		By("allowing what the sidecar does")
		_, err = cms.Get(ctx, config.ConfigMapName, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		one := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", config.ConfigMapName).String()}
		list, err := cms.List(ctx, one)
		Expect(err).NotTo(HaveOccurred())
		Expect(list.Items).To(HaveLen(1))
		w, err := cms.Watch(ctx, one)
		Expect(err).NotTo(HaveOccurred())
		w.Stop()
		_, err = cs.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.StrategicMergePatchType,
			[]byte(`{"status":{"conditions":[{"type":"floodgate.dev/policy-loaded","status":"False","reason":"Probe","message":"rbac test"}]}}`),
			metav1.PatchOptions{}, "status")
		Expect(err).NotTo(HaveOccurred())

		By("forbidding everything else")
		forbidden := map[string]func(context.Context) error{
			"get another ConfigMap": func(ctx context.Context) error {
				_, err := cms.Get(ctx, "app-settings", metav1.GetOptions{})
				return err
			},
			"list every ConfigMap": func(ctx context.Context) error {
				_, err := cms.List(ctx, metav1.ListOptions{})
				return err
			},
			"read the policies of another namespace": func(ctx context.Context) error {
				_, err := cs.CoreV1().ConfigMaps(other).Get(ctx, config.ConfigMapName, metav1.GetOptions{})
				return err
			},
			"get the store password Secret": func(ctx context.Context) error {
				_, err := cs.CoreV1().Secrets(ns).Get(ctx, sidecaraccess.SecretName, metav1.GetOptions{})
				return err
			},
			"list Secrets": func(ctx context.Context) error {
				_, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
				return err
			},
			"read a Secret of the manager's namespace": func(ctx context.Context) error {
				_, err := cs.CoreV1().Secrets(managerNamespace).Get(ctx, certSecret, metav1.GetOptions{})
				return err
			},
			"edit the policies ConfigMap": func(ctx context.Context) error {
				_, err := cms.Patch(ctx, config.ConfigMapName, types.MergePatchType, []byte(`{"data":{"x":"y"}}`), metav1.PatchOptions{})
				return err
			},
			"get a pod (not its status)": func(ctx context.Context) error {
				_, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
				return err
			},
			"patch a pod's spec": func(ctx context.Context) error {
				_, err := cs.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
				return err
			},
			"patch the status of a pod in another namespace": func(ctx context.Context) error {
				_, err := cs.CoreV1().Pods(other).Patch(ctx, "any", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}, "status")
				return err
			},
			"read RateLimitPolicies": func(ctx context.Context) error {
				return cs.RESTClient().Get().AbsPath("/apis/ratelimit.floodgate.dev/v1alpha1/namespaces", ns, "ratelimitpolicies").Do(ctx).Error()
			},
		}
		for what, call := range forbidden {
			err := call(ctx)
			Expect(isForbidden(err)).To(BeTrue(), "%s: got %v, want Forbidden", what, err)
		}

		By("saying the same through kubectl auth can-i, with the sidecar's own token")
		sk, err := kubetest.ForConfig(podIdentity(ctx, pod), GinkgoT().TempDir(), "sidecar")
		Expect(err).NotTo(HaveOccurred())
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"get", "configmaps/" + config.ConfigMapName}, "yes"},
			{[]string{"watch", "configmaps/" + config.ConfigMapName}, "yes"},
			{[]string{"patch", "pods/api-0", "--subresource=status"}, "yes"},
			{[]string{"get", "configmaps/app-settings"}, "no"},
			{[]string{"get", "secrets"}, "no"},
			{[]string{"get", "secrets/" + sidecaraccess.SecretName}, "no"},
			{[]string{"patch", "pods"}, "no"},
		} {
			args := append([]string{"auth", "can-i", "-n", ns}, tc.args...)
			out, _ := sk.Run(ctx, args...)
			Expect(strings.TrimSpace(out)).To(Equal(tc.want), "kubectl %s", strings.Join(args, " "))
		}
	})
})

var _ = Describe("the sidecar access controller", func() {
	It("never gives a namespace a managed store's admin password, nor another namespace's user: not for a look-alike sidecar pod, not before its own user has a password", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		name := "managed-" + rand.String(6)
		auth := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: counterstore.AuthSecretName(name), Namespace: managerNamespace},
			Data:       map[string][]byte{counterstore.PasswordKey: []byte("admin-pw")},
		}
		Expect(k8sClient.Create(ctx, auth)).To(Succeed())
		cs := &v1alpha1.CounterStore{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{}}}
		Expect(k8sClient.Create(ctx, cs)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cs))).To(Succeed()) })

		cs.Status = v1alpha1.CounterStoreStatus{
			ObservedGeneration: cs.Generation,
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "test store",
				LastTransitionTime: metav1.Now(), ObservedGeneration: cs.Generation}},
			SlotsCovered: v1alpha1.RedisClusterSlots, Endpoints: []string{"127.0.0.1:6379"}, AuthSecretName: sidecaraccess.SecretName,
		}
		Expect(k8sClient.Status().Update(ctx, cs)).To(Succeed())
		// A container named as the sidecar, without the store user's
		// file: what a sidecar injected before stores had users looked
		// like, and what any pod may look like. It needs no annotation.
		lookalike := appPod(ns, "lookalike", false)
		fake := *lookalike.Spec.Containers[0].DeepCopy()
		fake.Name, fake.Image, fake.Ports, fake.ReadinessProbe = config.ContainerName, "registry.example/anything:1", nil, nil
		lookalike.Spec.Containers = append(lookalike.Spec.Containers, fake)
		Expect(k8sClient.Create(ctx, lookalike)).To(Succeed())
		Expect(k8sClient.Create(ctx, validPolicy(ns, "api", name))).To(Succeed())

		By("asking for the namespace's own user, and giving nothing while it has no password")
		userKey := client.ObjectKey{Namespace: managerNamespace, Name: counterstore.UserSecretName(name, ns)}
		var user corev1.Secret
		Eventually(func() error { return k8sClient.Get(ctx, userKey, &user) }).Should(Succeed(), "the namespace's user Secret is asked for")
		Expect(user.Data).To(BeEmpty())
		Expect(user.Labels).To(HaveKeyWithValue(counterstore.UserNamespaceLabel, ns))
		Expect(metav1.IsControlledBy(&user, cs)).To(BeTrue(), "owned by the store, whose controller fills it in")
		_, ok, err := sidecaraccess.StoreCredentials(ctx, k8sClient, k8sClient, managerNamespace, ns, config.Store{Name: name, Type: config.StoreRedis})
		Expect(ok).To(BeFalse())
		Expect(err).To(MatchError(sidecaraccess.ErrCredentialsPending))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.SecretName}, &corev1.Secret{})).
			To(MatchError(ContainSubstring("not found")), "nothing is mirrored before the namespace's user has a password")

		By("giving the namespace its own user once the store's controller has set its password, never the admin's or another namespace's")
		// What the CounterStore controller writes once every node
		// accepts the password.
		Expect(k8sClient.Get(ctx, userKey, &user)).To(Succeed())
		user.Data = map[string][]byte{counterstore.UserPasswordKey: []byte("namespace-user-pw-0001")}
		Expect(k8sClient.Update(ctx, &user)).To(Succeed())
		var s corev1.Secret
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.SecretName}, &s)
		}).Should(Succeed())
		Expect(string(s.Data[sidecaraccess.UsernameKey])).To(Equal(counterstore.NamespaceUser(ns)))
		Expect(string(s.Data[sidecaraccess.PasswordKey])).To(Equal("namespace-user-pw-0001"), "the first copy holds the namespace's own user's password, never the admin's")
		// Another namespace asking gets its own user, not this one's.
		_, ok, err = sidecaraccess.StoreCredentials(ctx, k8sClient, k8sClient, managerNamespace, ns+"-other", config.Store{Name: name, Type: config.StoreRedis})
		Expect(ok).To(BeFalse())
		Expect(err).To(MatchError(sidecaraccess.ErrCredentialsPending))

		By("deleting the namespace's user Secret once the namespace needs no access")
		Expect(k8sClient.DeleteAllOf(ctx, &v1alpha1.RateLimitPolicy{}, client.InNamespace(ns))).To(Succeed())
		Expect(k8sClient.Delete(ctx, lookalike)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, userKey, &corev1.Secret{}))
		}).WithTimeout(30*time.Second).Should(BeTrue(), "the store's controller then deletes the user from the nodes")
	})

	It("repairs a widened Role and removes its objects when the namespace no longer needs them", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, "pw-1")
		Expect(k8sClient.Create(ctx, validPolicy(ns, "api", store))).To(Succeed())
		key := client.ObjectKey{Namespace: ns, Name: sidecaraccess.RoleName}
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.SecretName}, &s)).To(Succeed())
			g.Expect(string(s.Data["password"])).To(Equal("pw-1"))
			var r rbacv1.Role
			g.Expect(k8sClient.Get(ctx, key, &r)).To(Succeed())
		}).Should(Succeed())

		By("undoing a manual widening of the Role")
		var r rbacv1.Role
		Expect(k8sClient.Get(ctx, key, &r)).To(Succeed())
		r.Rules[0].ResourceNames = nil
		r.Rules = append(r.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
		Expect(k8sClient.Update(ctx, &r)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, key, &r)).To(Succeed())
			g.Expect(r.Rules).To(Equal(sidecaraccess.Rules()))
		}).Should(Succeed())

		By("following a new store password")
		var src corev1.Secret
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: store + "-auth"}, &src)).To(Succeed())
		src.Labels = map[string]string{"app.kubernetes.io/managed-by": "floodgate-manager"}
		src.Data["password"] = []byte("pw-2")
		Expect(k8sClient.Update(ctx, &src)).To(Succeed())
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.SecretName}, &s)).To(Succeed())
			g.Expect(string(s.Data["password"])).To(Equal("pw-2"))
		}).Should(Succeed())

		By("removing the Role, RoleBinding and password once no policy and no opted-in pod is left")
		Expect(k8sClient.Delete(ctx, getPolicy(ctx, ns, "api"))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(apierrors.IsNotFound(k8sClient.Get(ctx, key, &rbacv1.Role{}))).To(BeTrue())
			g.Expect(apierrors.IsNotFound(k8sClient.Get(ctx, key, &rbacv1.RoleBinding{}))).To(BeTrue())
			g.Expect(apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.SecretName}, &corev1.Secret{}))).To(BeTrue())
		}).Should(Succeed())
	})

	It("gives sidecars an external store's TLS CA bundle with its password, at the file the compiled config names", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		_, _, ca := redistest.NewCA(GinkgoT())
		store := newTLSStore(ctx, "tls-pw", ca)
		Expect(k8sClient.Create(ctx, validPolicy(ns, "api", store))).To(Succeed())
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.SecretName}, &s)).To(Succeed())
			g.Expect(string(s.Data[config.StoreAuthKey])).To(Equal("tls-pw"))
			g.Expect(s.Data[config.StoreCAKey]).To(Equal(ca))
			doc, err := configMap(ctx, ns)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(doc.Store.TLS).NotTo(BeNil())
			g.Expect(doc.Store.TLS.CAFile).To(Equal(config.StoreCAFile))
		}).Should(Succeed())

		By("following a rotated CA bundle")
		var src corev1.Secret
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: store + "-auth"}, &src)).To(Succeed())
		_, _, next := redistest.NewCA(GinkgoT())
		src.Labels = map[string]string{"app.kubernetes.io/managed-by": "floodgate-manager"}
		src.Data["ca.pem"] = append(append([]byte{}, ca...), next...)
		Expect(k8sClient.Update(ctx, &src)).To(Succeed())
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecaraccess.SecretName}, &s)).To(Succeed())
			g.Expect(s.Data[config.StoreCAKey]).To(Equal(src.Data["ca.pem"]))
		}).Should(Succeed())
	})
})
