package gatewayloop

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/counterstore/formation"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// store is the suite's CounterStore, started in BeforeSuite. The central
// service's document has one store: the earliest policy's, so each spec
// deletes its policies (deleteGatewayPolicy) before the next one names
// another.
const store = "gateway-store"

// sidecarPassword is the password of the store user of the central
// service's namespace.
const sidecarPassword = "gateway-sidecar-0123456789abcdef"

// startManagedStore starts a Redis Cluster of masters masters and
// registers it as the managed CounterStore name, Ready, as the
// CounterStore controller keeps one: its auth Secret in the manager's
// namespace holds the admin password; the central service's namespace has
// its user (password sidecarPassword) on every node, with the counter
// functions on that namespace's keys and nothing else; the masters have
// the functions. The cluster stops when the calling container ends (the
// suite's own store, from BeforeSuite, with the suite).
func startManagedStore(ctx context.Context, name string, masters int) *redistest.Cluster {
	redis := redistest.StartCluster(GinkgoT(), redistest.Options{Masters: masters, Password: "gateway-secret"})
	sess := formation.NewSession(formation.Dialer{Password: redis.Password()})
	DeferCleanup(sess.Close)
	_, err := sess.EnsureUser(ctx, redis.Addrs(), formation.User{
		Name: counterstore.NamespaceUser(serviceNamespace), Passwords: []string{sidecarPassword}, Rules: counterstore.NamespaceACLRules(serviceNamespace)})
	Expect(err).NotTo(HaveOccurred())
	libName, libSrc := redislayout.Library()
	_, err = sess.EnsureLibrary(ctx, redis.Addrs(), libName, libSrc)
	Expect(err).NotTo(HaveOccurred())
	Expect(k8sClient.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: counterstore.AuthSecretName(name), Namespace: serviceNamespace},
		Data:       map[string][]byte{counterstore.PasswordKey: []byte(redis.Password())},
	})).To(Succeed())
	cs := &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{}},
	}
	Expect(k8sClient.Create(ctx, cs)).To(Succeed())
	Expect(k8sClient.Create(ctx, counterstore.DesiredUserSecret(cs, serviceNamespace, serviceNamespace,
		counterstore.UserCredentials{Password: sidecarPassword}))).To(Succeed())
	cs.Status = v1alpha1.CounterStoreStatus{
		ObservedGeneration: cs.Generation,
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready",
			Message: "test store", LastTransitionTime: metav1.Now(), ObservedGeneration: cs.Generation}},
		SlotsCovered:   v1alpha1.RedisClusterSlots,
		Endpoints:      redis.Addrs(),
		AuthSecretName: counterstore.AuthSecretName(name),
	}
	Expect(k8sClient.Status().Update(ctx, cs)).To(Succeed())
	return redis
}

// deleteGatewayPolicy deletes policy namespace/name and waits until the
// central service's document no longer holds it, so that the next spec
// finds the document as if the policy had never been: the document's
// store is its earliest policy's.
func deleteGatewayPolicy(ctx SpecContext, namespace, name string) {
	p := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, p))).To(Succeed())
	Eventually(func(g Gomega) {
		var cm corev1.ConfigMap
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: config.RateLimitServiceConfigMapName}, &cm)
		if apierrors.IsNotFound(err) {
			return // no gateway policy is left
		}
		g.Expect(err).NotTo(HaveOccurred())
		doc, err := config.Parse([]byte(cm.Data[config.DataKey]))
		g.Expect(err).NotTo(HaveOccurred())
		for _, q := range doc.Policies {
			g.Expect(q.Namespace + "/" + q.Name).NotTo(Equal(namespace + "/" + name))
		}
	}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
}
