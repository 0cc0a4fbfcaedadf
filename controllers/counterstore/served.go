package counterstore

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// ServedIndex is the cache index of the namespaces' policies ConfigMaps
// (config.ConfigMapName) by the name of the CounterStore their document
// names: the store that namespace's sidecars connect to.
const ServedIndex = "floodgate.dev/counterstore"

// storeOf returns the CounterStore that o, a namespace's policies
// ConfigMap as the policy controller writes it (labelled
// LabelManagedBy=ManagedByValue), names, or "" for any other object. The
// policy controller is the only writer of those ConfigMaps and undoes any
// other change to them, so what they name is what the namespace's
// sidecars use.
func storeOf(o client.Object) string {
	cm, ok := o.(*corev1.ConfigMap)
	if !ok || cm.Name != config.ConfigMapName || cm.Labels[LabelManagedBy] != ManagedByValue {
		return ""
	}
	s, err := config.PeekStore([]byte(cm.Data[config.DataKey]))
	if err != nil || s.Type != config.StoreRedis {
		return ""
	}
	return s.Name
}

// indexServed registers ServedIndex with mgr's cache.
func indexServed(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.ConfigMap{}, ServedIndex, func(o client.Object) []string {
		if s := storeOf(o); s != "" {
			return []string{s}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index the policies ConfigMaps by store: %w", err)
	}
	return nil
}

// ServedNamespaces returns, sorted, the namespaces whose policies document
// names store: those whose sidecars connect to it. c must have ServedIndex
// (the manager's cache, once the controller is set up).
func ServedNamespaces(ctx context.Context, c client.Reader, store string) ([]string, error) {
	var cms corev1.ConfigMapList
	if err := c.List(ctx, &cms, client.MatchingFields{ServedIndex: store}); err != nil {
		return nil, fmt.Errorf("list the namespaces CounterStore %s serves: %w", store, err)
	}
	out := make([]string, 0, len(cms.Items))
	for i := range cms.Items {
		if cms.Items[i].DeletionTimestamp == nil {
			out = append(out, cms.Items[i].Namespace)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// servedStores maps a policies ConfigMap to the store it names. On an
// update, controller-runtime maps the old and the new object, so a
// namespace that moves to another store is dropped by one and added by the
// other.
func servedStores(_ context.Context, o client.Object) []reconcile.Request {
	if s := storeOf(o); s != "" {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: s}}}
	}
	return nil
}

// servedChanged passes what changes the namespaces a store serves: a
// policies ConfigMap that appears or goes, or names another store. Most
// writes of a ConfigMap change the policies or the replica counts and keep
// the store; they are dropped, so that they cost no formation pass.
func servedChanged() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return storeOf(e.Object) != "" },
		DeleteFunc:  func(e event.DeleteEvent) bool { return storeOf(e.Object) != "" },
		UpdateFunc:  func(e event.UpdateEvent) bool { return storeOf(e.ObjectOld) != storeOf(e.ObjectNew) },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
