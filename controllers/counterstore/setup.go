package counterstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/internal/podstatus"
)

// DefaultNamespace is where managed stores' objects go unless
// Options.Namespace says otherwise.
const DefaultNamespace = "floodgate-system"

// DefaultPasswordOverlap is Options.PasswordOverlap's default: the kubelet
// updates Secret volumes within about a minute and a half.
const DefaultPasswordOverlap = 10 * time.Minute

// Options tune the controller. The zero value of a field means its
// default.
type Options struct {
	// Namespace holds the objects of every managed store: the manager's
	// own namespace. Default DefaultNamespace.
	Namespace string
	// ResyncPeriod is how often a healthy store is checked, to notice
	// Redis failures that no Kubernetes event announces. Default 10s.
	ResyncPeriod time.Duration
	// ProgressPeriod is the pause between formation passes while a store
	// forms or heals, which lets gossip spread. Default 500ms.
	ProgressPeriod time.Duration
	// MigrateBudget bounds the time one reconcile spends migrating
	// slots; the next reconcile goes on. Default 10s.
	MigrateBudget time.Duration
	// DialTimeout bounds dialing a node and each command. Default 2s.
	DialTimeout time.Duration
	// PasswordOverlap is how long a namespace's previous store password
	// stays accepted after a rotation: longer than the kubelet takes to
	// update the sidecars' Secret volumes. Default 10m.
	PasswordOverlap time.Duration
}

func (o Options) withDefaults() Options {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.ResyncPeriod == 0 {
		o.ResyncPeriod = 10 * time.Second
	}
	if o.ProgressPeriod == 0 {
		o.ProgressPeriod = 500 * time.Millisecond
	}
	if o.MigrateBudget == 0 {
		o.MigrateBudget = 10 * time.Second
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 2 * time.Second
	}
	if o.PasswordOverlap == 0 {
		o.PasswordOverlap = DefaultPasswordOverlap
	}
	return o
}

// Validate reports every problem with o at once.
func (o Options) Validate() error {
	var errs []error
	if o.Namespace != "" && !dnsLabel.MatchString(o.Namespace) {
		errs = append(errs, fmt.Errorf("namespace: must be a DNS label, got %q", o.Namespace))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"resyncPeriod", o.ResyncPeriod}, {"progressPeriod", o.ProgressPeriod},
		{"migrateBudget", o.MigrateBudget}, {"dialTimeout", o.DialTimeout}, {"passwordOverlap", o.PasswordOverlap},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %v", d.name, d.v))
		}
	}
	return errors.Join(errs...)
}

// Setup builds a Reconciler from mgr and registers it: the one call the
// manager's composition root needs. m exports the stores' status.
func Setup(ctx context.Context, mgr ctrl.Manager, m *Metrics, o Options, opts controller.Options) error {
	r := &Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("floodgate-manager"),
		Options:   o,
		Metrics:   m,
	}
	return r.SetupWithManager(ctx, mgr, opts)
}

// SetupWithManager registers ServedIndex and the controller with mgr. It
// watches CounterStores; the StatefulSets, Services, ConfigMaps,
// PodDisruptionBudgets, NetworkPolicies and Secrets they own (Secrets
// as metadata only, so that a rotation request on the auth Secret is seen
// at once); the Pods of managed stores; and the namespaces' policies
// ConfigMaps, for the namespaces each store's NetworkPolicy admits.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts controller.Options) error {
	var errs []error
	if r.Client == nil {
		errs = append(errs, errors.New("counterstore reconciler: Client is nil"))
	}
	if r.APIReader == nil {
		errs = append(errs, errors.New("counterstore reconciler: APIReader is nil"))
	}
	if r.Recorder == nil {
		errs = append(errs, errors.New("counterstore reconciler: Recorder is nil"))
	}
	if r.Metrics == nil {
		errs = append(errs, errors.New("counterstore reconciler: Metrics is nil"))
	}
	if err := r.Options.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("counterstore reconciler options: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := indexServed(ctx, mgr); err != nil {
		return err
	}
	ns := r.Options.withDefaults().Namespace
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WithOptions(opts).
		For(&v1alpha1.CounterStore{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&networkingv1.NetworkPolicy{}).
		Owns(&corev1.Secret{}, builder.OnlyMetadata).
		Watches(&corev1.Pod{},
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				return podStore(ns, o)
			}),
			builder.WithPredicates(podChanged())).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(servedStores), builder.WithPredicates(servedChanged())).
		Complete(r)
}

// podStore maps a Pod of a managed store to its CounterStore.
func podStore(ns string, o client.Object) []reconcile.Request {
	if o.GetNamespace() != ns || o.GetLabels()[LabelName] != NameValue {
		return nil
	}
	store := o.GetLabels()[LabelInstance]
	if store == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: store}}}
}

// podChanged passes what changes a Pod's membership: creation, deletion,
// and a change of IP, node, readiness, phase or the start of a deletion.
func podChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*corev1.Pod)
			now, okNew := e.ObjectNew.(*corev1.Pod)
			if !okOld || !okNew {
				return true
			}
			return old.Status.PodIP != now.Status.PodIP ||
				old.Spec.NodeName != now.Spec.NodeName ||
				podstatus.Ready(old) != podstatus.Ready(now) ||
				old.Status.Phase != now.Status.Phase ||
				(old.DeletionTimestamp == nil) != (now.DeletionTimestamp == nil)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
