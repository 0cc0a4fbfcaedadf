package counterstore_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/counterstore/formation"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/lateness"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// The store the specs below build, heal and grow. It is named "default", so
// that policies without a storeRef use it.
const storeName = v1alpha1.DefaultCounterStoreName

func getStore(ctx context.Context, name string) *v1alpha1.CounterStore {
	GinkgoHelper()
	var cs v1alpha1.CounterStore
	Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, &cs)).To(Succeed())
	return &cs
}

func condStatus(cs *v1alpha1.CounterStore, typ string) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(cs.Status.Conditions, typ); c != nil {
		return c.Status
	}
	return ""
}

func describe(cs *v1alpha1.CounterStore) string {
	var parts []string
	for _, c := range cs.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return fmt.Sprintf("slots %d, nodes %+v, endpoints %v; %s", cs.Status.SlotsCovered, cs.Status.Nodes, cs.Status.Endpoints, strings.Join(parts, "; "))
}

// healthy reports a Ready, fully redundant store with the given shape.
func healthy(cs *v1alpha1.CounterStore, shards, replicas int32) bool {
	return condStatus(cs, v1alpha1.ConditionReady) == metav1.ConditionTrue &&
		condStatus(cs, v1alpha1.ConditionDegraded) == metav1.ConditionFalse &&
		cs.Status.SlotsCovered == formation.NumSlots &&
		cs.Status.Nodes.Primaries == shards && cs.Status.Nodes.Replicas == shards*replicas &&
		cs.Status.Nodes.Failed == 0 && len(cs.Status.Endpoints) == int(shards) &&
		cs.Status.ObservedGeneration == cs.Generation
}

// topology reads every running node's own line.
func topology(ctx context.Context, k *kubelet) (masters map[string]formation.NodeView, replicas map[string]formation.NodeView, nodes map[string]string) {
	GinkgoHelper()
	masters, replicas, nodes = map[string]formation.NodeView{}, map[string]formation.NodeView{}, map[string]string{}
	for _, c := range k.clients() {
		raw, err := c.ClusterNodes(ctx).Result()
		Expect(err).NotTo(HaveOccurred())
		view, err := formation.ParseClusterNodes(raw)
		Expect(err).NotTo(HaveOccurred())
		self, ok := view.Self()
		Expect(ok).To(BeTrue())
		nodes[self.ID] = self.Addr
		if self.IsReplica() {
			replicas[self.ID] = self
		} else if self.SlotCount() > 0 {
			masters[self.ID] = self
		}
	}
	return masters, replicas, nodes
}

