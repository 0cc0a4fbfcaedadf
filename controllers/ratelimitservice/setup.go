package ratelimitservice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/internal/podstatus"
	"github.com/floodgate-dev/floodgate/controllers/programmed"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// GRPCRoutes are read apart from HTTPRoutes and Gateways: a cluster may
// serve those and not GRPCRoutes.
//
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=grpcroutes,verbs=get;list;watch

// SetupWithManager registers the controller with mgr. It watches Gateway
// API HTTPRoutes and Gateways only when the API server serves them
// (r.GatewayAPI), so a cluster without the Gateway API still runs the
// manager; and GRPCRoutes only when it serves them too, so a cluster
// without them still runs it and reports GRPCRoute targets missing.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if r.Client == nil || r.Recorder == nil {
		return errors.New("rate-limit service reconciler: Client and Recorder must be set")
	}
	if r.Namespace == "" {
		return errors.New("rate-limit service reconciler: Namespace is empty")
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	served, err := servesGatewayAPI(mgr.GetRESTMapper(), v1alpha1.KindHTTPRoute, v1alpha1.KindGateway)
	if err != nil {
		return err
	}
	r.GatewayAPI = served
	r.mapper = mgr.GetRESTMapper()
	r.log = mgr.GetLogger().WithName(ControllerName)
	grpcServed := false
	if served {
		if grpcServed, err = servesGatewayAPI(mgr.GetRESTMapper(), v1alpha1.KindGRPCRoute); err != nil {
			return err
		}
	}

	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{r.Request()}
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WithOptions(opts).
		Watches(&v1alpha1.RateLimitPolicy{}, one, builder.WithPredicates(gatewayPolicyChanged())).
		Watches(&corev1.Pod{}, one, builder.WithPredicates(r.servicePodChanged())).
		Watches(&v1alpha1.CounterStore{}, one, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				old, okOld := e.ObjectOld.(*v1alpha1.CounterStore)
				now, okNew := e.ObjectNew.(*v1alpha1.CounterStore)
				return !okOld || !okNew || !equalStoreStatus(old, now)
			}}))).
		// A managed store's credentials (rotated by its Secret), and the
		// service's own copy of them, live in the service's namespace;
		// Secrets are watched as metadata only, as sidecaraccess does.
		Watches(&corev1.Secret{}, one, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetNamespace() == r.Namespace
		})), builder.OnlyMetadata).
		Watches(&corev1.ConfigMap{}, one, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetNamespace() == r.Namespace &&
				(o.GetName() == config.RateLimitServiceConfigMapName || o.GetName() == GatewayConfigMapName)
		})))
	if served {
		b = b.Watches(&gatewayv1.HTTPRoute{}, one, builder.WithPredicates(targetChanged())).
			Watches(&gatewayv1.Gateway{}, one, builder.WithPredicates(targetChanged()))
		if r.Apply.Enabled {
			// A Gateway's class says which object it reads.
			b = b.Watches(&gatewayv1.GatewayClass{}, one, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
		}
	} else {
		mgr.GetLogger().Info("the API server serves no Gateway API HTTPRoutes and Gateways: policies with a targetRef report their target missing")
	}
	if grpcServed {
		b = b.Watches(&gatewayv1.GRPCRoute{}, one, builder.WithPredicates(targetChanged()))
	} else if served {
		mgr.GetLogger().Info("the API server serves no Gateway API GRPCRoutes: policies that target one report it missing")
	}
	c, err := b.Build(r)
	if err != nil {
		return err
	}
	if r.Apply.Enabled {
		// The applied objects' kinds are watched once found served (see
		// served): their CRDs may come after the manager.
		r.watchKind = func(gvk schema.GroupVersionKind) error {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gvk)
			return c.Watch(source.Kind(mgr.GetCache(), client.Object(u), one, appliedObject()))
		}
	}
	return nil
}

