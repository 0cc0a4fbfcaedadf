// Package ratelimitservice is the controller of floodgate-manager that
// feeds the central rate-limit service, which gateways ask about each
// request.
//
// It compiles every RateLimitPolicy with a targetRef, of every namespace,
// into one document (compiler.CompileRateLimitService) in the ConfigMap
// config.RateLimitServiceConfigMapName of the service's namespace, which
// the service's replicas (floodgate-sidecar --kubernetes --configmap-name
// floodgate-ratelimit-policies --grpc-listen, the chart's
// floodgate-ratelimit Deployment) watch. It reports each such policy's
// status: Accepted and ResolvedRefs as for a policy that selects pods;
// Programmed when the service's replicas (the pods labelled
// config.RateLimitServicePodLabel) report the document's revision loaded;
// enforcingPods, the replicas that do; and status.target, what the manager
// found of the HTTPRoute, GRPCRoute or Gateway the policy names
// (targetedPods stays 0), and the gateway objects it applied (apply.go).
//
// There is a single reconcile key, the ConfigMap, because one document
// holds every such policy; every watched event maps to it. The ConfigMap
// has no owner references (the policies live in other namespaces); the
// reconcile deletes it when no policy has an entry.
package ratelimitservice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/internal/podstatus"
	"github.com/floodgate-dev/floodgate/controllers/internal/statusupdate"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/controllers/policy/compiler"
	"github.com/floodgate-dev/floodgate/controllers/programmed"
	"github.com/floodgate-dev/floodgate/controllers/sidecaraccess"
	"github.com/floodgate-dev/floodgate/internal/message"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// ControllerName names the controller in logs, metrics and Events.
const ControllerName = "ratelimitservice"

const (
	maxConditionMessage = 32768
	maxEventNote        = 1024
	maxListed           = 5
)

// It writes only in the manager's namespace, where the central service
// runs: its ConfigMaps floodgate-ratelimit-policies and
// floodgate-gateway-config (get, create and patch there come with the
// CounterStore controller's Role) and the Secret
// floodgate-ratelimit-store-auth.
//
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes;gateways,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=floodgate-system,resources=configmaps;secrets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",namespace=floodgate-system,resources=configmaps,resourceNames=floodgate-ratelimit-policies;floodgate-gateway-config,verbs=delete

// Reconciler compiles the central rate-limit service's document and the
// status of the policies in it. Its fields are set before
// SetupWithManager and not changed afterwards.
type Reconciler struct {
	// Client reads through the manager's cache and writes to the API
	// server.
	Client client.Client
	// APIReader reads the ConfigMap from the API server itself (see
	// policy.Reconciler.APIReader).
	APIReader client.Reader
	// Recorder emits the Events on rejected policies.
	Recorder events.EventRecorder
	// Namespace is the central service's namespace: where its ConfigMap
	// is written and its pods run.
	Namespace string
	// Service is where gateways reach the central service, for the
	// configuration the manager generates for them (GatewayConfigMapName).
	// With an empty Name, none is generated.
	Service gatewayconfig.Service
	// GatewayAPI is true when the cluster serves Gateway API HTTPRoutes
	// and Gateways; without them every target is reported missing.
	// SetupWithManager sets it from the API server's discovery.
	GatewayAPI bool
	// Apply says which Gateways the manager configures itself, applying
	// their generated objects (see GatewayApply).
	Apply GatewayApply

	// mapper tells which kinds the API server serves; watchKind starts a
	// watch of the manager's applied objects of a kind; log is the
	// controller's logger. SetupWithManager sets them.
	mapper    meta.RESTMapper
	watchKind func(schema.GroupVersionKind) error
	log       logr.Logger
	watchState
}

// Request is the controller's one reconcile key.
func (r *Reconciler) Request() reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.Namespace, Name: config.RateLimitServiceConfigMapName}}
}

