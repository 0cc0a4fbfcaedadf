package policy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/internal/podstatus"
	"github.com/floodgate-dev/floodgate/controllers/programmed"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// StoreIndex is the cache index of RateLimitPolicies by the name of the
// CounterStore they use (their storeRef, or "default").
const StoreIndex = "floodgate.dev/store"

// SetupWithManager registers the store index and the controller with mgr.
// The controller's watches read from mgr's cache; Reconcile uses r.Client,
// and r.APIReader, which defaults to mgr's API reader.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts controller.Options) error {
	if r.Client == nil {
		return errors.New("policy reconciler: Client is nil")
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Recorder == nil {
		return errors.New("policy reconciler: Recorder is nil")
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.RateLimitPolicy{}, StoreIndex, func(o client.Object) []string {
		p, ok := o.(*v1alpha1.RateLimitPolicy)
		if !ok {
			return nil
		}
		return []string{p.StoreName()}
	}); err != nil {
		return fmt.Errorf("index RateLimitPolicies by store: %w", err)
	}

	cache := mgr.GetClient()
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WithOptions(opts).
		Watches(&v1alpha1.RateLimitPolicy{},
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				return []reconcile.Request{requestFor(o.GetNamespace())}
			}),
			builder.WithPredicates(policyChanged())).
		Watches(&corev1.Pod{},
			handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
				return namespaceWithPolicies(ctx, cache, o.GetNamespace())
			}),
			builder.WithPredicates(podChanged())).
		Watches(&v1alpha1.CounterStore{},
			handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
				return namespacesUsingStore(ctx, cache, o.GetName())
			}),
			builder.WithPredicates(storeChanged())).
		Watches(&corev1.ConfigMap{},
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				return []reconcile.Request{requestFor(o.GetNamespace())}
			}),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return o.GetName() == config.ConfigMapName
			}))).
		Watches(&v1alpha1.ClusterRateLimitPolicy{},
			handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
				c, ok := o.(*v1alpha1.ClusterRateLimitPolicy)
				if !ok {
					return nil
				}
				return namespacesForCluster(ctx, cache, c)
			}),
			builder.WithPredicates(policyChanged())).
		Watches(&corev1.Namespace{},
			handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
				if !anyClusterPolicy(ctx, cache) {
					return nil
				}
				return []reconcile.Request{requestFor(o.GetName())}
			}),
			builder.WithPredicates(namespaceLabelsChanged()))
	if r.Usage != nil {
		b = b.WatchesRawSource(source.Channel(r.Usage.Updates(),
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				return []reconcile.Request{requestFor(o.GetName())}
			})))
	}
	return b.Complete(r)
}

// namespacesForCluster maps a ClusterRateLimitPolicy event to the
// namespaces it selects, and to every namespace that has a document,
// which may hold its entry (a selector that no longer selects, or a
// deleted policy).
func namespacesForCluster(ctx context.Context, c client.Reader, cp *v1alpha1.ClusterRateLimitPolicy) []reconcile.Request {
	names := map[string]bool{}
	if sel, err := metav1.LabelSelectorAsSelector(&cp.Spec.NamespaceSelector); err == nil {
		var namespaces corev1.NamespaceList
		if err := c.List(ctx, &namespaces, client.MatchingLabelsSelector{Selector: sel}); err != nil {
			log.FromContext(ctx).Error(err, "listing the namespaces of a ClusterRateLimitPolicy", "policy", cp.Name)
		}
		for _, ns := range namespaces.Items {
			names[ns.Name] = true
		}
	}
	var cms corev1.ConfigMapList
	if err := c.List(ctx, &cms); err != nil {
		log.FromContext(ctx).Error(err, "listing the floodgate ConfigMaps")
	}
	for _, cm := range cms.Items {
		if cm.Name == config.ConfigMapName {
			names[cm.Namespace] = true
		}
	}
	reqs := make([]reconcile.Request, 0, len(names))
	for _, ns := range slices.Sorted(maps.Keys(names)) {
		reqs = append(reqs, requestFor(ns))
	}
	return reqs
}

// anyClusterPolicy reports whether a ClusterRateLimitPolicy exists.
func anyClusterPolicy(ctx context.Context, c client.Reader) bool {
	var list v1alpha1.ClusterRateLimitPolicyList
	if err := c.List(ctx, &list, client.Limit(1)); err != nil {
		return true
	}
	return len(list.Items) > 0
}

