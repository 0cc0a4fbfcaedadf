package ratelimitservice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/internal/message"
)

// GatewayApply says which Gateways the manager configures itself: for each
// such Gateway it applies the generated Istio EnvoyFilter or Envoy Gateway
// EnvoyPatchPolicy (the one its GatewayClass's controller reads), keeps it
// equal to what the policies need, and deletes it when no policy is
// enforced there any more. Without it, the manager only publishes the
// objects in GatewayConfigMapName for the user to apply.
type GatewayApply struct {
	// Enabled turns it on (floodgate-manager --apply-gateway-config).
	Enabled bool
	// Classes, when not empty, limits it to the Gateways of these
	// GatewayClasses (--apply-gateway-classes); empty means every Gateway
	// whose class's controller is Istio's or Envoy Gateway's.
	Classes []string
}

// The GatewayClass controllers whose Gateways the manager can configure.
const (
	// IstioController is Istio's GatewayClass controllerName.
	IstioController = "istio.io/gateway-controller"
	// EnvoyGatewayController is Envoy Gateway's.
	EnvoyGatewayController = "gateway.envoyproxy.io/gatewayclass-controller"
)

const (
	// ApplyFieldOwner is the field manager of the objects the manager
	// applies to gateways. An object whose managed fields do not name it
	// (with an Apply operation) was not created by the manager, which
	// never changes or deletes it.
	ApplyFieldOwner = "floodgate-gateway-config"
	// AppliedLabel marks the objects the manager applies to gateways; the
	// manager lists its objects by it.
	AppliedLabel = "ratelimit.floodgate.dev/gateway-config"
	// AppliedLabelValue is its value.
	AppliedLabelValue = "applied"
)

// flavor is one kind of gateway object: the generator's output for a
// Gateway whose class's controller is controller.
type flavor struct {
	name       string
	product    string
	controller string
	gvk        schema.GroupVersionKind
	// accepts reports whether the gateway reports the object accepted
	// and programmed; nil when the gateway gives it no status (Istio),
	// where applied is the last state.
	accepts func(obj *unstructured.Unstructured, gateway string) (ok bool, known bool, why string)
}

var (
	istioFlavor = flavor{
		name: FlavorIstio, product: "Istio", controller: IstioController,
		gvk: schema.FromAPIVersionAndKind(gatewayconfig.IstioAPIVersion, gatewayconfig.IstioKind),
	}
	envoyGatewayFlavor = flavor{
		name: FlavorEnvoyGateway, product: "Envoy Gateway", controller: EnvoyGatewayController,
		gvk:     schema.FromAPIVersionAndKind(gatewayconfig.EnvoyGatewayAPIVersion, gatewayconfig.EnvoyGatewayKind),
		accepts: envoyGatewayAccepted,
	}
	flavors = []flavor{istioFlavor, envoyGatewayFlavor}
)

// flavorOf returns the flavor of a GatewayClass controller.
func flavorOf(controller string) (flavor, bool) {
	for _, f := range flavors {
		if f.controller == controller {
			return f, true
		}
	}
	return flavor{}, false
}

// generated is one Gateway and its generated objects, by flavor name.
type generated struct {
	gw      *gatewayconfig.Gateway
	class   string
	objects map[string]*unstructured.Unstructured
}

// applied is what the manager did with the object of one Gateway.
type applied = v1alpha1.AppliedObject

// appliedState is the outcome of applying the objects: per Gateway, its
// object, and whether a flavor the applier needs is not served yet.
type appliedState struct {
	byGateway    map[types.NamespacedName]applied
	notInstalled bool
}

