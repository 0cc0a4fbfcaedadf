package policy_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// newStore creates a managed CounterStore with a unique name and, when
// ready, marks it Ready with endpoints as the store controller would. It is
// deleted after the spec.
func newStore(ctx context.Context, ready bool) string {
	cs := &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: "store-" + rand.String(8)},
		Spec:       v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{}},
	}
	Expect(k8sClient.Create(ctx, cs)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cs))).To(Succeed())
	})
	if ready {
		setStoreReady(ctx, cs.Name, true)
	}
	return cs.Name
}

// newStoreNamed creates a Ready managed CounterStore with the given name,
// deleted after the spec.
func newStoreNamed(ctx context.Context, name string) {
	cs := &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.CounterStoreSpec{Managed: &v1alpha1.ManagedStore{}},
	}
	Expect(k8sClient.Create(ctx, cs)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, cs))).To(Succeed())
	})
	setStoreReady(ctx, name, true)
}

// setStoreReady sets the store's Ready condition, endpoints and auth Secret.
func setStoreReady(ctx context.Context, name string, ready bool) {
	var cs v1alpha1.CounterStore
	Expect(k8sClient.Get(ctx, client.ObjectKey{Name: name}, &cs)).To(Succeed())
	status := metav1.ConditionFalse
	cs.Status.Endpoints = nil
	if ready {
		status = metav1.ConditionTrue
		cs.Status.Endpoints = []string{name + "-1.floodgate-system.svc:6379", name + "-0.floodgate-system.svc:6379"}
		cs.Status.AuthSecretName = name + "-auth"
		cs.Status.SlotsCovered = v1alpha1.RedisClusterSlots
	}
	meta.SetStatusCondition(&cs.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: status, Reason: "Test", Message: "set by the test",
		ObservedGeneration: cs.Generation,
	})
	Expect(k8sClient.Status().Update(ctx, &cs)).To(Succeed())
}

// newPolicy returns a valid policy selecting app=api that uses store.
func newPolicy(ns, name, store string) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
			StoreRef:    &v1alpha1.StoreReference{Name: store},
			Rules: []v1alpha1.Rule{{
				Name:  "per-ip",
				Match: &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchPrefix, Value: "/api"}},
				Key:   []v1alpha1.KeyPart{{ClientIP: &v1alpha1.ClientIPKey{}}},
				Limit: v1alpha1.Limit{Requests: 10, Per: metav1.Duration{Duration: time.Second}},
			}},
		},
	}
}

// updatePolicy changes a policy's spec, retrying when the controller's
// status writes race with it.
func updatePolicy(ctx context.Context, ns, name string, mutate func(*v1alpha1.RateLimitPolicy)) *v1alpha1.RateLimitPolicy {
	var p v1alpha1.RateLimitPolicy
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		mutate(&p)
		return k8sClient.Update(ctx, &p)
	})).To(Succeed())
	return &p
}

// createPod creates a pod with labels; it is not Ready until setPodReady.
func createPod(ctx context.Context, ns, name string, labels map[string]string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "registry.invalid/app:1",
		}}},
	}
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	return pod
}

// setPodReady sets the pod Running with its Ready condition through the
// status subresource, as the kubelet would.
func setPodReady(ctx context.Context, ns, name string, ready bool) {
	var pod corev1.Pod
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pod)).To(Succeed())
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	Expect(k8sClient.Status().Update(ctx, &pod)).To(Succeed())
}

// compiled returns the namespace's parsed document and its ConfigMap.
func compiled(ctx context.Context, ns string) (*config.Config, *corev1.ConfigMap, error) {
	var cm corev1.ConfigMap
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.ConfigMapName}, &cm); err != nil {
		return nil, nil, err
	}
	c, err := config.Load([]byte(cm.Data[config.DataKey]))
	if err != nil {
		return nil, &cm, fmt.Errorf("the sidecar would reject the ConfigMap: %w", err)
	}
	return c, &cm, nil
}

// configMapGone reports whether the namespace has no ConfigMap.
func configMapGone(ctx context.Context, ns string) func() bool {
	return func() bool {
		var cm corev1.ConfigMap
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.ConfigMapName}, &cm)
		return apierrors.IsNotFound(err)
	}
}

// policyStatus fetches a policy from the API server.
func policyStatus(ctx context.Context, ns, name string) func(g Gomega) *v1alpha1.RateLimitPolicy {
	return func(g Gomega) *v1alpha1.RateLimitPolicy {
		var p v1alpha1.RateLimitPolicy
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p)).To(Succeed())
		return &p
	}
}

// haveCondition matches a policy whose condition typ has the status and
// reason, observed at the policy's current generation.
func haveCondition(typ string, status metav1.ConditionStatus, reason string) OmegaMatcher {
	return WithTransform(func(p *v1alpha1.RateLimitPolicy) string {
		c := meta.FindStatusCondition(p.Status.Conditions, typ)
		if c == nil {
			return "<no " + typ + " condition>"
		}
		if c.ObservedGeneration != p.Generation || p.Status.ObservedGeneration != p.Generation {
			return fmt.Sprintf("%s observed generation %d/%d, policy at %d", typ, c.ObservedGeneration, p.Status.ObservedGeneration, p.Generation)
		}
		return fmt.Sprintf("%s=%s/%s", typ, c.Status, c.Reason)
	}, Equal(fmt.Sprintf("%s=%s/%s", typ, status, reason)))
}

// conditionMessage returns the message of condition typ.
func conditionMessage(p *v1alpha1.RateLimitPolicy, typ string) string {
	if c := meta.FindStatusCondition(p.Status.Conditions, typ); c != nil {
		return c.Message
	}
	return ""
}

// eventsFor lists the Events about the policy named name.
func eventsFor(ctx context.Context, ns, name string) func(g Gomega) []eventsv1.Event {
	return func(g Gomega) []eventsv1.Event {
		var list eventsv1.EventList
		g.Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		var out []eventsv1.Event
		for _, e := range list.Items {
			if e.Regarding.Kind == "RateLimitPolicy" && e.Regarding.Name == name {
				out = append(out, e)
			}
		}
		return out
	}
}