// clusterSelects reports whether a ClusterRateLimitPolicy selects the
// namespace ns.
func clusterSelects(ctx context.Context, c client.Reader, ns string) bool {
	var list v1alpha1.ClusterRateLimitPolicyList
	if err := c.List(ctx, &list); err != nil {
		return true
	}
	if len(list.Items) == 0 {
		return false
	}
	var namespace corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: ns}, &namespace); err != nil {
		return false
	}
	for i := range list.Items {
		sel, err := metav1.LabelSelectorAsSelector(&list.Items[i].Spec.NamespaceSelector)
		if err == nil && sel.Matches(labels.Set(namespace.Labels)) {
			return true
		}
	}
	return false
}

// namespaceLabelsChanged passes new namespaces and label changes, which
// decide what ClusterRateLimitPolicies select.
func namespaceLabelsChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !labels.Equals(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// namespaceWithPolicies maps a pod event to its namespace, when the
// namespace has policies or a ClusterRateLimitPolicy selects it: pod churn
// elsewhere costs nothing.
func namespaceWithPolicies(ctx context.Context, c client.Reader, ns string) []reconcile.Request {
	var policies v1alpha1.RateLimitPolicyList
	if err := c.List(ctx, &policies, client.InNamespace(ns), client.Limit(1)); err != nil {
		// The cache does not fail lists of a synced informer; enqueue to be safe.
		log.FromContext(ctx).Error(err, "listing RateLimitPolicies for a pod event", "namespace", ns)
		return []reconcile.Request{requestFor(ns)}
	}
	if len(policies.Items) == 0 && !clusterSelects(ctx, c, ns) {
		return nil
	}
	return []reconcile.Request{requestFor(ns)}
}

// namespacesUsingStore maps a CounterStore event to every namespace whose
// policies use the store.
func namespacesUsingStore(ctx context.Context, c client.Reader, store string) []reconcile.Request {
	var policies v1alpha1.RateLimitPolicyList
	if err := c.List(ctx, &policies, client.MatchingFields{StoreIndex: store}); err != nil {
		log.FromContext(ctx).Error(err, "listing the RateLimitPolicies of a CounterStore", "store", store)
		return nil
	}
	var namespaces []string
	for _, p := range policies.Items {
		namespaces = append(namespaces, p.Namespace)
	}
	slices.Sort(namespaces)
	namespaces = slices.Compact(namespaces)
	reqs := make([]reconcile.Request, len(namespaces))
	for i, ns := range namespaces {
		reqs[i] = requestFor(ns)
	}
	return reqs
}

// policyChanged passes creations, deletions, spec changes (generation) and
// the start of a deletion. Status writes, including the controller's own,
// do not pass.
func policyChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			if e.ObjectOld == nil || e.ObjectNew == nil {
				return true
			}
			return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() ||
				(e.ObjectOld.GetDeletionTimestamp() == nil) != (e.ObjectNew.GetDeletionTimestamp() == nil)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// podChanged passes what changes the pod counts: creation, deletion, and
// updates of labels, readiness, phase, the sidecar's policy-loaded
// condition (enforcingPods, Programmed) or the start of a deletion.
func podChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*corev1.Pod)
			now, okNew := e.ObjectNew.(*corev1.Pod)
			if !okOld || !okNew {
				return true
			}
			return !labels.Equals(old.Labels, now.Labels) ||
				podstatus.Ready(old) != podstatus.Ready(now) ||
				old.Status.Phase != now.Status.Phase ||
				programmed.LoadedChanged(old, now) ||
				(old.DeletionTimestamp == nil) != (now.DeletionTimestamp == nil)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// storeChanged passes what the compiled document or the ResolvedRefs
// condition depend on: the spec, the Ready condition, the endpoints and the
// auth Secret name.
func storeChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*v1alpha1.CounterStore)
			now, okNew := e.ObjectNew.(*v1alpha1.CounterStore)
			if !okOld || !okNew {
				return true
			}
			ro := meta.FindStatusCondition(old.Status.Conditions, v1alpha1.ConditionReady)
			rn := meta.FindStatusCondition(now.Status.Conditions, v1alpha1.ConditionReady)
			readyChanged := (ro == nil) != (rn == nil) ||
				(ro != nil && (ro.Status != rn.Status || ro.Message != rn.Message))
			return old.Generation != now.Generation || readyChanged ||
				!equality.Semantic.DeepEqual(old.Status.Endpoints, now.Status.Endpoints) ||
				old.Status.AuthSecretName != now.Status.AuthSecretName
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