// applyGatewayObjects brings the objects the manager applies to gateways
// to gens: it applies the object of each Gateway it configures and
// deletes its objects that no Gateway needs. owners are the policies by
// namespace/name, whose UIDs become the objects' owner references. It
// reads and writes the API server directly: the cache strips managed
// fields, which tell the manager's objects from others.
func (r *Reconciler) applyGatewayObjects(ctx context.Context, gens []generated, owners map[types.NamespacedName]*v1alpha1.RateLimitPolicy) (appliedState, error) {
	st := appliedState{byGateway: map[types.NamespacedName]applied{}}
	if !r.Apply.Enabled {
		return st, nil
	}
	var errs []error
	classes := map[string]string{}
	want := map[schema.GroupVersionKind]map[types.NamespacedName]bool{}
	keep := func(f flavor, gw *gatewayconfig.Gateway) {
		if want[f.gvk] == nil {
			want[f.gvk] = map[types.NamespacedName]bool{}
		}
		want[f.gvk][types.NamespacedName{Namespace: gw.Namespace, Name: gatewayconfig.ObjectName(gw.Name)}] = true
	}
	keepAll := func(gw *gatewayconfig.Gateway) {
		for _, f := range flavors {
			keep(f, gw)
		}
	}
	for _, g := range gens {
		controller, ok := classes[g.class]
		if !ok {
			var gc gatewayv1.GatewayClass
			switch err := r.Client.Get(ctx, client.ObjectKey{Name: g.class}, &gc); {
			case apierrors.IsNotFound(err):
			case err != nil:
				// Unknown for now: what is applied stays.
				errs = append(errs, fmt.Errorf("get GatewayClass %s: %w", g.class, err))
				keepAll(g.gw)
				continue
			default:
				controller = string(gc.Spec.ControllerName)
			}
			classes[g.class] = controller
		}
		if len(r.Apply.Classes) > 0 && !slices.Contains(r.Apply.Classes, g.class) {
			continue
		}
		f, ok := flavorOf(controller)
		if !ok {
			continue
		}
		key := types.NamespacedName{Namespace: g.gw.Namespace, Name: g.gw.Name}
		obj := g.objects[f.name]
		if obj == nil {
			// The generators refused the Gateway (the error says why):
			// its last object keeps serving.
			keep(f, g.gw)
			continue
		}
		a := applied{Kind: f.gvk.Kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), Gateway: key.String()}
		served, err := r.served(f.gvk)
		switch {
		case err != nil:
			errs = append(errs, err)
			continue
		case !served:
			a.State = v1alpha1.AppliedStateNotInstalled
			a.Message = fmt.Sprintf("The API server does not serve %s %s: install %s, or leave GatewayClass %s out of the manager's gateway classes.",
				f.gvk.GroupVersion(), f.gvk.Kind, f.product, g.class)
			st.notInstalled = true
			st.byGateway[key] = a
			continue
		}
		keep(f, g.gw)
		a, err = r.applyOne(ctx, f, obj, g.gw, owners, a)
		if err != nil {
			errs = append(errs, err)
		}
		st.byGateway[key] = a
	}
	for _, f := range flavors {
		if err := r.pruneApplied(ctx, f, want[f.gvk]); err != nil {
			errs = append(errs, err)
		}
	}
	return st, errors.Join(errs...)
}

// applyOne applies obj, the object of gw, unless an object of its name
// exists that the manager did not create, and returns where it stands.
func (r *Reconciler) applyOne(ctx context.Context, f flavor, obj *unstructured.Unstructured, gw *gatewayconfig.Gateway,
	owners map[types.NamespacedName]*v1alpha1.RateLimitPolicy, a applied,
) (applied, error) {
	key := client.ObjectKeyFromObject(obj)
	var cur unstructured.Unstructured
	cur.SetGroupVersionKind(f.gvk)
	switch err := r.APIReader.Get(ctx, key, &cur); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return a, fmt.Errorf("get %s %s: %w", f.gvk.Kind, key, err)
	case !appliedByManager(&cur):
		a.State = v1alpha1.AppliedStateConflict
		a.Message = fmt.Sprintf("%s %s exists and was not created by floodgate-manager, which leaves it alone: delete it (an object applied by hand from ConfigMap %s included) for the manager to apply its own.",
			f.gvk.Kind, key, GatewayConfigMapName)
		return a, nil
	}
	desired := obj.DeepCopy()
	labels := desired.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[AppliedLabel] = AppliedLabelValue
	desired.SetLabels(labels)
	desired.SetOwnerReferences(ownerReferences(gw, owners))
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(desired), client.FieldOwner(ApplyFieldOwner), client.ForceOwnership); err != nil {
		a.State = v1alpha1.AppliedStateRejected
		a.Message = message.Truncate(fmt.Sprintf("The API server refused %s %s: %v", f.gvk.Kind, key, err), maxAppliedMessage)
		if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
			// The generator's output does not fit the installed CRD:
			// retrying will not help until one of them changes.
			return a, nil
		}
		return a, fmt.Errorf("apply %s %s: %w", f.gvk.Kind, key, err)
	}
	if cur.GetResourceVersion() == "" || desired.GetResourceVersion() != cur.GetResourceVersion() {
		log.FromContext(ctx).Info("applied the gateway's object", "kind", f.gvk.Kind, "object", key.String(), "gateway", a.Gateway)
	}
	a.State = v1alpha1.AppliedStateApplied
	if f.accepts != nil {
		ok, known, why := f.accepts(desired, gw.Name)
		switch {
		case known && ok:
			a.State = v1alpha1.AppliedStateProgrammed
		case known:
			a.State = v1alpha1.AppliedStateRejected
			a.Message = message.Truncate(why, maxAppliedMessage)
		default:
			a.Message = message.Truncate(why, maxAppliedMessage)
		}
	}
	return a, nil
}