// Reconcile compiles every policy with a targetRef; req is always
// r.Request().
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	in, existing, targets, err := r.observe(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	out, err := compiler.CompileRateLimitService(in)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("compile the central rate-limit service's document: %w", err)
	}
	specErr := r.reconcileSpec(ctx, existing, out)
	pending := errors.Is(specErr, sidecaraccess.ErrCredentialsPending)
	if pending {
		// The store has not given the service's namespace its user yet;
		// the document waits for the credentials it needs.
		log.FromContext(ctx).Info("waiting for the central rate-limit service's store user", "reason", specErr.Error())
		specErr = nil
	}
	notInstalled, statusErr := r.reconcileStatus(ctx, in, out, targets, specErr)
	if err := errors.Join(specErr, statusErr); err != nil {
		return ctrl.Result{}, err
	}
	var rejected []string
	for _, res := range out.Policies {
		if !res.Accepted() {
			rejected = append(rejected, res.Namespace+"/"+res.Name)
		}
	}
	if len(rejected) > 0 {
		return ctrl.Result{}, reconcile.TerminalError(fmt.Errorf("rejected RateLimitPolicies with a targetRef %s (see their Accepted condition)",
			strings.Join(rejected, ", ")))
	}
	if pending {
		return ctrl.Result{RequeueAfter: sidecaraccess.PendingRetry}, nil
	}
	if notInstalled {
		// A CRD installed later is found by the next look.
		return ctrl.Result{RequeueAfter: notInstalledRetry}, nil
	}
	return ctrl.Result{}, nil
}

// notInstalledRetry is how often the manager looks again for the CRD of a
// kind it would apply to a Gateway and the API server does not serve.
const notInstalledRetry = time.Minute

// targetObject is what the manager found of one policy's target: the
// HTTPRoute, the GRPCRoute or the Gateway it names, or none when it is
// missing (or the cluster serves no Gateway API, or no GRPCRoutes).
type targetObject struct {
	route *gatewayv1.HTTPRoute
	grpc  *gatewayv1.GRPCRoute
	gw    *gatewayv1.Gateway
}

// observe reads the compiler's input from the cache and the current
// ConfigMap from the API server, and returns the policies' targets by
// policy.
func (r *Reconciler) observe(ctx context.Context) (compiler.ServiceInput, *corev1.ConfigMap, map[types.NamespacedName]targetObject, error) {
	in := compiler.ServiceInput{Stores: map[string]*v1alpha1.CounterStore{}, Targets: map[string]v1alpha1.TargetStatus{}}
	targets := map[types.NamespacedName]targetObject{}
	var all v1alpha1.RateLimitPolicyList
	if err := r.Client.List(ctx, &all); err != nil {
		return in, nil, nil, fmt.Errorf("list RateLimitPolicies: %w", err)
	}
	for i := range all.Items {
		if all.Items[i].GatewayEnforced() {
			in.Policies = append(in.Policies, all.Items[i])
		}
	}

	var cm corev1.ConfigMap
	existing := &cm
	key := client.ObjectKey{Namespace: r.Namespace, Name: config.RateLimitServiceConfigMapName}
	if err := r.APIReader.Get(ctx, key, &cm); apierrors.IsNotFound(err) {
		existing = nil
	} else if err != nil {
		return in, nil, nil, fmt.Errorf("get ConfigMap %s: %w", key, err)
	}
	if existing != nil {
		if data, ok := existing.Data[config.DataKey]; ok {
			if prev, err := config.Parse([]byte(data)); err != nil {
				log.FromContext(ctx).Info("ignoring the unreadable document in the ConfigMap", "error", err.Error())
			} else {
				in.Previous = prev
			}
		}
	}
	if len(in.Policies) == 0 {
		return in, existing, targets, nil
	}

	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(r.Namespace),
		client.MatchingLabels{config.RateLimitServicePodLabel: "true"}); err != nil {
		return in, nil, nil, fmt.Errorf("list the central rate-limit service's pods in %s: %w", r.Namespace, err)
	}
	in.Pods = pods.Items

	for i := range in.Policies {
		name := in.Policies[i].StoreName()
		if _, seen := in.Stores[name]; seen {
			continue
		}
		var cs v1alpha1.CounterStore
		switch err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &cs); {
		case apierrors.IsNotFound(err):
			in.Stores[name] = nil
		case err != nil:
			return in, nil, nil, fmt.Errorf("get CounterStore %s: %w", name, err)
		default:
			in.Stores[name] = &cs
		}
	}
	for i := range in.Policies {
		p := &in.Policies[i]
		obj, err := r.observeTarget(ctx, p)
		if err != nil {
			return in, nil, nil, err
		}
		key := client.ObjectKeyFromObject(p)
		targets[key] = obj
		in.Targets[config.PolicyEntryValue(p.Namespace, p.Name)] = obj.status(*p.Spec.TargetRef)
	}
	return in, existing, targets, nil
}

