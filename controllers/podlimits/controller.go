package podlimits

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

// ControllerName names the controller.
const ControllerName = "podlimits"

// FieldOwner is the field manager of the policies it writes.
const FieldOwner = "floodgate-manager-podlimits"

// ReasonInvalidAnnotation is the reason of the Warning Event on a pod
// whose limit annotations cannot be used.
const ReasonInvalidAnnotation = "InvalidLimitAnnotation"

// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=ratelimitpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// Reconciler keeps the implicit policies of one namespace per call. Its
// fields are set before SetupWithManager and not changed afterwards.
type Reconciler struct {
	// Client reads through the manager's cache and writes to the API
	// server.
	Client client.Client
	// Recorder emits the Events on pods whose annotations cannot be used.
	Recorder events.EventRecorder
}

// Reconcile makes the implicit policies of namespace req.Namespace what
// its pods' annotations ask for.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	ns := req.Namespace
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return ctrl.Result{}, fmt.Errorf("list pods in %s: %w", ns, err)
	}
	var policies v1alpha1.RateLimitPolicyList
	if err := r.Client.List(ctx, &policies, client.InNamespace(ns)); err != nil {
		return ctrl.Result{}, fmt.Errorf("list RateLimitPolicies in %s: %w", ns, err)
	}
	plan := Desired(ns, pods.Items, namespaceStore(policies.Items))
	for _, prob := range plan.Problems {
		if r.Recorder == nil {
			continue
		}
		pod := &corev1.Pod{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: prob.Pod}, pod); err == nil {
			r.Recorder.Eventf(pod, nil, corev1.EventTypeWarning, ReasonInvalidAnnotation, "ImplicitLimit", "%s", prob.Message)
		}
	}
	existing := map[string]*v1alpha1.RateLimitPolicy{} // implicit ones
	taken := map[string]bool{}                         // names of the others
	for i := range policies.Items {
		p := &policies.Items[i]
		if p.Labels[ImplicitLabel] == ImplicitValue {
			existing[p.Name] = p
		} else {
			taken[p.Name] = true
		}
	}
	var errs []error
	for i := range plan.Policies {
		want := &plan.Policies[i]
		if taken[want.Name] {
			// Never overwrite a policy someone wrote.
			log.FromContext(ctx).Info("not applying the implicit policy of the limit annotations: a policy of that name exists", "policy", want.Name)
			continue
		}
		have, ok := existing[want.Name]
		delete(existing, want.Name)
		if ok && equality.Semantic.DeepEqual(have.Spec, want.Spec) {
			continue
		}
		u, err := toUnstructured(want)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			errs = append(errs, fmt.Errorf("apply RateLimitPolicy %s/%s: %w", ns, want.Name, err))
			continue
		}
		log.FromContext(ctx).Info("applied the implicit policy of the limit annotations", "policy", want.Name)
	}
	for _, stale := range existing {
		if err := r.Client.Delete(ctx, stale, client.Preconditions{UID: &stale.UID}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete RateLimitPolicy %s/%s: %w", ns, stale.Name, err))
			continue
		}
		log.FromContext(ctx).Info("deleted the implicit policy: no pod asks for it any more", "policy", stale.Name)
	}
	return ctrl.Result{}, errors.Join(errs...)
}

// toUnstructured is the apply configuration of a policy: its metadata
// and spec, without status and server-set fields.
func toUnstructured(p *v1alpha1.RateLimitPolicy) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		return nil, fmt.Errorf("convert RateLimitPolicy %s: %w", p.Name, err)
	}
	delete(m, "status")
	if meta, ok := m["metadata"].(map[string]any); ok {
		delete(meta, "creationTimestamp")
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// namespaceStore is the store of the namespace's earliest policy that is
// not implicit, so that the implicit ones never conflict with it; the
// default store when there is none.
func namespaceStore(policies []v1alpha1.RateLimitPolicy) string {
	var first *v1alpha1.RateLimitPolicy
	for i := range policies {
		p := &policies[i]
		if p.Labels[ImplicitLabel] == ImplicitValue || p.DeletionTimestamp != nil {
			continue
		}
		if first == nil || p.CreationTimestamp.Before(&first.CreationTimestamp) ||
			(p.CreationTimestamp.Equal(&first.CreationTimestamp) && p.Name < first.Name) {
			first = p
		}
	}
	if first == nil {
		return v1alpha1.DefaultCounterStoreName
	}
	return first.StoreName()
}

// SetupWithManager registers the controller. It reconciles a namespace
// when one of its pods with (or once with) limit annotations changes, when
// an implicit policy is changed or deleted by someone else, and when the
// namespace's first policy (its store) changes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		return errors.New("podlimits reconciler: Client is nil")
	}
	byNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: ControllerName}}}
	})
	cache := mgr.GetClient()
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			pod, ok := o.(*corev1.Pod)
			if !ok {
				return nil
			}
			if !hasLimit(pod) && !hasImplicit(ctx, cache, pod.Namespace) {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: pod.Namespace, Name: ControllerName}}}
		}), builder.WithPredicates(podLimitsChanged())).
		Watches(&v1alpha1.RateLimitPolicy{}, byNamespace, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() ||
					!labels.Equals(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
			},
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		Complete(r)
}

// hasImplicit reports whether the namespace has an implicit policy.
func hasImplicit(ctx context.Context, c client.Reader, ns string) bool {
	var list v1alpha1.RateLimitPolicyList
	if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{ImplicitLabel: ImplicitValue}, client.Limit(1)); err != nil {
		return true
	}
	return len(list.Items) > 0
}

// podLimitsChanged passes creations, deletions, and updates of a pod's
// labels, limit annotations or phase.
func podLimitsChanged() predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*corev1.Pod)
			cur, okNew := e.ObjectNew.(*corev1.Pod)
			if !okOld || !okNew {
				return true
			}
			for _, a := range []string{AnnotationRPS, AnnotationRPM, AnnotationBurstMultiplier, AnnotationWhitelist, AnnotationTrustedCIDRs} {
				if old.Annotations[a] != cur.Annotations[a] {
					return true
				}
			}
			return !labels.Equals(old.Labels, cur.Labels) || old.Status.Phase != cur.Status.Phase ||
				(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
