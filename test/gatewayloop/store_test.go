package gatewayloop

import (
	"context"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/counterstore/formation"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// store is the CounterStore of every policy of the suite: the central
// service's document has one store.
const store = "gateway-store"

// sidecarPassword is the password of the store user of the central
// service's namespace.
const sidecarPassword = "gateway-sidecar-0123456789abcdef"

// startStore starts a real Redis Cluster and makes it the managed store
// as the CounterStore controller keeps it: its auth Secret in the
// manager's namespace holds the admin password; the central service's
// namespace has its user, whose Secret holds its password, and which
// every node has, with the counter functions on that namespace's keys
// and nothing else; the masters have the functions. It runs once, from
// BeforeSuite; the cluster stops with the suite.
func startStore(ctx context.Context, t redistest.TB) {
	redis := redistest.StartCluster(t, redistest.Options{Masters: 3, Password: "gateway-secret"})
	sess := formation.NewSession(formation.Dialer{Password: redis.Password()})
	defer func() { _ = sess.Close() }()
	_, err := sess.EnsureUser(ctx, redis.Addrs(), formation.User{
		Name: counterstore.NamespaceUser(serviceNamespace), Passwords: []string{sidecarPassword}, Rules: counterstore.NamespaceACLRules(serviceNamespace)})
	Expect(err).NotTo(HaveOccurred())
	libName, libSrc := redislayout.Library()
	_, err = sess.EnsureLibrary(ctx, redis.Addrs(), libName, libSrc)
	Expect(err).NotTo(HaveOccurred())
	Expect(k8sClient.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: counterstore.AuthSecretName(store), Namespace: serviceNamespace},
		Data:       map[string][]byte{counterstore.PasswordKey: []byte(redis.Password())},
	})).To(Succeed())
	cs := &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: store},
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
		AuthSecretName: counterstore.AuthSecretName(store),
	}
	Expect(k8sClient.Status().Update(ctx, cs)).To(Succeed())
}
