package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/internal/statusupdate"
	"github.com/floodgate-dev/floodgate/internal/message"
)

// ClusterControllerName names the ClusterRateLimitPolicy status
// controller.
const ClusterControllerName = "clusterratelimitpolicy"

// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=clusterratelimitpolicies/status,verbs=update

// ClusterReconciler reports the status of a ClusterRateLimitPolicy: whether
// its spec is Accepted, and how many namespaces it selects. The policy
// controller (Reconciler) compiles it into each selected namespace's
// document, and reports on the RateLimitPolicies of those namespaces how
// its rules apply to their pods. Its fields are set before
// SetupWithManager and not changed afterwards.
type ClusterReconciler struct {
	// Client reads through the manager's cache and writes to the API
	// server.
	Client client.Client
}

// Reconcile computes the status of the ClusterRateLimitPolicy req.Name.
func (r *ClusterReconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	var cp v1alpha1.ClusterRateLimitPolicy
	if err := r.Client.Get(ctx, req.NamespacedName, &cp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if cp.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	st := *cp.Status.DeepCopy()
	st.ObservedGeneration = cp.Generation
	invalid := cp.ValidateSemantics()
	cond := metav1.Condition{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted,
		Message: "The spec is valid.", ObservedGeneration: cp.Generation}
	if len(invalid) > 0 {
		msgs := make([]string, len(invalid))
		for i, e := range invalid {
			msgs[i] = e.Error()
		}
		cond.Status, cond.Reason = metav1.ConditionFalse, v1alpha1.ReasonInvalid
		cond.Message = message.Truncate("The spec is invalid: "+strings.Join(msgs, "; "), maxConditionMessage)
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	st.Namespaces = 0
	if sel, err := metav1.LabelSelectorAsSelector(&cp.Spec.NamespaceSelector); err == nil {
		var namespaces corev1.NamespaceList
		if err := r.Client.List(ctx, &namespaces, client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return ctrl.Result{}, fmt.Errorf("list the namespaces of ClusterRateLimitPolicy %s: %w", cp.Name, err)
		}
		for i := range namespaces.Items {
			if namespaces.Items[i].DeletionTimestamp == nil {
				st.Namespaces++
			}
		}
	}
	updated := cp.DeepCopy()
	updated.Status = st
	if err := statusupdate.Write(ctx, r.Client, &cp, updated, FieldOwner); err != nil {
		return ctrl.Result{}, fmt.Errorf("update the status of ClusterRateLimitPolicy %s: %w", cp.Name, err)
	}
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller with mgr. It watches the
// ClusterRateLimitPolicies, and the namespaces, whose labels decide which
// of them each policy selects.
func (r *ClusterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		return errors.New("cluster policy reconciler: Client is nil")
	}
	cache := mgr.GetClient()
	return ctrl.NewControllerManagedBy(mgr).
		Named(ClusterControllerName).
		For(&v1alpha1.ClusterRateLimitPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Namespace{},
			handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
				var list v1alpha1.ClusterRateLimitPolicyList
				if err := cache.List(ctx, &list); err != nil {
					return nil
				}
				reqs := make([]reconcile.Request, len(list.Items))
				for i := range list.Items {
					reqs[i] = reconcile.Request{NamespacedName: client.ObjectKey{Name: list.Items[i].Name}}
				}
				return reqs
			}),
			builder.WithPredicates(predicate.Funcs{
				UpdateFunc: func(e event.UpdateEvent) bool {
					return !labels.Equals(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) ||
						(e.ObjectOld.GetDeletionTimestamp() == nil) != (e.ObjectNew.GetDeletionTimestamp() == nil)
				},
				GenericFunc: func(event.GenericEvent) bool { return false },
			})).
		Complete(r)
}