var _ = Describe("A managed CounterStore", Ordered, func() {
	var (
		k        *kubelet
		password string
		keys     = map[string]string{}
	)

	BeforeAll(func(ctx SpecContext) {
		k = newKubelet(storeName, GinkgoT().TempDir())
		DeferCleanup(k.shutdown)
		cs := &v1alpha1.CounterStore{
			ObjectMeta: metav1.ObjectMeta{Name: storeName},
			Spec: v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{
				Shards:           3,
				ReplicasPerShard: 1,
				NodeTimeout:      &metav1.Duration{Duration: time.Second},
			}},
		}
		Expect(k8sClient.Create(ctx, cs)).To(Succeed())
	})

	// namespaceUser asks for tenant's store user as the sidecaraccess
	// controller does (an empty user Secret owned by the store), and
	// returns the password the store's controller gives it once every
	// node accepts it.
	namespaceUser := func(ctx context.Context, tenant string) string {
		GinkgoHelper()
		sec := counterstore.NewUserSecret(getStore(ctx, storeName), counterstore.DefaultNamespace, tenant)
		Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, sec))).To(Succeed())
		var pw string
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(sec), sec)).To(Succeed())
			pw = string(sec.Data[counterstore.UserPasswordKey])
			g.Expect(pw).To(HaveLen(64))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		return pw
	}

	clusterClient := func() *redis.ClusterClient {
		var addrs []string
		for _, c := range k.clients() {
			addrs = append(addrs, c.Options().Addr)
		}
		cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Password: password, Protocol: 2, DisableIdentity: true, MaxRedirects: 16})
		DeferCleanup(cl.Close)
		return cl
	}
	writeKeys := func(ctx context.Context, prefix string, n int) {
		GinkgoHelper()
		cl := clusterClient()
		for i := range n {
			key, val := fmt.Sprintf("%s:%d", prefix, i), strconv.Itoa(i*3+1)
			Expect(cl.Set(ctx, key, val, 0).Err()).To(Succeed())
			keys[key] = val
		}
		Expect(redistest.WaitReplicated(ctx, k.clients(), 10*time.Second)).To(Succeed())
	}
	checkKeys := func(ctx context.Context) {
		GinkgoHelper()
		cl := clusterClient()
		var lost []string
		for key, want := range keys {
			got, err := cl.Get(ctx, key).Result()
			if err != nil || got != want {
				lost = append(lost, fmt.Sprintf("%s=%q (%v)", key, got, err))
			}
		}
		Expect(lost).To(BeEmpty(), "%d of %d keys lost", len(lost), len(keys))
	}

	It("writes its objects with owner references and one field owner", func(ctx SpecContext) {
		cs := getStore(ctx, storeName)
		ns := counterstore.DefaultNamespace
		name := counterstore.ObjectName(storeName)
		isOwned := func(o client.Object) {
			GinkgoHelper()
			refs := o.GetOwnerReferences()
			Expect(refs).To(HaveLen(1))
			Expect(refs[0].UID).To(Equal(cs.UID))
			Expect(refs[0].Kind).To(Equal("CounterStore"))
			Expect(ptr.Deref(refs[0].Controller, false)).To(BeTrue())
			managers := map[string]metav1.ManagedFieldsOperationType{}
			for _, mf := range o.GetManagedFields() {
				managers[mf.Manager] = mf.Operation
			}
			Expect(managers).To(HaveKeyWithValue(counterstore.FieldOwner, metav1.ManagedFieldsOperationApply))
		}
		var sts appsv1.StatefulSet
		// The first reconcile of a manager that has just started, on a
		// busy machine: a few seconds, not one.
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sts)
		}).WithTimeout(30 * time.Second).Should(Succeed())
		isOwned(&sts)
		Expect(*sts.Spec.Replicas).To(BeEquivalentTo(6))
		Expect(sts.Spec.ServiceName).To(Equal(name))
		Expect(sts.Spec.Template.Spec.Containers[0].Image).To(Equal(counterstore.DefaultImage), "the API default")

		var svc corev1.Service
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &svc)).To(Succeed())
		isOwned(&svc)
		Expect(svc.Spec.ClusterIP).To(Equal(corev1.ClusterIPNone))

		var cm corev1.ConfigMap
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: counterstore.ConfigMapName(storeName)}, &cm)).To(Succeed())
		isOwned(&cm)
		Expect(cm.Data["redis.conf"]).To(ContainSubstring("cluster-node-timeout 1000\n"))

		var pdb policyv1.PodDisruptionBudget
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pdb)).To(Succeed())
		isOwned(&pdb)

		var np networkingv1.NetworkPolicy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &np)).To(Succeed(), "on by default")
		isOwned(&np)
		Expect(np.Spec.PodSelector.MatchLabels).To(Equal(counterstore.SelectorLabels(storeName)))

		var sec corev1.Secret
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: counterstore.AuthSecretName(storeName)}, &sec)).To(Succeed())
		isOwned(&sec)
		password = string(sec.Data[counterstore.PasswordKey])
		Expect(password).To(HaveLen(64))
		Expect(sec.Data).To(HaveLen(1), "the admin password alone: the namespaces' users have Secrets of their own")

		Eventually(func(g Gomega) {
			cs := getStore(ctx, storeName)
			g.Expect(condStatus(cs, v1alpha1.ConditionReady)).To(Equal(metav1.ConditionFalse))
			g.Expect(cs.Status.AuthSecretName).To(Equal(config.StoreAuthSecret))
		}).WithTimeout(30 * time.Second).Should(Succeed())
	})

	It("forms a cluster from the Pods' addresses", func(ctx SpecContext) {
		created := k.syncStatefulSet(ctx)
		Expect(created).To(HaveLen(6))
		var wg sync.WaitGroup
		for _, name := range created {
			wg.Go(func() {
				defer GinkgoRecover()
				k.start(ctx, name, false)
			})
		}
		wg.Wait()
		lastReady := time.Now()

		Eventually(func() bool { return k.clusterOK(ctx) }).WithTimeout(60 * time.Second).WithPolling(20 * time.Millisecond).Should(BeTrue())
		clusterOK := time.Since(lastReady)
		Eventually(func(g Gomega) {
			cs := getStore(ctx, storeName)
			g.Expect(healthy(cs, 3, 1)).To(BeTrue(), describe(cs))
		}).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
		statusReady := time.Since(lastReady)
		AddReportEntry("last Pod Ready -> cluster_state:ok", clusterOK.Round(time.Millisecond).String())
		AddReportEntry("last Pod Ready -> CounterStore Ready, not Degraded", statusReady.Round(time.Millisecond).String())
		GinkgoWriter.Printf("formation: cluster_state:ok %v, status healthy %v after the last Pod turned Ready\n", clusterOK, statusReady)

		masters, replicas, nodes := topology(ctx, k)
		Expect(masters).To(HaveLen(3))
		Expect(replicas).To(HaveLen(3))
		cs := getStore(ctx, storeName)
		var masterAddrs []string
		for _, m := range masters {
			masterAddrs = append(masterAddrs, m.Addr)
			Expect(m.SlotCount()).To(BeNumerically("~", formation.NumSlots/3, 1))
		}
		Expect(cs.Status.Endpoints).To(ConsistOf(masterAddrs), "the endpoints are the masters")
		// Each replica replicates a master on another Kubernetes node.
		nodeOf := func(addr string) string {
			var pod corev1.Pod
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: counterstore.DefaultNamespace, Name: k.podAt(addr)}, &pod)).To(Succeed())
			return pod.Spec.NodeName
		}
		for _, r := range replicas {
			Expect(masters).To(HaveKey(r.MasterID))
			Expect(nodeOf(r.Addr)).NotTo(Equal(nodeOf(nodes[r.MasterID])), "replica %s and its master share a Kubernetes node", r.Addr)
		}
		writeKeys(ctx, "formed", 1000)
		checkKeys(ctx)
	})

	It("fails over a killed master, reports it, and repairs the cluster", func(ctx SpecContext) {
		cs := getStore(ctx, storeName)
		victim := cs.Status.Endpoints[0]
		pod := k.podAt(victim)
		Expect(pod).NotTo(BeEmpty())
		killed := time.Now()
		k.kill(ctx, pod)

		Eventually(func(g Gomega) {
			cs := getStore(ctx, storeName)
			g.Expect(condStatus(cs, v1alpha1.ConditionReady)).To(Equal(metav1.ConditionTrue), describe(cs))
			g.Expect(cs.Status.Endpoints).To(HaveLen(3))
			g.Expect(cs.Status.Endpoints).NotTo(ContainElement(victim), "the promoted replica replaces the dead master")
			g.Expect(cs.Status.Nodes.Primaries).To(BeEquivalentTo(3))
			g.Expect(condStatus(cs, v1alpha1.ConditionDegraded)).To(Equal(metav1.ConditionTrue), describe(cs))
			g.Expect(meta.FindStatusCondition(cs.Status.Conditions, v1alpha1.ConditionDegraded).Message).To(ContainSubstring(pod))
		}).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
		failover := time.Since(killed)
		checkKeys(ctx)

		// The kubelet restarts the container: same Pod, same IP, a new
		// node (the start script drops nodes.conf).
		restarted := time.Now()
		k.start(ctx, pod, false)
		Eventually(func(g Gomega) {
			cs := getStore(ctx, storeName)
			g.Expect(healthy(cs, 3, 1)).To(BeTrue(), describe(cs))
		}).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
		heal := time.Since(restarted)
		AddReportEntry("master killed -> status Ready with the promoted master", failover.Round(time.Millisecond).String())
		AddReportEntry("killed master's Pod back -> healed (not Degraded)", heal.Round(time.Millisecond).String())
		AddReportEntry("master killed -> healed, total", time.Since(killed).Round(time.Millisecond).String())
		GinkgoWriter.Printf("kill master: failover in status after %v; healed %v after the container restarted\n", failover, heal)

		masters, replicas, nodes := topology(ctx, k)
		Expect(masters).To(HaveLen(3))
		Expect(replicas).To(HaveLen(3))
		Expect(nodes).To(HaveLen(6))
		// The dead node is forgotten everywhere: every node knows 6.
		for _, c := range k.clients() {
			raw, err := c.ClusterNodes(ctx).Result()
			Expect(err).NotTo(HaveOccurred())
			Expect(strings.Count(strings.TrimSpace(raw), "\n")+1).To(Equal(6), "node %s still lists a forgotten node:\n%s", c.Options().Addr, raw)
		}
		checkKeys(ctx)
	})

	It("heals when a Pod comes back at a new address", func(ctx SpecContext) {
		cs := getStore(ctx, storeName)
		victim := cs.Status.Endpoints[1]
		pod := k.podAt(victim)
		Expect(pod).NotTo(BeEmpty())
		start := time.Now()
		k.recreate(ctx, pod)
		newAddr := k.addr(pod)
		Expect(newAddr).NotTo(Equal(victim))
		Eventually(func(g Gomega) {
			cs := getStore(ctx, storeName)
			g.Expect(healthy(cs, 3, 1)).To(BeTrue(), describe(cs))
			g.Expect(cs.Status.Endpoints).NotTo(ContainElement(victim))
		}).WithTimeout(45 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
		AddReportEntry("Pod recreated at a new address -> healed", time.Since(start).Round(time.Millisecond).String())
		_, _, nodes := topology(ctx, k)
		Expect(nodes).To(HaveLen(6))
		Expect(slices.Collect(maps.Values(nodes))).To(ContainElement(newAddr))
		checkKeys(ctx)
	})

	It("scales from 3 to 4 shards without losing a key or failing a namespace's sidecar", func(ctx SpecContext) {
		writeKeys(ctx, "before-scale", 2000)
		// A namespace's sidecar decides all along on keys of every slot:
		// the new master serves some of them from its first slot on, so
		// it must have the namespace's user and the counter functions
		// (which the user may not load) before it has any slot.
		tenant := "fg-" + rand.String(8)
		pw := namespaceUser(ctx, tenant)
		sidecar, err := redisstore.New(redisstore.Options{Addrs: getStore(ctx, storeName).Status.Endpoints, KeySpace: tenant,
			Username: counterstore.NamespaceUser(tenant), Password: pw, Timeout: 30 * time.Second, DialTimeout: 30 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(sidecar.Close)
		lim := limiter.Limit{Algorithm: limiter.GCRA, Requests: 1_000_000, Period: time.Hour}
		var decided, failed atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _, err := sidecar.Take(ctx, limiter.Request{Key: fmt.Sprintf("scale-%d", i%4096), Limit: lim, Cost: 1})
				decided.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
		Eventually(decided.Load).WithTimeout(30 * time.Second).Should(BeNumerically(">", 100))
		cs := getStore(ctx, storeName)
		cs.Spec.Managed.Shards = 4
		Expect(k8sClient.Update(ctx, cs)).To(Succeed())
		var created []string
		Eventually(func() []string {
			created = append(created, k.syncStatefulSet(ctx)...)
			return created
		}).WithTimeout(30 * time.Second).Should(HaveLen(2))
		start := time.Now()
		for _, name := range created {
			k.start(ctx, name, false)
		}
		Eventually(func(g Gomega) {
			cs := getStore(ctx, storeName)
			g.Expect(healthy(cs, 4, 1)).To(BeTrue(), describe(cs))
		}).WithTimeout(90 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		AddReportEntry(fmt.Sprintf("3 -> 4 shards with %d keys", len(keys)), time.Since(start).Round(time.Millisecond).String())
		masters, replicas, _ := topology(ctx, k)
		Expect(masters).To(HaveLen(4))
		Expect(replicas).To(HaveLen(4))
		for _, m := range masters {
			Expect(m.SlotCount()).To(Equal(formation.NumSlots / 4))
		}
		checkKeys(ctx)
		// The sidecar's store follows the new slot map: decisions on the
		// new master's slots have run there.
		before := decided.Load()
		Eventually(decided.Load).WithTimeout(30 * time.Second).Should(BeNumerically(">", before+4096))
		close(stop)
		<-done
		AddReportEntry("a namespace's sidecar through the scale", fmt.Sprintf("%d decisions, %d failed", decided.Load(), failed.Load()))
		Expect(failed.Load()).To(BeZero(), "a namespace's sidecar failed during the scale; first: %v", firstErr.Load())
	})

	It("gives a policy without a storeRef the default store", func(ctx SpecContext) {
		ns := "fg-" + rand.String(8)
		Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(k8sClient.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		})
		p := &v1alpha1.RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "per-user"},
			Spec: v1alpha1.RateLimitPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
				Rules: []v1alpha1.Rule{{
					Name:  "per-key",
					Key:   []v1alpha1.KeyPart{{Header: "X-API-Key"}},
					Limit: v1alpha1.Limit{Requests: 100, Per: metav1.Duration{Duration: time.Minute}},
				}},
			},
		}
		Expect(p.Spec.StoreRef).To(BeNil())
		Expect(k8sClient.Create(ctx, p)).To(Succeed())

		cs := getStore(ctx, storeName)
		Eventually(func(g Gomega) {
			var cm corev1.ConfigMap
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.ConfigMapName}, &cm)).To(Succeed())
			doc, err := config.Parse([]byte(cm.Data[config.DataKey]))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(doc.Store.Name).To(Equal(storeName))
			g.Expect(doc.Store.Type).To(Equal(config.StoreRedis))
			g.Expect(doc.Store.Addresses).To(ConsistOf(cs.Status.Endpoints))
			g.Expect(doc.Store.AuthSecretName).To(Equal(config.StoreAuthSecret), "the sidecars' own copy, which the sidecar access controller keeps")
		}).WithTimeout(30 * time.Second).Should(Succeed())

		// The store controller copies no Secret into the namespace: the
		// sidecars get one copy, of the sidecar user's credentials only.
		Consistently(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: counterstore.AuthSecretName(storeName)}, &corev1.Secret{}))
		}).WithTimeout(2 * time.Second).Should(BeTrue())

		By("admitting the injected pods of the namespace, and of no other, through the store's NetworkPolicy")
		sidecarNamespaces := func(g Gomega) []string {
			var np networkingv1.NetworkPolicy
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: counterstore.DefaultNamespace, Name: counterstore.ObjectName(storeName)}, &np)).To(Succeed())
			g.Expect(np.Spec.Ingress).NotTo(BeEmpty())
			for _, peer := range np.Spec.Ingress[0].From {
				if peer.NamespaceSelector == nil {
					continue
				}
				g.Expect(peer.PodSelector.MatchLabels).To(Equal(map[string]string{"floodgate.dev/injected": "true"}))
				g.Expect(peer.NamespaceSelector.MatchExpressions).To(HaveLen(1))
				e := peer.NamespaceSelector.MatchExpressions[0]
				g.Expect(e.Key).To(Equal("kubernetes.io/metadata.name"))
				g.Expect(e.Operator).To(Equal(metav1.LabelSelectorOpIn))
				return e.Values
			}
			return nil
		}
		Eventually(sidecarNamespaces).WithTimeout(30 * time.Second).Should(ContainElement(ns))
		// A namespace that names the store in a ConfigMap of its own, not
		// the policy controller's, is not admitted.
		other := "fg-" + rand.String(8)
		Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}})).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(k8sClient.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}})).To(Succeed())
		})
		var cm corev1.ConfigMap
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.ConfigMapName}, &cm)).To(Succeed())
		Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: config.ConfigMapName}, Data: cm.Data})).To(Succeed())
		Consistently(sidecarNamespaces).WithTimeout(2 * time.Second).ShouldNot(ContainElement(other))

		By("closing the store to the namespace once no policy of it uses the store")
		Expect(k8sClient.Delete(ctx, p)).To(Succeed())
		Eventually(sidecarNamespaces).WithTimeout(30 * time.Second).ShouldNot(ContainElement(ns))
	})

	It("scales back to 3 shards, draining the leaving Pods first", func(ctx SpecContext) {
		cs := getStore(ctx, storeName)
		cs.Spec.Managed.Shards = 3
		Expect(k8sClient.Update(ctx, cs)).To(Succeed())
		start := time.Now()
		// The StatefulSet keeps its 8 Pods until the leaving ones hold no
		// slot; the fake StatefulSet controller then deletes them.
		Eventually(func(g Gomega) {
			var sts appsv1.StatefulSet
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: counterstore.DefaultNamespace, Name: counterstore.ObjectName(storeName)}, &sts)).To(Succeed())
			if *sts.Spec.Replicas == 8 {
				masters, _, _ := topology(ctx, k)
				g.Expect(masters).To(HaveLen(3), "still draining")
			}
			g.Expect(*sts.Spec.Replicas).To(BeEquivalentTo(6))
		}).WithTimeout(90 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		masters, _, _ := topology(ctx, k)
		for _, name := range []string{counterstore.ObjectName(storeName) + "-6", counterstore.ObjectName(storeName) + "-7"} {
			for _, m := range masters {
				Expect(m.Addr).NotTo(Equal(k.addr(name)), "leaving Pod %s still serves slots", name)
			}
		}
		checkKeys(ctx)
		k.syncStatefulSet(ctx)
		Eventually(func(g Gomega) {
			cs := getStore(ctx, storeName)
			g.Expect(healthy(cs, 3, 1)).To(BeTrue(), describe(cs))
		}).WithTimeout(60 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		AddReportEntry("4 -> 3 shards, drained and forgotten", time.Since(start).Round(time.Millisecond).String())
		_, _, nodes := topology(ctx, k)
		Expect(nodes).To(HaveLen(6))
		checkKeys(ctx)
	})

	It("keeps sidecars counting together when every Redis Pod is replaced at once", func(ctx SpecContext) {
		ns := "fg-" + rand.String(8)
		Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(k8sClient.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		})
		p := &v1alpha1.RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shared"},
			Spec: v1alpha1.RateLimitPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
				Rules: []v1alpha1.Rule{{
					Name:        "per-key",
					Key:         []v1alpha1.KeyPart{{Header: "X-API-Key"}},
					Limit:       v1alpha1.Limit{Requests: 2, Per: metav1.Duration{Duration: time.Hour}},
					FailureMode: v1alpha1.FailureModeClosed,
				}},
			},
		}
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		var before []string
		Eventually(func(g Gomega) {
			var cm corev1.ConfigMap
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.ConfigMapName}, &cm)).To(Succeed())
			doc, err := config.Parse([]byte(cm.Data[config.DataKey]))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(doc.Store.Addresses).NotTo(BeEmpty())
			before = doc.Store.Addresses
		}).WithTimeout(30 * time.Second).Should(Succeed())

		// A generous call budget: this spec measures how soon counting
		// resumes, and a loaded machine must not turn a slow answer into
		// a 503.
		creds := map[string]string{"password": namespaceUser(ctx, ns), "username": counterstore.NamespaceUser(ns)}
		a := startSidecar(ctx, ns, "api-a", creds, "--redis-timeout=1s", "--redis-breaker-cooldown=200ms")
		b := startSidecar(ctx, ns, "api-b", creds, "--redis-timeout=1s", "--redis-breaker-cooldown=200ms")
		Eventually(func() []int { return shared(a, b, "warm-"+rand.String(6)) }).WithTimeout(30 * time.Second).
			Should(Equal([]int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests}))

		By("deleting every Redis Pod at once; the StatefulSet and the kubelet bring them back at new IPs, empty")
		var pods corev1.PodList
		Expect(k8sClient.List(ctx, &pods, client.InNamespace(counterstore.DefaultNamespace), client.MatchingLabels(counterstore.SelectorLabels(storeName)))).To(Succeed())
		Expect(pods.Items).To(HaveLen(6))
		deleted := time.Now()
		var wg sync.WaitGroup
		for _, pod := range pods.Items {
			wg.Go(func() {
				defer GinkgoRecover()
				k.recreate(ctx, pod.Name)
			})
		}
		wg.Wait()
		// The Pods are back, Ready at new IPs: the event the controllers
		// and sidecars react to. How long the fake kubelet took to bring
		// six redis-servers up on this machine is reported, not bounded.
		back := time.Now()
		recreated := back.Sub(deleted)

		// Counting resumed by the first attempt that shows it: by when
		// that attempt began (its own requests take time too).
		var resumed time.Duration
		var attempts int
		Eventually(func() []int {
			attempts++
			began := time.Now()
			got := shared(a, b, fmt.Sprintf("after-%d", attempts))
			resumed = began.Sub(back)
			return got
		}).WithTimeout(2 * time.Minute).WithPolling(100 * time.Millisecond).
			Should(Equal([]int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests}))
		nodeTimeout := getStore(ctx, storeName).Spec.Managed.NodeTimeout.Duration
		AddReportEntry("every Redis Pod replaced and back -> sidecars count together again (bound nodeTimeout + 10s)",
			fmt.Sprintf("%v after the Pods were back (they took %v to come back); bound %v", resumed.Round(time.Millisecond), recreated.Round(time.Millisecond), nodeTimeout+10*time.Second))
		Expect(resumed).To(BeNumerically("<=", nodeTimeout+10*time.Second), "from the Pods' return to shared counting")

		cs := getStore(ctx, storeName)
		Expect(cs.Status.Endpoints).NotTo(ContainElements(before), "the masters are new Pods at new IPs")
		for _, s := range []*sidecar{a, b} {
			Expect(s.Status().Store.Addresses).To(ConsistOf(cs.Status.Endpoints), "the sidecar follows the published masters")
			Expect(s.Status().StoreDrift).To(BeEmpty())
		}
	})

	It("gives a namespace its own store user and the counter functions, and deletes the user with its Secret", func(ctx SpecContext) {
		tenant := "fg-" + rand.String(8)
		pw := namespaceUser(ctx, tenant)
		user := counterstore.NamespaceUser(tenant)
		libName, _ := redislayout.Library()
		for _, c := range k.clients() {
			Expect(c.Do(ctx, "acl", "getuser", user).Val()).NotTo(BeNil(), "node %s has %s", c.Options().Addr, user)
			// Every node has the library: the masters loaded by the
			// manager, the replicas by replication.
			Eventually(func() ([]redis.Library, error) {
				return c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: libName}).Result()
			}).WithTimeout(30*time.Second).Should(HaveLen(1), "node %s has the library %s", c.Options().Addr, libName)
		}
		st, err := redisstore.New(redisstore.Options{Addrs: getStore(ctx, storeName).Status.Endpoints, Username: user, Password: pw, KeySpace: tenant, Timeout: 5 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(st.Close)
		l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 2, Period: time.Hour}
		Eventually(func() error {
			_, _, err := st.Take(ctx, limiter.Request{Key: "own-user", Limit: l, Cost: 1})
			return err
		}).WithTimeout(30 * time.Second).Should(Succeed())
		other, err := redisstore.New(redisstore.Options{Addrs: getStore(ctx, storeName).Status.Endpoints, Username: user, Password: pw, KeySpace: "fg-other", Timeout: 5 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(other.Close)
		_, _, err = other.Take(ctx, limiter.Request{Key: "own-user", Limit: l, Cost: 1})
		Expect(err).To(MatchError(ContainSubstring("NOPERM")), "another namespace's keys")

		By("deleting the user's Secret, as the sidecaraccess controller does when the namespace needs no access")
		sec := counterstore.NewUserSecret(getStore(ctx, storeName), counterstore.DefaultNamespace, tenant)
		Expect(k8sClient.Delete(ctx, sec)).To(Succeed())
		Eventually(func(g Gomega) {
			for _, c := range k.clients() {
				g.Expect(c.Do(ctx, "acl", "getuser", user).Val()).To(BeNil(), "node %s still has %s", c.Options().Addr, user)
			}
		}).WithTimeout(30 * time.Second).Should(Succeed())
	})

	It("rotates a namespace's password on the running nodes, the old one accepted until every sidecar has the new one, and fails no call of another namespace", func(ctx SpecContext) {
		tenant := "fg-" + rand.String(8)
		sidecarPassword := namespaceUser(ctx, tenant)
		user := counterstore.NamespaceUser(tenant)
		masters := func() []string {
			GinkgoHelper()
			return getStore(ctx, storeName).Status.Endpoints
		}
		// Every call answers within budget of its start, plus what the
		// machine measurably delayed it and the Redis nodes by
		// (test/lateness), and none is refused. The stores' own call and
		// dial deadlines are hang bounds only, so that a call the machine
		// held past the budget is measured, not cut short and counted as
		// failed.
		const budget = time.Second
		// A sidecar's store: it reads its password for every new
		// connection, from what the kubelet last wrote into its volume.
		// Each read is recorded (dials).
		var mu sync.Mutex
		volume := sidecarPassword
		type dial struct {
			at       time.Time
			password string
		}
		var dials []dial
		newStore := func() *redisstore.Store {
			GinkgoHelper()
			st, err := redisstore.New(redisstore.Options{
				Addrs: masters(), Timeout: 30 * time.Second, DialTimeout: 30 * time.Second, KeySpace: tenant,
				Credentials: func() (string, string) {
					mu.Lock()
					defer mu.Unlock()
					dials = append(dials, dial{at: time.Now(), password: volume})
					return user, volume
				},
			})
			Expect(err).NotTo(HaveOccurred())
			return st
		}
		dialledWith := func(pw string, after time.Time) bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.ContainsFunc(dials, func(d dial) bool { return d.password == pw && d.at.After(after) })
		}
		l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1_000_000, Period: time.Hour}
		// Two sidecars: one keeps its connections through the rotation;
		// the other starts afresh every 300ms (as sidecars of new pods
		// do), so that it authenticates again and again.
		steady := newStore()
		DeferCleanup(steady.Close)
		Eventually(func() error {
			_, _, err := steady.Take(ctx, limiter.Request{Key: "rotation-warm", Limit: l, Cost: 1})
			return err
		}).WithTimeout(30 * time.Second).Should(Succeed())
		// Another namespace's sidecars, which also connect afresh every
		// 300ms: the rotation is not theirs, and fails none of their calls.
		otherTenant := "fg-" + rand.String(8)
		otherPassword := namespaceUser(ctx, otherTenant)
		newOther := func() *redisstore.Store {
			GinkgoHelper()
			st, err := redisstore.New(redisstore.Options{
				Addrs: masters(), Timeout: 30 * time.Second, DialTimeout: 30 * time.Second, KeySpace: otherTenant,
				Username: counterstore.NamespaceUser(otherTenant), Password: otherPassword,
			})
			Expect(err).NotTo(HaveOccurred())
			return st
		}
		// Every call, by the steady store or by a fresh one (born when),
		// or by the other namespace's.
		type call struct {
			at    time.Time
			took  time.Duration
			fresh bool
			other bool
			born  time.Time
			err   error
		}
		var callsMu sync.Mutex
		var calls []call
		answeredSince := func(since time.Time) (steadyOK, freshOK bool) {
			callsMu.Lock()
			defer callsMu.Unlock()
			for _, c := range calls {
				if c.err == nil && c.at.After(since) {
					steadyOK = steadyOK || (!c.fresh && !c.other)
					freshOK = freshOK || (c.fresh && c.born.After(since))
				}
			}
			return steadyOK, freshOK
		}
		probe := lateness.Start(lateness.Options{Sleep: budget, PIDs: k.pids()})
		DeferCleanup(probe.End)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(done)
			fresh, born := newStore(), time.Now()
			other := newOther()
			defer func() { _ = fresh.Close(); _ = other.Close() }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if time.Since(born) > 300*time.Millisecond {
					_ = fresh.Close()
					_ = other.Close()
					fresh, other, born = newStore(), newOther(), time.Now()
				}
				for j, st := range []*redisstore.Store{steady, fresh, other} {
					at := time.Now()
					_, _, err := st.Take(ctx, limiter.Request{Key: fmt.Sprintf("rotation-%d", i%50), Limit: l, Cost: 1})
					c := call{at: at, took: time.Since(at), fresh: j == 1, other: j == 2, born: born, err: err}
					callsMu.Lock()
					calls = append(calls, c)
					callsMu.Unlock()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		admin := func() []*redis.Client { return k.clients() }

		By("asking for a rotation on the namespace's user Secret")
		key := client.ObjectKey{Namespace: counterstore.DefaultNamespace, Name: counterstore.UserSecretName(storeName, tenant)}
		var sec corev1.Secret
		Expect(k8sClient.Get(ctx, key, &sec)).To(Succeed())
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		sec.Annotations[counterstore.RotateAnnotation] = "rotation-1"
		Expect(k8sClient.Update(ctx, &sec)).To(Succeed())
		rotated := time.Now()
		var next string
		var expires time.Time
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, key, &sec)).To(Succeed())
			g.Expect(sec.Annotations).To(HaveKeyWithValue(counterstore.RotatedAnnotation, "rotation-1"))
			g.Expect(string(sec.Data[counterstore.PreviousUserPasswordKey])).To(Equal(sidecarPassword))
			next = string(sec.Data[counterstore.UserPasswordKey])
			var err error
			expires, err = time.Parse(time.RFC3339, sec.Annotations[counterstore.PreviousExpiresAnnotation])
			g.Expect(err).NotTo(HaveOccurred(), "the old password's expiry")
		}).WithTimeout(30 * time.Second).Should(Succeed())
		// The rotation is published: the event the kubelet reacts to. The
		// controller drops the old password on the nodes only once the
		// overlap has passed: at expires or after.
		published := time.Now()
		Expect(next).NotTo(Equal(sidecarPassword))
		var auth corev1.Secret
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: counterstore.DefaultNamespace, Name: counterstore.AuthSecretName(storeName)}, &auth)).To(Succeed())
		Expect(string(auth.Data[counterstore.PasswordKey])).To(Equal(password), "the admin password does not change")
		// A new connection to node addr as the sidecar user with pw.
		authAs := func(addr, pw string) error {
			c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: pw, Protocol: 2, MaxRetries: -1, DisableIdentity: true})
			defer func() { _ = c.Close() }()
			return c.Ping(ctx).Err()
		}
		// Published only once every node accepts both. A refusal of the
		// old password that came at or after its expiry is the overlap
		// ending, not a failure: only a machine that held this check past
		// the overlap sees one.
		var lateChecks []string
		for _, c := range admin() {
			for _, pw := range []string{sidecarPassword, next} {
				err := authAs(c.Options().Addr, pw)
				if pw == sidecarPassword && err != nil && strings.Contains(err.Error(), "WRONGPASS") && !time.Now().Before(expires) {
					lateChecks = append(lateChecks, c.Options().Addr)
					continue
				}
				Expect(err).To(Succeed(), "node %s, while the two passwords overlap (until %v, %v after the rotation)", c.Options().Addr, expires, expires.Sub(rotated))
			}
		}

		By("playing the kubelet: the sidecar's volume gets the new password once a sidecar has connected with the old one since it was published")
		Eventually(func() bool { return dialledWith(sidecarPassword, published) }).WithTimeout(30*time.Second).WithPolling(10*time.Millisecond).
			Should(BeTrue(), "a fresh store connecting with the old password after the rotation was published")
		mu.Lock()
		volume = next
		switched := time.Now()
		mu.Unlock()

		By("dropping the old password once the overlap has passed")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, key, &sec)).To(Succeed())
			g.Expect(sec.Data).NotTo(HaveKey(counterstore.PreviousUserPasswordKey))
			g.Expect(sec.Annotations).NotTo(HaveKey(counterstore.PreviousExpiresAnnotation))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		dropped := time.Now()
		ended := dropped.Sub(rotated)
		// Calls go on after the old password is gone: a store that
		// connected afresh since, with the new one, and the steady one
		// have answered calls made after it; and more than 100 calls have
		// been made through the rotation, however slowly the machine ran
		// them.
		Eventually(func() bool {
			steadyOK, freshOK := answeredSince(dropped)
			callsMu.Lock()
			made := len(calls)
			callsMu.Unlock()
			return steadyOK && freshOK && dialledWith(next, dropped) && made > 100
		}).WithTimeout(30*time.Second).WithPolling(10*time.Millisecond).
			Should(BeTrue(), "calls answered, on the steady store and on one born since, after the old password was dropped, and more than 100 in all")
		close(stop)
		<-done
		probe.End()
		for _, c := range admin() {
			Expect(authAs(c.Options().Addr, sidecarPassword)).To(MatchError(ContainSubstring("WRONGPASS")), "node %s still takes the old password", c.Options().Addr)
			Expect(authAs(c.Options().Addr, next)).To(Succeed())
		}

		// Each call is judged from its own start: refused, failed, or
		// slower than its budget by more than the machine's delays over
		// it (this process's and the Redis nodes'). Two failures are not
		// the rotation's:
		//   - a refusal of a call that read the old password before the
		//     kubelet's switch and ended at or after the old password's
		//     expiry: only a machine that held the test past the overlap
		//     makes the switch that late, and then it is the overlap
		//     ending;
		//   - an error that is no refusal (a timeout of the store's
		//     own, below its hang bounds) in a call the machine held for
		//     a whole budget.
		var failures, excused []string
		var slowest time.Duration
		for _, c := range calls {
			end := c.at.Add(c.took)
			slowest = max(slowest, c.took)
			which := "the steady store"
			switch {
			case c.fresh:
				which = "a fresh store"
			case c.other:
				which = "another namespace's fresh store"
			}
			what := fmt.Sprintf("%s, %v after the rotation, took %v", which, c.at.Sub(rotated).Round(time.Millisecond), c.took)
			if c.err == nil && c.took <= budget {
				continue
			}
			late := probe.Excuse(c.at, c.took) + probe.During(c.at, end).Others
			if c.err != nil {
				refused := strings.Contains(c.err.Error(), "WRONGPASS") || strings.Contains(c.err.Error(), "NOAUTH")
				switch {
				case refused && !c.other && !switched.Before(expires) && c.at.Before(switched) && !end.Before(expires):
					excused = append(excused, fmt.Sprintf("%s: %v", what, c.err))
				case !refused && late >= budget:
					excused = append(excused, fmt.Sprintf("%s, held %v by the machine: %v", what, late, c.err))
				default:
					failures = append(failures, fmt.Sprintf("%s (the machine's delays over it %v): %v", what, late, c.err))
				}
				continue
			}
			if c.took > budget+late {
				failures = append(failures, fmt.Sprintf("%s: more than its budget %v and the machine's delays over it, %v", what, budget, late))
			}
		}
		othersMade := 0
		for _, c := range calls {
			if c.other {
				othersMade++
			}
		}
		AddReportEntry("namespace password rotation",
			fmt.Sprintf("%d calls (%d of them another namespace's; the slowest %v), %d failed, a client of each namespace reconnecting every 300ms; the kubelet switched %v after the request, the old password expired %v and was dropped %v after it (overlap %v)",
				len(calls), othersMade, slowest.Round(time.Millisecond), len(failures), switched.Sub(rotated).Round(time.Millisecond), expires.Sub(rotated).Round(time.Millisecond), ended.Round(time.Millisecond), passwordOverlap))
		if len(lateChecks)+len(excused) > 0 {
			AddReportEntry("namespace password rotation: what the machine's delays explain",
				fmt.Sprintf("nodes refusing the old password when checked after its expiry: %v; the kubelet's switch %v after the expiry; calls not counted: %v",
					lateChecks, switched.Sub(expires).Round(time.Millisecond), excused))
		}
		Expect(failures).To(BeEmpty(), "%d of %d calls failed during the rotation", len(failures), len(calls))
		Expect(len(calls)).To(BeNumerically(">", 100))
		Expect(othersMade).To(BeNumerically(">", 30), "the other namespace's calls through the rotation")
	})
})