// maxAppliedMessage is the API's bound on an AppliedObject's message.
const maxAppliedMessage = 1024

// ownerReferences are the policies enforced at gw that live in its
// namespace, the namespace of its object: deleting the last of them
// deletes the object. A policy of another namespace cannot own it (owner
// references do not cross namespaces); the manager deletes the object
// itself when no policy is enforced at the Gateway.
func ownerReferences(gw *gatewayconfig.Gateway, owners map[types.NamespacedName]*v1alpha1.RateLimitPolicy) []metav1.OwnerReference {
	var out []metav1.OwnerReference
	seen := map[types.UID]bool{}
	for _, att := range gw.Attachments {
		p, ok := owners[types.NamespacedName{Namespace: att.Policy.Namespace, Name: att.Policy.Name}]
		if !ok || p.Namespace != gw.Namespace || seen[p.UID] {
			continue
		}
		seen[p.UID] = true
		out = append(out, metav1.OwnerReference{
			APIVersion: v1alpha1.GroupVersion.String(), Kind: "RateLimitPolicy", Name: p.Name, UID: p.UID,
		})
	}
	slices.SortFunc(out, func(a, b metav1.OwnerReference) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// appliedByManager reports whether obj carries the manager's label and
// fields it applied.
func appliedByManager(obj *unstructured.Unstructured) bool {
	if obj.GetLabels()[AppliedLabel] != AppliedLabelValue {
		return false
	}
	for _, m := range obj.GetManagedFields() {
		if m.Manager == ApplyFieldOwner && m.Operation == metav1.ManagedFieldsOperationApply {
			return true
		}
	}
	return false
}

// pruneApplied deletes the manager's objects of f that are not in keep.
func (r *Reconciler) pruneApplied(ctx context.Context, f flavor, keep map[types.NamespacedName]bool) error {
	served, err := r.served(f.gvk)
	if err != nil || !served {
		return err
	}
	var list unstructured.UnstructuredList
	list.SetGroupVersionKind(f.gvk.GroupVersion().WithKind(f.gvk.Kind + "List"))
	if err := r.APIReader.List(ctx, &list, client.MatchingLabels{AppliedLabel: AppliedLabelValue}); err != nil {
		return fmt.Errorf("list the manager's %s objects: %w", f.gvk.Kind, err)
	}
	var errs []error
	for i := range list.Items {
		obj := &list.Items[i]
		key := client.ObjectKeyFromObject(obj)
		if keep[key] || !appliedByManager(obj) || obj.GetDeletionTimestamp() != nil {
			continue
		}
		uid := obj.GetUID()
		if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("delete %s %s: %w", f.gvk.Kind, key, err))
			continue
		}
		log.FromContext(ctx).Info("deleted the gateway's object: no policy is enforced at its Gateway", "kind", f.gvk.Kind, "object", key.String())
	}
	return errors.Join(errs...)
}

