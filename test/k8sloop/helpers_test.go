package k8sloop

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

func init() {
	SetDefaultEventuallyTimeout(30 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)
	SetDefaultConsistentlyDuration(time.Second)
}

// newNamespace creates a namespace for one spec, enforcing the restricted
// Pod Security profile, so that the API server's own PodSecurity
// admission checks every injected pod.
func newNamespace(ctx context.Context) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		GenerateName: "loop-",
		Labels:       map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
	}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, ns))).To(Succeed())
	})
	return ns.Name
}

// validPolicy is a policy that passes every check.
func validPolicy(ns, name, store string) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
			StoreRef:    &v1alpha1.StoreReference{Name: store},
			Rules: []v1alpha1.Rule{{
				Name:  "per-client",
				Key:   []v1alpha1.KeyPart{{Header: "X-Client"}},
				Limit: v1alpha1.Limit{Requests: 100, Per: metav1.Duration{Duration: time.Minute}},
			}},
		},
	}
}

// appPod is a pod that the restricted profile admits, serving "http" on
// 8080; annotated asks for the sidecar.
func appPod(ns, name string, annotated bool) *corev1.Pod {
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "api"}},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "app",
				Image: "registry.example/app:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstrName("http")},
				}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	if annotated {
		pod.Annotations = map[string]string{injection.AnnotationInject: "true"}
	}
	return pod
}

// newStore creates a Ready CounterStore whose password is password,
// published in a Secret of the manager's namespace, as the store
// controller would.
func newStore(ctx context.Context, password string) string {
	return newTLSStore(ctx, password, nil)
}

// newTLSStore is newStore for a store that serves TLS; with ca, its
// tls.caSecretRef names that bundle, under "ca.pem" in the password's
// Secret.
func newTLSStore(ctx context.Context, password string, ca []byte) string {
	name := "loop-" + rand.String(6)
	auth := name + "-auth"
	data := map[string][]byte{"password": []byte(password)}
	ext := &v1alpha1.ExternalStore{
		Addresses:         []v1alpha1.HostPort{"127.0.0.1:6379"},
		PasswordSecretRef: &v1alpha1.SecretKeySelector{Namespace: managerNamespace, Name: auth, Key: "password"},
	}
	if ca != nil {
		data["ca.pem"] = ca
		ext.TLS = &v1alpha1.StoreTLS{CASecretRef: &v1alpha1.SecretKeySelector{Namespace: managerNamespace, Name: auth, Key: "ca.pem"}}
	}
	Expect(k8sClient.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: auth, Namespace: managerNamespace},
		Data:       data,
	})).To(Succeed())
	cs := &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.CounterStoreSpec{External: ext},
	}
	Expect(k8sClient.Create(ctx, cs)).To(Succeed())
	cs.Status = v1alpha1.CounterStoreStatus{
		ObservedGeneration: cs.Generation,
		Conditions: []metav1.Condition{{
			Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "test store",
			LastTransitionTime: metav1.Now(), ObservedGeneration: cs.Generation,
		}},
		SlotsCovered:   v1alpha1.RedisClusterSlots,
		Endpoints:      []string{"127.0.0.1:6379"},
		AuthSecretName: "floodgate-store-auth",
	}
	Expect(k8sClient.Status().Update(ctx, cs)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cs))).To(Succeed())
	})
	return name
}

// configMap returns the namespace's compiled document.
func configMap(ctx context.Context, ns string) (*config.Config, error) {
	var cm corev1.ConfigMap
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.ConfigMapName}, &cm); err != nil {
		return nil, err
	}
	return config.Parse([]byte(cm.Data[config.DataKey]))
}

// revision returns the namespace's current document revision, or "".
func revision(ctx context.Context, ns string) string {
	c, err := configMap(ctx, ns)
	if err != nil {
		return ""
	}
	return c.Revision
}

// settledRevision waits until the controllers have settled on what the
// spec built, and returns that revision: the namespace's document counts
// exactly pods, ready, as the replicas of policy (so no pod event the
// controller has yet to see can recompile it), and the policy's status
// describes its current generation with that many targeted pods. A spec
// that asserts on a revision reads it here, not at the first instant a
// sidecar happens to agree with the ConfigMap.
func settledRevision(ctx context.Context, ns, policy string, pods ...string) string {
	GinkgoHelper()
	return settled(ctx, ns, policy, int32(len(pods)), pods...)
}

