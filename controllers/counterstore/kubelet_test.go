package counterstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// kubelet plays, for one managed store, the parts of Kubernetes that
// envtest lacks: the StatefulSet controller (it creates the Pods
// <sts>-<ordinal> from the template, and deletes those past the replica
// count) and the kubelet (it runs each Pod's container command, the real
// start script, with the env the Pod spec declares, on a loopback IP of its
// own, and reports the Pod's IP and readiness). The volumes are mounted the
// way a kubelet would: the ConfigMap's redis.conf in a config dir, an empty
// data dir, both at their own paths instead of /etc/redis and /data.
type kubelet struct {
	ns, store, sts string
	dir            string

	mu    sync.Mutex
	pods  map[string]*container
	hosts []*redistest.Host
}

// container is a Pod's container: the start script's redis-server on the
// Pod's IP.
type container struct {
	host *redistest.Host
	proc *redistest.Server
	data string
}

func newKubelet(store, dir string) *kubelet {
	return &kubelet{ns: counterstore.DefaultNamespace, store: store, sts: counterstore.ObjectName(store), dir: dir, pods: map[string]*container{}}
}

// syncStatefulSet creates the Pods the StatefulSet wants and deletes the
// ones past its replica count (stopping their containers). It returns the
// names of the Pods it created.
func (k *kubelet) syncStatefulSet(ctx context.Context) []string {
	GinkgoHelper()
	var sts appsv1.StatefulSet
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: k.sts}, &sts)).To(Succeed())
	replicas := int(ptr.Deref(sts.Spec.Replicas, 1))
	var created []string
	for i := range replicas {
		name := k.sts + "-" + strconv.Itoa(i)
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: name}, &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			k.createPod(ctx, &sts, i)
			created = append(created, name)
			continue
		}
		Expect(err).NotTo(HaveOccurred())
	}
	var pods corev1.PodList
	Expect(k8sClient.List(ctx, &pods, client.InNamespace(k.ns), client.MatchingLabels(counterstore.SelectorLabels(k.store)))).To(Succeed())
	for i := range pods.Items {
		p := &pods.Items[i]
		ord, err := strconv.Atoi(strings.TrimPrefix(p.Name, k.sts+"-"))
		if err == nil && ord >= replicas {
			k.stop(p.Name)
			Expect(k8sClient.Delete(ctx, p, client.GracePeriodSeconds(0))).To(Succeed())
		}
	}
	return created
}

// createPod creates Pod ordinal i from the StatefulSet's template, on one
// of three fake Kubernetes nodes, as the scheduler would spread them.
func (k *kubelet) createPod(ctx context.Context, sts *appsv1.StatefulSet, i int) {
	GinkgoHelper()
	tmpl := sts.Spec.Template
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        k.sts + "-" + strconv.Itoa(i),
			Namespace:   k.ns,
			Labels:      tmpl.Labels,
			Annotations: tmpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: *tmpl.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = "node-" + strconv.Itoa(i%3)
	pod.Spec.Hostname = pod.Name
	pod.Spec.Subdomain = sts.Spec.ServiceName
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
}

// start runs the Pod's container (again) and marks the Pod Running and
// Ready with its IP. With newHost the Pod gets a new IP, as a recreated Pod
// does.
func (k *kubelet) start(ctx context.Context, name string, newHost bool) {
	GinkgoHelper()
	var pod corev1.Pod
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: name}, &pod)).To(Succeed())
	conf, secret := k.volumes(ctx)
	password := string(secret[counterstore.PasswordKey])

	k.mu.Lock()
	c := k.pods[name]
	if c == nil {
		c = &container{data: filepath.Join(k.dir, name, "data")}
		k.pods[name] = c
	}
	k.mu.Unlock()
	if c.proc != nil && c.proc.Running() {
		Fail(fmt.Sprintf("container of %s is still running", name))
	}
	if c.host == nil || newHost {
		h, err := redistest.NewHost(counterstore.RedisPort)
		Expect(err).NotTo(HaveOccurred())
		k.mu.Lock()
		k.hosts = append(k.hosts, h)
		k.mu.Unlock()
		c.host = h
	}
	confDir := filepath.Join(k.dir, name, "config")
	Expect(os.MkdirAll(confDir, 0o755)).To(Succeed())
	Expect(os.MkdirAll(c.data, 0o755)).To(Succeed())
	// The data volume is mounted at c.data instead of /data.
	conf = strings.ReplaceAll(conf, " /data", " "+c.data)
	Expect(os.WriteFile(filepath.Join(confDir, "redis.conf"), []byte(conf), 0o644)).To(Succeed())

	ctr := pod.Spec.Containers[0]
	Expect(ctr.Command).To(HaveLen(3))
	Expect(ctr.Command[:2]).To(Equal([]string{"sh", "-c"}))
	Expect(ctr.Command[2]).To(Equal(counterstore.StartScript("/etc/redis", "/data")),
		"the Pod runs the start script; the test runs the same one with its own mount paths")
	env := k.env(ctr, c.host.IP, secret)
	proc, err := redistest.NewServer(redistest.ServerOptions{
		Host: c.host.IP, Port: counterstore.RedisPort, Password: password,
		Command: []string{"sh", "-c", counterstore.StartScript(confDir, c.data)}, Env: env,
	})
	Expect(err).NotTo(HaveOccurred())
	k.mu.Lock()
	c.proc = proc
	k.mu.Unlock()

	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		PodIP:     c.host.IP,
		PodIPs:    []corev1.PodIP{{IP: c.host.IP}},
		HostIP:    "10.0.0.1",
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	Expect(k8sClient.Status().Update(ctx, &pod)).To(Succeed())
}