// served reports whether the API server serves gvk. The manager's REST
// mapper asks discovery again on a miss, so a CRD installed after the
// manager started is found on a later reconcile.
func (r *Reconciler) served(gvk schema.GroupVersionKind) (bool, error) {
	if r.mapper == nil {
		return false, nil
	}
	_, err := r.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	switch {
	case meta.IsNoMatchError(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("discover %s %s: %w", gvk.GroupVersion(), gvk.Kind, err)
	}
	r.watchApplied(gvk)
	return true, nil
}

// watchApplied starts watching the manager's objects of gvk the first
// time it is found served: their status (Envoy Gateway's) and changes by
// others bring the reconcile back.
func (r *Reconciler) watchApplied(gvk schema.GroupVersionKind) {
	if r.watchKind == nil {
		return
	}
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	if r.watching[gvk] {
		return
	}
	if err := r.watchKind(gvk); err != nil {
		r.log.Error(err, "watch the manager's gateway objects; their status is read on the next reconcile", "kind", gvk.Kind)
		return
	}
	if r.watching == nil {
		r.watching = map[schema.GroupVersionKind]bool{}
	}
	r.watching[gvk] = true
}

// watchState is the applier's record of the kinds it watches.
type watchState struct {
	watchMu  sync.Mutex
	watching map[schema.GroupVersionKind]bool
}

// envoyGatewayAccepted reads an EnvoyPatchPolicy's status for gateway:
// Envoy Gateway's Accepted and Programmed conditions of the ancestor that
// is the Gateway, for the object's current generation.
func envoyGatewayAccepted(obj *unstructured.Unstructured, gateway string) (ok, known bool, why string) {
	ancestors, _, _ := unstructured.NestedSlice(obj.Object, "status", "ancestors")
	for _, anc := range ancestors {
		m, _ := anc.(map[string]any)
		ref, _ := m["ancestorRef"].(map[string]any)
		if ref["name"] != gateway || (ref["kind"] != nil && ref["kind"] != "Gateway") {
			continue
		}
		conds, _ := m["conditions"].([]any)
		found := map[string]bool{}
		for _, c := range conds {
			cm, _ := c.(map[string]any)
			typ, _ := cm["type"].(string)
			if typ != "Accepted" && typ != "Programmed" {
				continue
			}
			if gen, ok := cm["observedGeneration"].(int64); ok && gen != obj.GetGeneration() {
				continue
			}
			found[typ] = true
			if cm["status"] != "True" {
				reason, _ := cm["reason"].(string)
				msg, _ := cm["message"].(string)
				return false, true, fmt.Sprintf("Envoy Gateway reports %s False (%s): %s", typ, reason, msg)
			}
		}
		if found["Accepted"] && found["Programmed"] {
			return true, true, ""
		}
	}
	return false, false, "Waiting for Envoy Gateway to accept and program the patches (its EnvoyPatchPolicy support must be on: extensionApis.enableEnvoyPatchPolicy)."
}

// gatewayObjectsPending returns the reason and message of a Programmed
// condition held False by the gateway objects the manager applies for a
// policy, or "" when each is in place: applied, and for an
// EnvoyPatchPolicy also accepted and programmed by Envoy Gateway.
func gatewayObjectsPending(objs []applied) (reason, msg string) {
	var conflict, rejected, pending []string
	for _, a := range objs {
		desc := fmt.Sprintf("%s %s/%s of Gateway %s", a.Kind, a.Namespace, a.Name, a.Gateway)
		if a.Message != "" {
			desc += ": " + a.Message
		}
		switch {
		case a.State == v1alpha1.AppliedStateConflict:
			conflict = append(conflict, desc)
		case a.State == v1alpha1.AppliedStateRejected:
			rejected = append(rejected, desc)
		case a.State == v1alpha1.AppliedStateNotInstalled,
			a.State == v1alpha1.AppliedStateApplied && a.Kind == gatewayconfig.EnvoyGatewayKind:
			pending = append(pending, desc)
		}
	}
	switch {
	case len(conflict) > 0:
		return v1alpha1.ReasonGatewayConfigConflict, "the manager cannot apply " + strings.Join(conflict, "; ")
	case len(rejected) > 0:
		return v1alpha1.ReasonGatewayConfigRejected, "refused: " + strings.Join(rejected, "; ")
	case len(pending) > 0:
		return v1alpha1.ReasonGatewayConfigPending, "not yet in place: " + strings.Join(pending, "; ")
	}
	return "", ""
}

// appliedSuffix names the gateway objects in place, for the Programmed
// message.
func appliedSuffix(objs []applied) string {
	if len(objs) == 0 {
		return ""
	}
	names := make([]string, len(objs))
	for i, a := range objs {
		names[i] = fmt.Sprintf("%s %s/%s", a.Kind, a.Namespace, a.Name)
	}
	return ", and the manager applied " + strings.Join(names, ", ")
}