// settled is settledRevision for a policy whose targeted pods are not all
// ready: the document holds the policy's current generation with ready as
// its replica pods (at least one replica, as the compiler counts them),
// and the policy's status describes that generation with targeted pods.
// The policy is read before the document, so the document checked is at
// least as new as the status.
func settled(ctx context.Context, ns, policy string, targeted int32, ready ...string) string {
	GinkgoHelper()
	var rev string
	Eventually(func(g Gomega) {
		var p v1alpha1.RateLimitPolicy
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: policy}, &p)).To(Succeed())
		g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation), "the status of %s", policy)
		g.Expect(p.Status.TargetedPods).To(Equal(targeted), "the targeted pods of %s", policy)
		c, err := configMap(ctx, ns)
		g.Expect(err).NotTo(HaveOccurred())
		i := slices.IndexFunc(c.Policies, func(e config.Policy) bool { return e.Name == policy })
		g.Expect(i).To(BeNumerically(">=", 0), "policy %s in revision %s", policy, c.Revision)
		e := c.Policies[i]
		g.Expect(e.Generation).To(Equal(p.Generation), "the generation of %s in revision %s", policy, c.Revision)
		var replicas []string
		for _, j := range e.ReplicaPods {
			g.Expect(int(j)).To(BeNumerically("<", len(c.Pods)))
			replicas = append(replicas, c.Pods[j])
		}
		g.Expect(replicas).To(ConsistOf(ready), "replica pods of %s in revision %s", policy, c.Revision)
		g.Expect(e.Replicas).To(Equal(max(int32(len(ready)), 1)), "replicas of %s in revision %s", policy, c.Revision)
		rev = c.Revision
	}, 30*time.Second, 50*time.Millisecond).Should(Succeed(), "the controllers settle on generation and pods of %s", policy)
	return rev
}

// waitAllowed waits until the API server authorizes the identity of cfg
// to do verb on resource (and subresource; name may be empty) in ns. A
// Role or RoleBinding that a client reads back at once takes effect only
// when the API server's authorizer has it from its own informer, a moment
// later.
func waitAllowed(ctx context.Context, cfg *rest.Config, ns, verb, resource, subresource, name string) {
	GinkgoHelper()
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	Eventually(func(g Gomega) {
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: verb, Resource: resource, Subresource: subresource, Name: name,
			}},
		}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Status.Allowed).To(BeTrue(), "%s %s/%s %s: %s", verb, resource, subresource, name, r.Status.Reason)
	}).Should(Succeed(), "the API server authorizes %s on %s/%s in %s", verb, resource, subresource, ns)
}

// loadedCondition returns the sidecar's condition on a pod, or nil.
func loadedCondition(ctx context.Context, ns, name string) *corev1.PodCondition {
	var pod corev1.Pod
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pod); err != nil {
		return nil
	}
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == config.ConditionPolicyLoaded {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// getPolicy reads a policy.
func getPolicy(ctx context.Context, ns, name string) *v1alpha1.RateLimitPolicy {
	var p v1alpha1.RateLimitPolicy
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p)).To(Succeed())
	return &p
}

// updatePolicy changes a policy's spec, retrying on conflicts (the
// controllers write its status), and returns when the write the API
// server accepted was sent. A bound on the change's propagation is
// measured from the watch event instead (watchGeneration): the write's own
// round trip (admission webhooks, etcd) is not the loop's latency.
func updatePolicy(ctx context.Context, ns, name string, change func(*v1alpha1.RateLimitPolicy)) time.Time {
	var sent time.Time
	Eventually(func() error {
		p := getPolicy(ctx, ns, name)
		change(p)
		sent = time.Now()
		return k8sClient.Update(ctx, p)
	}).Should(Succeed())
	return sent
}