// observeTarget reads the object p's targetRef names.
func (r *Reconciler) observeTarget(ctx context.Context, p *v1alpha1.RateLimitPolicy) (targetObject, error) {
	ref := *p.Spec.TargetRef
	key := client.ObjectKey{Namespace: p.Namespace, Name: ref.Name}
	switch {
	case !r.GatewayAPI:
		return targetObject{}, nil
	case ref.Kind == v1alpha1.KindHTTPRoute:
		var route gatewayv1.HTTPRoute
		switch err := r.Client.Get(ctx, key, &route); {
		case apierrors.IsNotFound(err):
			return targetObject{}, nil
		case err != nil:
			return targetObject{}, fmt.Errorf("get HTTPRoute %s: %w", key, err)
		}
		return targetObject{route: &route}, nil
	case ref.Kind == v1alpha1.KindGRPCRoute:
		var route gatewayv1.GRPCRoute
		switch err := r.Client.Get(ctx, key, &route); {
		case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
			// A cluster may serve HTTPRoutes and Gateways but not
			// GRPCRoutes (an older Gateway API, or its experimental
			// channel left out): the target is missing, and
			// SetupWithManager watches no GRPCRoutes.
			return targetObject{}, nil
		case err != nil:
			return targetObject{}, fmt.Errorf("get GRPCRoute %s: %w", key, err)
		}
		return targetObject{grpc: &route}, nil
	default:
		var gw gatewayv1.Gateway
		switch err := r.Client.Get(ctx, key, &gw); {
		case apierrors.IsNotFound(err):
			return targetObject{}, nil
		case err != nil:
			return targetObject{}, fmt.Errorf("get Gateway %s: %w", key, err)
		}
		return targetObject{gw: &gw}, nil
	}
}

// status is the status of a targetRef ref that names o.
func (o targetObject) status(ref v1alpha1.TargetReference) v1alpha1.TargetStatus {
	switch ref.Kind {
	case v1alpha1.KindHTTPRoute:
		return RouteTarget(ref, o.route)
	case v1alpha1.KindGRPCRoute:
		return GRPCRouteTarget(ref, o.grpc)
	}
	return GatewayTarget(ref, o.gw)
}