// appliedObject passes the events of the objects the manager applied to
// gateways: changes by others are undone, and Envoy Gateway's status is
// read, on the next reconcile. It also passes those of any object with a
// generated object's name, so that the manager applies its own as soon as
// an object it left alone (a Conflict) is deleted.
func appliedObject() predicate.Funcs {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[AppliedLabel] == AppliedLabelValue || strings.HasPrefix(o.GetName(), gatewayconfig.ObjectNamePrefix)
	})
}

// servesGatewayAPI reports whether every kind of kinds, of
// gateway.networking.k8s.io/v1, is served.
func servesGatewayAPI(m meta.RESTMapper, kinds ...string) (bool, error) {
	for _, kind := range kinds {
		_, err := m.RESTMapping(schema.GroupKind{Group: gatewayv1.GroupName, Kind: kind}, gatewayv1.GroupVersion.Version)
		if meta.IsNoMatchError(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("discover the Gateway API's %s: %w", kind, err)
		}
	}
	return true, nil
}

// gatewayPolicyChanged passes the creation and deletion of a policy with a
// targetRef, and spec changes of a policy that has or had one.
func gatewayPolicyChanged() predicate.Funcs {
	enforced := func(o client.Object) bool {
		p, ok := o.(*v1alpha1.RateLimitPolicy)
		return !ok || p.GatewayEnforced()
	}
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return enforced(e.Object) },
		DeleteFunc: func(e event.DeleteEvent) bool { return enforced(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			if !enforced(e.ObjectOld) && !enforced(e.ObjectNew) {
				return false
			}
			return e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() ||
				(e.ObjectOld.GetDeletionTimestamp() == nil) != (e.ObjectNew.GetDeletionTimestamp() == nil)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// servicePodChanged passes the central service's pods when they come, go,
// or change readiness, phase or their policy-loaded condition.
func (r *Reconciler) servicePodChanged() predicate.Funcs {
	mine := func(o client.Object) bool {
		return o.GetNamespace() == r.Namespace &&
			labels.SelectorFromSet(labels.Set{config.RateLimitServicePodLabel: "true"}).Matches(labels.Set(o.GetLabels()))
	}
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return mine(e.Object) },
		DeleteFunc: func(e event.DeleteEvent) bool { return mine(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			if !mine(e.ObjectOld) && !mine(e.ObjectNew) {
				return false
			}
			old, okOld := e.ObjectOld.(*corev1.Pod)
			now, okNew := e.ObjectNew.(*corev1.Pod)
			if !okOld || !okNew {
				return true
			}
			return mine(old) != mine(now) ||
				podstatus.Ready(old) != podstatus.Ready(now) ||
				old.Status.Phase != now.Status.Phase ||
				programmed.LoadedChanged(old, now) ||
				(old.DeletionTimestamp == nil) != (now.DeletionTimestamp == nil)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// targetChanged passes what status.target reads of an HTTPRoute, a
// GRPCRoute or a Gateway: its spec (generation) and, for a route, the
// parents that accepted it.
func targetChanged() predicate.Funcs {
	accepted := func(o client.Object) ([]string, bool) {
		switch r := o.(type) {
		case *gatewayv1.HTTPRoute:
			return httpRoute(r).acceptedBy(), true
		case *gatewayv1.GRPCRoute:
			return grpcRoute(r).acceptedBy(), true
		}
		return nil, false
	}
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() {
				return true
			}
			a, okOld := accepted(e.ObjectOld)
			b, okNew := accepted(e.ObjectNew)
			slices.Sort(a)
			slices.Sort(b)
			return okOld && okNew && !slices.Equal(slices.Compact(a), slices.Compact(b))
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func equalStoreStatus(a, b *v1alpha1.CounterStore) bool {
	ra := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionReady)
	rb := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.ConditionReady)
	if (ra == nil) != (rb == nil) || (ra != nil && (ra.Status != rb.Status || ra.Message != rb.Message)) {
		return false
	}
	return equality.Semantic.DeepEqual(a.Status.Endpoints, b.Status.Endpoints) && a.Status.AuthSecretName == b.Status.AuthSecretName
}