// watchGeneration returns a channel that receives the instant a watch
// saw the API server store generation gen (or a later one) of a policy:
// the event the policy controller's own watch delivers, which a bound on
// the change's propagation is measured from. Call it before the write.
func watchGeneration(ctx context.Context, ns, name string, gen int64) <-chan time.Time {
	GinkgoHelper()
	dyn, err := dynamic.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	w, err := dyn.Resource(v1alpha1.GroupVersion.WithResource("ratelimitpolicies")).Namespace(ns).
		Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(w.Stop)
	seen := make(chan time.Time, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && u.GetGeneration() >= gen {
				seen <- time.Now()
				return
			}
		}
	}()
	return seen
}

func isForbidden(err error) bool { return apierrors.IsForbidden(err) }

// recovery bounds how long the manager and a sidecar take to follow the
// API server again once it is back after an outage: client-go's
// reflectors retry a failed list or watch with a backoff that stops
// growing at [30, 60) s, and the restarted API server refuses them
// (Forbidden) until its own RBAC cache has synced, which grows that
// backoff further.
const recovery = 2 * time.Minute

// managerFollows waits, after an API server restart, until the manager's
// cache follows the API server again for every kind its controllers and
// webhooks watch, except ClusterRateLimitPolicies, which no spec of this
// suite uses: until then, a change of a kind whose informer is still
// backing off reaches no controller, in this spec or the next. A marker of
// each kind is created where no controller acts on it, in a namespace of
// its own (a Secret in the manager's namespace, the only one whose
// Secrets it caches), and the manager's cache must return each; Roles,
// RoleBindings and Secrets are watched as metadata only.
func managerFollows(ctx context.Context) {
	GinkgoHelper()
	ns := newNamespace(ctx)
	name := "marker-" + rand.String(6)
	pod := appPod(ns, name, false)
	pod.Labels = map[string]string{"app": "marker"}
	store := &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.CounterStoreSpec{External: &v1alpha1.ExternalStore{Addresses: []v1alpha1.HostPort{"127.0.0.1:6379"}}},
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: managerNamespace, Name: name}}
	typed := []client.Object{
		pod,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{policy.ManagedByLabel: policy.ManagedByValue}}},
		store,
		validPolicy(ns, name, name),
	}
	metadata := []client.Object{
		secret,
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}},
	}
	for _, o := range append(slices.Clone(typed), metadata...) {
		Expect(k8sClient.Create(ctx, o)).To(Succeed())
	}
	DeferCleanup(func(ctx SpecContext) {
		for _, o := range []client.Object{store, secret} {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, o))).To(Succeed())
		}
	})
	Eventually(func(g Gomega) {
		g.Expect(managerCache.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})).To(Succeed(), "Namespace %s", ns)
		for _, o := range typed {
			got := o.DeepCopyObject().(client.Object)
			g.Expect(managerCache.Get(ctx, client.ObjectKeyFromObject(o), got)).To(Succeed(), "%T %s", o, o.GetName())
		}
		for _, o := range metadata {
			gvk, err := apiutil.GVKForObject(o, k8sClient.Scheme())
			g.Expect(err).NotTo(HaveOccurred())
			m := &metav1.PartialObjectMetadata{}
			m.SetGroupVersionKind(gvk)
			g.Expect(managerCache.Get(ctx, client.ObjectKeyFromObject(o), m)).To(Succeed(), "%s %s (metadata)", gvk.Kind, o.GetName())
		}
	}).WithTimeout(recovery).WithPolling(100*time.Millisecond).Should(Succeed(), "the manager's cache follows the API server again")
}

// killAPIServer crashes envtest's kube-apiserver with SIGKILL, as a node
// failure would: no graceful shutdown, open watches cut. It finds the
// process by the certificate directory the suite gave it.
func killAPIServer() {
	dir := testEnv.ControlPlane.GetAPIServer().CertDir
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	Expect(err).NotTo(HaveOccurred())
	killed := 0
	for _, p := range procs {
		cmd, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if !strings.HasSuffix(args[0], "kube-apiserver") || !strings.Contains(string(cmd), dir) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		Expect(err).NotTo(HaveOccurred())
		Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
		killed++
	}
	Expect(killed).To(Equal(1), "found %d kube-apiservers with cert dir %s", killed, dir)
	// The process is gone: Stop only reaps it.
	Eventually(testEnv.ControlPlane.APIServer.Stop).Should(Succeed())
}