// env resolves the container's env the way the kubelet does: the Pod IP
// from the downward API, the passwords from the Secret (an optional key
// that is missing sets nothing).
func (k *kubelet) env(ctr corev1.Container, ip string, secret map[string][]byte) []string {
	GinkgoHelper()
	var env []string
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env = append(env, e.Name+"="+ip)
		case e.ValueFrom.SecretKeyRef != nil:
			Expect(e.ValueFrom.SecretKeyRef.Name).To(Equal(counterstore.AuthSecretName(k.store)))
			v, ok := secret[e.ValueFrom.SecretKeyRef.Key]
			if !ok {
				Expect(ptr.Deref(e.ValueFrom.SecretKeyRef.Optional, false)).To(BeTrue(), "env %s: the Secret has no key %s", e.Name, e.ValueFrom.SecretKeyRef.Key)
				continue
			}
			env = append(env, e.Name+"="+string(v))
		default:
			Fail("unexpected env source for " + e.Name)
		}
	}
	return env
}

// volumes returns the store's redis.conf and credentials as the Pod sees
// them.
func (k *kubelet) volumes(ctx context.Context) (conf string, secret map[string][]byte) {
	GinkgoHelper()
	var cm corev1.ConfigMap
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: counterstore.ConfigMapName(k.store)}, &cm)).To(Succeed())
	var sec corev1.Secret
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: counterstore.AuthSecretName(k.store)}, &sec)).To(Succeed())
	return cm.Data["redis.conf"], sec.Data
}

// kill kills a Pod's container and marks the Pod not Ready, as the
// kubelet does when a container dies.
func (k *kubelet) kill(ctx context.Context, name string) {
	GinkgoHelper()
	k.stop(name)
	var pod corev1.Pod
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: name}, &pod)).To(Succeed())
	for i := range pod.Status.Conditions {
		if t := pod.Status.Conditions[i].Type; t == corev1.PodReady || t == corev1.ContainersReady {
			pod.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	Expect(k8sClient.Status().Update(ctx, &pod)).To(Succeed())
}

// recreate deletes a Pod and creates it again, as the StatefulSet
// controller does after an eviction; the new Pod gets a new IP.
func (k *kubelet) recreate(ctx context.Context, name string) {
	GinkgoHelper()
	k.stop(name)
	var pod corev1.Pod
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: name}, &pod)).To(Succeed())
	Expect(k8sClient.Delete(ctx, &pod, client.GracePeriodSeconds(0))).To(Succeed())
	Eventually(func() bool {
		return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: name}, &corev1.Pod{}))
	}).WithTimeout(30 * time.Second).Should(BeTrue())
	k.mu.Lock()
	if c := k.pods[name]; c != nil {
		// A new Pod has a new emptyDir.
		Expect(os.RemoveAll(c.data)).To(Succeed())
	}
	k.mu.Unlock()
	var sts appsv1.StatefulSet
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: k.sts}, &sts)).To(Succeed())
	ord, err := strconv.Atoi(strings.TrimPrefix(name, k.sts+"-"))
	Expect(err).NotTo(HaveOccurred())
	k.createPod(ctx, &sts, ord)
	k.start(ctx, name, true)
}

// shutdown stops every container and releases the loopback IPs.
func (k *kubelet) shutdown() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.pods {
		if c.proc != nil {
			c.proc.Close()
		}
	}
	for _, h := range k.hosts {
		h.Release()
	}
}

func (k *kubelet) stop(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if c := k.pods[name]; c != nil && c.proc != nil {
		c.proc.Close()
	}
}

// addr returns a running Pod's address, "" when it runs no container.
func (k *kubelet) addr(name string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if c := k.pods[name]; c != nil && c.proc != nil && c.proc.Running() {
		return c.proc.Addr()
	}
	return ""
}

// podAt returns the name of the Pod running at addr.
func (k *kubelet) podAt(addr string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, c := range k.pods {
		if c.proc != nil && c.proc.Running() && c.proc.Addr() == addr {
			return name
		}
	}
	return ""
}

// clients returns an admin client for every running container.
func (k *kubelet) clients() []*redis.Client {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*redis.Client
	for _, c := range k.pods {
		if c.proc != nil && c.proc.Running() {
			out = append(out, c.proc.Client())
		}
	}
	return out
}

// pids returns the process IDs of the running containers' redis-servers
// (the start script execs it), for a lateness probe to watch.
func (k *kubelet) pids() []int {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []int
	for _, c := range k.pods {
		if c.proc != nil {
			if pid := c.proc.Pid(); pid > 0 {
				out = append(out, pid)
			}
		}
	}
	return out
}

// clusterOK reports whether every running node says cluster_state:ok with
// all slots ok.
func (k *kubelet) clusterOK(ctx context.Context) bool {
	cs := k.clients()
	if len(cs) == 0 {
		return false
	}
	for _, c := range cs {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := c.ClusterInfo(ctx).Result()
		cancel()
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return false
		}
	}
	return true
}