// reconcileSpec brings the ConfigMap to what the compiler decided.
func (r *Reconciler) reconcileSpec(ctx context.Context, existing *corev1.ConfigMap, out compiler.Output) error {
	key := r.Request().NamespacedName
	if out.Action == compiler.Delete {
		if existing == nil {
			return nil
		}
		if err := r.Client.Delete(ctx, existing, client.Preconditions{UID: &existing.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ConfigMap %s: %w", key, err)
		}
		log.FromContext(ctx).Info("deleted the central rate-limit service's ConfigMap: no policy has an entry")
		return nil
	}
	if err := r.mirrorCredentials(ctx, out.Config.Store); err != nil {
		return err
	}
	if existing != nil && existing.DeletionTimestamp == nil &&
		existing.Labels[policy.ManagedByLabel] == policy.ManagedByValue &&
		existing.Annotations[policy.RevisionAnnotation] == out.Config.Revision &&
		len(existing.Data) == 1 && existing.Data[config.DataKey] == out.Data && len(existing.BinaryData) == 0 {
		return nil
	}
	cm := corev1ac.ConfigMap(key.Name, key.Namespace).
		WithLabels(map[string]string{policy.ManagedByLabel: policy.ManagedByValue}).
		WithAnnotations(map[string]string{policy.RevisionAnnotation: out.Config.Revision}).
		WithData(map[string]string{config.DataKey: out.Data})
	if err := r.Client.Apply(ctx, cm, client.FieldOwner(policy.FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply ConfigMap %s: %w", key, err)
	}
	log.FromContext(ctx).Info("applied the central rate-limit service's ConfigMap", "revision", out.Config.Revision, "policies", len(out.Config.Policies))
	return nil
}

// mirrorCredentials copies the credentials of the document's store into
// the Secret config.RateLimitServiceStoreAuthSecret of the service's
// namespace, which its pods mount, before the document that needs them is
// written. They are what the sidecars of this version get
// (sidecaraccess.StoreCredentials): a managed store's user of the
// service's namespace, which may run the counter functions on that
// namespace's keys and nothing else, an external store's password, or
// none. When the CounterStore is gone the
// copy is left as it is.
func (r *Reconciler) mirrorCredentials(ctx context.Context, store config.Store) error {
	creds, ok, err := sidecaraccess.StoreCredentials(ctx, r.Client, r.APIReader, r.Namespace, r.Namespace, store)
	if err != nil || !ok {
		return err
	}
	data := creds.Data()
	key := client.ObjectKey{Namespace: r.Namespace, Name: config.RateLimitServiceStoreAuthSecret}
	var s corev1.Secret
	switch err := r.APIReader.Get(ctx, key, &s); {
	case err == nil && s.DeletionTimestamp == nil && s.Labels[policy.ManagedByLabel] == policy.ManagedByValue &&
		s.Annotations[sidecaraccess.StoreAnnotation] == store.Name && maps.EqualFunc(s.Data, data, bytes.Equal):
		return nil
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("get Secret %s: %w", key, err)
	}
	desired := corev1ac.Secret(key.Name, key.Namespace).
		WithLabels(map[string]string{policy.ManagedByLabel: policy.ManagedByValue}).
		WithAnnotations(map[string]string{sidecaraccess.StoreAnnotation: store.Name}).
		WithType(corev1.SecretTypeOpaque).
		WithData(data)
	if err := r.Client.Apply(ctx, desired, client.FieldOwner(policy.FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply Secret %s: %w", key, err)
	}
	log.FromContext(ctx).Info("mirrored the store credentials for the central rate-limit service", "store", store.Name, "user", creds.Username)
	return nil
}

// reconcileStatus publishes and applies the gateways' objects, and
// writes the status of every live policy with a targetRef. It reports
// whether a kind the manager would apply is not served.
func (r *Reconciler) reconcileStatus(ctx context.Context, in compiler.ServiceInput, out compiler.Output,
	targets map[types.NamespacedName]targetObject, specErr error,
) (bool, error) {
	results := make(map[types.NamespacedName]*compiler.PolicyResult, len(out.Policies))
	for i := range out.Policies {
		res := &out.Policies[i]
		results[types.NamespacedName{Namespace: res.Namespace, Name: res.Name}] = res
	}
	type live struct {
		p        *v1alpha1.RateLimitPolicy
		res      *compiler.PolicyResult
		target   v1alpha1.TargetStatus
		gateways []types.NamespacedName
	}
	var policies []live
	var atts []attachment
	owners := map[types.NamespacedName]*v1alpha1.RateLimitPolicy{}
	for i := range in.Policies {
		p := &in.Policies[i]
		res, ok := results[client.ObjectKeyFromObject(p)]
		if !ok || p.DeletionTimestamp != nil {
			continue
		}
		owners[client.ObjectKeyFromObject(p)] = p
		compiled, isCompiled := compiledPolicy(out.Config, p.Namespace, p.Name)
		target, pAtts := r.target(p, targets[client.ObjectKeyFromObject(p)], compiled)
		l := live{p: p, res: res, target: target}
		if isCompiled && r.Service.Name != "" {
			atts = append(atts, pAtts...)
			l.target.GatewayConfig = gatewayConfigKeys(target.Gateways)
			for _, a := range pAtts {
				if !slices.Contains(l.gateways, a.gateway) {
					l.gateways = append(l.gateways, a.gateway)
				}
			}
		}
		policies = append(policies, l)
	}
	var errs []error
	var state appliedState
	if r.Service.Name != "" && r.GatewayAPI {
		gens, err := r.publishGatewayConfig(ctx, atts)
		if err != nil {
			errs = append(errs, err)
		}
		// Without the whole view (gens is nil), nothing is applied or
		// pruned until the retry.
		if gens != nil || err == nil {
			if state, err = r.applyGatewayObjects(ctx, gens, owners); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, l := range policies {
		for _, gw := range l.gateways {
			if a, ok := state.byGateway[gw]; ok && len(l.target.AppliedObjects) < maxTargetGateways {
				l.target.AppliedObjects = append(l.target.AppliedObjects, a)
			}
		}
		status := DesiredStatus(l.p, l.res, l.target, in.Pods, out.Config, specErr)
		if equality.Semantic.DeepEqual(l.p.Status, status) {
			continue
		}
		r.recordRejection(l.p, status)
		updated := l.p.DeepCopy()
		updated.Status = status
		if err := statusupdate.Write(ctx, r.Client, l.p, updated, policy.FieldOwner); err != nil {
			errs = append(errs, fmt.Errorf("update the status of RateLimitPolicy %s/%s: %w", l.p.Namespace, l.p.Name, err))
		}
	}
	return state.notInstalled, errors.Join(errs...)
}

// target returns the status of p's target, obj, and the policy's
// attachments to Gateways, with pol as the gateway's view of its compiled
// entry.
func (r *Reconciler) target(p *v1alpha1.RateLimitPolicy, obj targetObject, pol gatewayconfig.Policy) (v1alpha1.TargetStatus, []attachment) {
	ref := *p.Spec.TargetRef
	st := obj.status(ref)
	switch {
	case !r.GatewayAPI:
		return st, nil
	case obj.route != nil:
		return st, routeAttachments(ref, pol, httpRoute(obj.route))
	case obj.grpc != nil:
		return st, routeAttachments(ref, pol, grpcRoute(obj.grpc))
	case obj.gw != nil && st.Found:
		key := client.ObjectKeyFromObject(obj.gw)
		return st, []attachment{{gateway: key, Attachment: gatewayconfig.Attachment{Policy: pol, Listener: ref.SectionName}}}
	}
	return st, nil
}

// DesiredStatus is the status of policy p, which has a targetRef, given
// the compiler's result, what was found of its target, the central
// service's pods and the document they should load. It keeps each
// condition's lastTransitionTime while its status does not change.
func DesiredStatus(p *v1alpha1.RateLimitPolicy, res *compiler.PolicyResult, target v1alpha1.TargetStatus,
	pods []corev1.Pod, doc *config.Config, specErr error,
) v1alpha1.RateLimitPolicyStatus {
	st := *p.Status.DeepCopy()
	st.ObservedGeneration = p.Generation
	st.TargetedPods = 0
	st.EnforcingPods = 0
	st.Target = &target
	set := func(typ string, ok bool, reason, msg string) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason,
			Message:            message.Truncate(msg, maxConditionMessage),
			ObservedGeneration: p.Generation,
		})
	}
	if res.Accepted() {
		set(v1alpha1.ConditionAccepted, true, v1alpha1.ReasonAccepted, "The spec is valid.")
	} else {
		msgs := make([]string, len(res.Invalid))
		for i, e := range res.Invalid {
			msgs[i] = e.Error()
		}
		set(v1alpha1.ConditionAccepted, false, v1alpha1.ReasonInvalid, "The spec is invalid: "+strings.Join(msgs, "; "))
	}
	set(v1alpha1.ConditionResolvedRefs, res.RefsResolved(), res.StoreReason, res.StoreMessage)

	st.Store = res.Store
	revision := ""
	if doc != nil && res.CompiledGeneration != 0 {
		revision = doc.Revision
	}
	loaded := evaluate(pods, revision, p.Name)
	st.EnforcingPods = loaded.enforcing
	// The replicas that have loaded it, of those running.
	st.Enforcing = fmt.Sprintf("%d/%d", loaded.enforcing, loaded.running)
	cm := config.RateLimitServiceConfigMapName
	switch {
	case specErr != nil && res.CompiledGeneration != 0:
		set(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonConfigMapError,
			fmt.Sprintf("Writing ConfigMap %s failed, retrying with backoff: %v", cm, specErr))
	case res.LeftOut != "":
		set(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonDocumentFull, res.LeftOut)
	case res.CompiledGeneration == p.Generation && loaded.programmed():
		loadedMsg := fmt.Sprintf("Generation %d is loaded by %d of %d replicas of the central rate-limit service", p.Generation, loaded.enforcing, loaded.running)
		if reason, msg := gatewayObjectsPending(target.AppliedObjects); reason != "" {
			set(v1alpha1.ConditionProgrammed, false, reason, loadedMsg+"; "+msg)
			break
		}
		set(v1alpha1.ConditionProgrammed, true, programmed.ReasonProgrammed, loadedMsg+appliedSuffix(target.AppliedObjects)+".")
	case res.CompiledGeneration == p.Generation:
		set(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonWaitingForRateLimitService,
			fmt.Sprintf("Generation %d is compiled into ConfigMap %s; %s", p.Generation, cm, loaded.waiting()))
	case res.CompiledGeneration != 0:
		set(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonPending,
			fmt.Sprintf("Generation %d cannot be compiled until it is Accepted and its CounterStore resolves; generation %d keeps running.",
				p.Generation, res.CompiledGeneration))
	default:
		set(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonPending,
			fmt.Sprintf("Generation %d cannot be compiled until it is Accepted and its CounterStore resolves; no generation of this policy is running.",
				p.Generation))
	}
	return st
}

// service is what the central service's replicas report of a revision.
type service struct {
	running, enforcing int32
	// lagging names the replicas that serve (Ready) or have reported, but
	// do not have the revision loaded.
	lagging []string
}

func (s service) programmed() bool { return s.enforcing > 0 && len(s.lagging) == 0 }

func (s service) waiting() string {
	switch {
	case s.running == 0:
		return "no replica of the central rate-limit service runs (install the chart with rateLimitService.enabled=true)."
	case len(s.lagging) == 0:
		return fmt.Sprintf("waiting for the %d replicas of the central rate-limit service, which are starting, to report it loaded.", s.running)
	}
	names := s.lagging
	more := ""
	if len(names) > maxListed {
		more = fmt.Sprintf(" and %d more", len(names)-maxListed)
		names = names[:maxListed]
	}
	return fmt.Sprintf("%d of %d replicas of the central rate-limit service have loaded it; waiting for %s%s.",
		s.enforcing, s.running, strings.Join(names, ", "), more)
}

// evaluate reads the policy-loaded condition of the service's pods for
// the policy named policy: a replica that loaded the revision but could
// not compile that policy (config.ReasonPartiallyLoaded, which lists the
// policies it left out by name) does not enforce it. An empty revision
// counts the running replicas only.
func evaluate(pods []corev1.Pod, revision, policy string) service {
	var s service
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		s.running++
		if programmed.EnforcesPolicy(pod, revision, policy) {
			s.enforcing++
			continue
		}
		reported := false
		for _, c := range pod.Status.Conditions {
			reported = reported || c.Type == config.ConditionPolicyLoaded
		}
		if podstatus.Ready(pod) || reported {
			s.lagging = append(s.lagging, pod.Name)
		}
	}
	return s
}

// recordRejection emits a Warning Event when the policy is newly rejected
// or newly fails to resolve its store.
func (r *Reconciler) recordRejection(p *v1alpha1.RateLimitPolicy, next v1alpha1.RateLimitPolicyStatus) {
	if r.Recorder == nil {
		return
	}
	for _, typ := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionResolvedRefs} {
		now := meta.FindStatusCondition(next.Conditions, typ)
		if now == nil || now.Status != metav1.ConditionFalse {
			continue
		}
		if before := meta.FindStatusCondition(p.Status.Conditions, typ); before != nil &&
			before.Status == now.Status && before.Reason == now.Reason && before.Message == now.Message {
			continue
		}
		r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, now.Reason, "Validate", "%s",
			message.Truncate(fmt.Sprintf("Generation %d: %s", p.Generation, now.Message), maxEventNote))
	}
}
