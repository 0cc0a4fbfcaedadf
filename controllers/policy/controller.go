// Package policy is the RateLimitPolicy controller of floodgate-manager.
//
// # What it does
//
// For every namespace that has RateLimitPolicies, it compiles all of them,
// with the pods they select and the CounterStore they use, into one
// document (see package compiler), writes it into the ConfigMap
// "floodgate-policies" of that namespace, which the namespace's sidecars
// watch, and reports each policy's status: Accepted, ResolvedRefs,
// Programmed and the number of targeted pods.
//
// # One reconcile per namespace
//
// The ConfigMap is per namespace but is built from several policies, so the
// reconcile key is the ConfigMap itself, <namespace>/floodgate-policies,
// not a policy. Every watched event maps to that key: a policy's create,
// spec change or delete; a pod's creation, deletion, label or readiness
// change; a CounterStore change (to every namespace whose policies use it,
// found through a cache index); and a change to the ConfigMap, so a manual
// edit or delete is undone. A namespace therefore has a single writer, and
// one reconcile sees every policy at once, which is what the document, the
// store choice and the replica counts need. Concurrent reconciles only ever
// work on different namespaces.
//
// # Ownership of the ConfigMap
//
// The ConfigMap carries an owner reference, not a controller reference, to
// every live policy of its namespace. The reconcile deletes the ConfigMap as
// soon as no policy has an entry; the owner references are the backstop:
// should the last policy go while the manager is down, the garbage
// collector removes the ConfigMap. The ConfigMap is written with
// server-side apply under the field owner "floodgate-manager", and only
// when its content, labels or owners differ from the desired ones, so an
// unchanged input causes no write.
//
// # Errors
//
// Transient API errors are returned and retried with the workqueue's
// exponential backoff. A reconcile whose only errors are write conflicts
// (the object changed under it) is computed again after 10-20 ms,
// outside that backoff: a conflict is not a failure, and a backoff grown
// during an API server outage would hold the next change back. A spec the compiler rejects is reported in the
// policy's Accepted condition and an Event, and the reconcile returns a
// reconcile.TerminalError for it, so it is not retried until something
// changes. Its earlier accepted generation, if any, keeps running.
package policy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/internal/statusupdate"
	"github.com/floodgate-dev/floodgate/controllers/policy/compiler"
	"github.com/floodgate-dev/floodgate/controllers/programmed"
	"github.com/floodgate-dev/floodgate/internal/message"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

const (
	// FieldOwner is the field manager of the ConfigMaps this controller
	// applies and of the policy statuses it updates.
	FieldOwner = "floodgate-manager"
	// ControllerName names the controller in logs, metrics and Events.
	ControllerName = "ratelimitpolicy"
	// ManagedByLabel is set to ManagedByValue on every ConfigMap this
	// controller writes. The manager's cache watches only ConfigMaps with
	// this label.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	// ManagedByValue is the value of ManagedByLabel.
	ManagedByValue = "floodgate-manager"
	// RevisionAnnotation holds the document's revision on the ConfigMap,
	// for people and tools that do not want to parse the document.
	RevisionAnnotation = "floodgate.dev/revision"

	// maxConditionMessage is the API's limit on a condition message.
	maxConditionMessage = 32768
	// maxEventNote is the API's limit on an Event note.
	maxEventNote = 1024
)

// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=ratelimitpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=ratelimitpolicies/status,verbs=update
// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=counterstores,verbs=get;list;watch
// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=clusterratelimitpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=configmaps,resourceNames=floodgate-policies,verbs=patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconciler reconciles the RateLimitPolicies of one namespace per call.
// Its fields are set before SetupWithManager and not changed afterwards;
// Reconcile is safe for concurrent use on different namespaces, which is
// all the workqueue ever asks of it.
type Reconciler struct {
	// Client reads through the manager's cache and writes to the API
	// server.
	Client client.Client
	// APIReader reads the ConfigMap from the API server itself. The
	// previous document decides what keeps running for a policy whose
	// new generation is rejected, so a cache that has not yet seen the
	// last write must not stand in for it.
	APIReader client.Reader
	// Recorder emits the Events on rejected policies.
	Recorder events.EventRecorder
	// Usage, when set, supplies the rules' counts over a recent window
	// (see package usage's Collector), for status.rules and status.usage.
	Usage UsageSource
}

// Reconcile compiles the namespace req.Namespace; req.Name is always
// config.ConfigMapName.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	ns := req.Namespace
	in, existing, err := r.observe(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	out, err := compiler.Compile(in)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("compile namespace %s: %w", ns, err)
	}
	specErr := r.reconcileSpec(ctx, ns, existing, in.Policies, out)
	statusErr := r.reconcileStatus(ctx, in.Policies, in.Pods, out, specErr)
	if err := errors.Join(specErr, statusErr); err != nil {
		if onlyConflicts(err) {
			// The objects changed under the writes: compute again from
			// the new copies soon. A conflict is not a failure, and the
			// workqueue's per-item backoff, grown by real failures during
			// an API server outage, would otherwise hold the next change
			// back for minutes.
			log.FromContext(ctx).V(1).Info("write conflict; computing again", "error", err)
			return ctrl.Result{RequeueAfter: conflictRetry + time.Duration(rand.Int64N(int64(conflictRetry)))}, nil
		}
		return ctrl.Result{}, err
	}

	var rejected []string
	missingRefs := false
	for _, res := range out.Policies {
		if !res.Accepted() {
			rejected = append(rejected, res.Name)
		}
		missingRefs = missingRefs || res.RefReason != ""
	}
	if len(rejected) > 0 {
		// Retrying cannot fix a spec: wait for the next change.
		return ctrl.Result{}, reconcile.TerminalError(fmt.Errorf("namespace %s: rejected RateLimitPolicies %s (see their Accepted condition)",
			ns, strings.Join(rejected, ", ")))
	}
	if missingRefs {
		// Secrets and ConfigMaps are not watched (the manager would have to
		// cache every one of the cluster): look again for the missing ones.
		return ctrl.Result{RequeueAfter: RefRecheckInterval}, nil
	}
	return ctrl.Result{}, nil
}

// conflictRetry is the least wait before a namespace whose writes met a
// conflict is computed again (up to as much again, at random, spreads the
// retries): about the workqueue's first backoff step, so that the newer
// copy is written as soon as the informer has it, and never longer.
const conflictRetry = 10 * time.Millisecond

// onlyConflicts reports whether every error joined or wrapped in err is
// a conflict (409): the write was refused because the object changed.
func onlyConflicts(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs := j.Unwrap()
		for _, e := range errs {
			if !onlyConflicts(e) {
				return false
			}
		}
		return len(errs) > 0
	}
	if u := errors.Unwrap(err); u != nil {
		return onlyConflicts(u)
	}
	return apierrors.IsConflict(err)
}

// RefRecheckInterval is how often a namespace is compiled again while a
// policy names a JWT key Secret or ConfigMap that does not exist.
const RefRecheckInterval = 30 * time.Second

// observe reads everything the compiler needs from the cache, and the
// current ConfigMap.
func (r *Reconciler) observe(ctx context.Context, ns string) (compiler.Input, *corev1.ConfigMap, error) {
	in := compiler.Input{Namespace: ns, Stores: map[string]*v1alpha1.CounterStore{}}

	var policies v1alpha1.RateLimitPolicyList
	if err := r.Client.List(ctx, &policies, client.InNamespace(ns)); err != nil {
		return in, nil, fmt.Errorf("list RateLimitPolicies in %s: %w", ns, err)
	}
	in.Policies = policies.Items
	var clusters v1alpha1.ClusterRateLimitPolicyList
	if err := r.Client.List(ctx, &clusters); err != nil {
		return in, nil, fmt.Errorf("list ClusterRateLimitPolicies: %w", err)
	}
	in.ClusterPolicies = clusters.Items
	if len(in.ClusterPolicies) > 0 {
		var namespace corev1.Namespace
		switch err := r.Client.Get(ctx, client.ObjectKey{Name: ns}, &namespace); {
		case apierrors.IsNotFound(err):
			// Being deleted: no cluster policy selects it any more.
			in.ClusterPolicies = nil
		case err != nil:
			return in, nil, fmt.Errorf("get Namespace %s: %w", ns, err)
		default:
			in.NamespaceLabels = namespace.Labels
		}
	}

	var cm corev1.ConfigMap
	existing := &cm
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.ConfigMapName}, &cm); apierrors.IsNotFound(err) {
		existing = nil
	} else if err != nil {
		return in, nil, fmt.Errorf("get ConfigMap %s/%s: %w", ns, config.ConfigMapName, err)
	}
	if existing != nil {
		if data, ok := existing.Data[config.DataKey]; ok {
			prev, err := config.Parse([]byte(data))
			if err != nil {
				// Not fatal: the document is rewritten from the policies.
				log.FromContext(ctx).Info("ignoring the unreadable document in the ConfigMap", "error", err.Error())
			} else {
				in.Previous = prev
			}
		}
	}
	if len(in.Policies) == 0 && len(in.ClusterPolicies) == 0 {
		return in, existing, nil
	}

	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return in, nil, fmt.Errorf("list pods in %s: %w", ns, err)
	}
	in.Pods = pods.Items

	objs, err := r.observeRefs(ctx, ns, in.Policies)
	if err != nil {
		return in, nil, err
	}
	in.Objects = objs
	names := make([]string, 0, len(in.Policies)+len(in.ClusterPolicies))
	for i := range in.Policies {
		names = append(names, in.Policies[i].StoreName())
	}
	for i := range in.ClusterPolicies {
		names = append(names, in.ClusterPolicies[i].StoreName())
	}
	for _, name := range names {
		if _, seen := in.Stores[name]; seen {
			continue
		}
		var cs v1alpha1.CounterStore
		switch err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &cs); {
		case apierrors.IsNotFound(err):
			in.Stores[name] = nil
		case err != nil:
			return in, nil, fmt.Errorf("get CounterStore %s: %w", name, err)
		default:
			in.Stores[name] = &cs
		}
	}
	return in, existing, nil
}

// observeRefs finds which of the Secrets and ConfigMaps the policies name
// for their JWT keys exist. It reads their metadata from the API server
// itself: the manager caches neither kind in full (the ConfigMap cache
// holds only its own ConfigMaps, and caching every Secret of the cluster
// would be costly and needless).
func (r *Reconciler) observeRefs(ctx context.Context, ns string, policies []v1alpha1.RateLimitPolicy) (*compiler.Objects, error) {
	objs := &compiler.Objects{Secrets: map[string]bool{}, ConfigMaps: map[string]bool{}}
	check := func(kind string, seen map[string]bool, name string) error {
		if _, done := seen[name]; done {
			return nil
		}
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(kind))
		switch err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); {
		case apierrors.IsNotFound(err):
			seen[name] = false
		case err != nil:
			return fmt.Errorf("get %s %s/%s: %w", kind, ns, name, err)
		default:
			seen[name] = true
		}
		return nil
	}
	for i := range policies {
		j := policies[i].Spec.JWT
		if j == nil || policies[i].DeletionTimestamp != nil {
			continue
		}
		if ref := j.HMACSecretRef; ref != nil {
			if err := check("Secret", objs.Secrets, ref.Name); err != nil {
				return nil, err
			}
		}
		if ref := j.JWKSConfigMapRef; ref != nil {
			if err := check("ConfigMap", objs.ConfigMaps, ref.Name); err != nil {
				return nil, err
			}
		}
	}
	return objs, nil
}

// reconcileSpec brings the ConfigMap to what the compiler decided.
func (r *Reconciler) reconcileSpec(ctx context.Context, ns string, existing *corev1.ConfigMap, policies []v1alpha1.RateLimitPolicy, out compiler.Output) error {
	if out.Action == compiler.Delete {
		if existing == nil {
			return nil
		}
		err := r.Client.Delete(ctx, existing, client.Preconditions{UID: &existing.UID})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ConfigMap %s/%s: %w", ns, config.ConfigMapName, err)
		}
		log.FromContext(ctx).Info("deleted the ConfigMap: no policy has an entry")
		return nil
	}

	owners := ownerReferences(policies, out.Clusters)
	if existing != nil && upToDate(existing, out, owners) {
		return nil
	}
	if err := r.Client.Apply(ctx, desiredConfigMap(ns, out, owners), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply ConfigMap %s/%s: %w", ns, config.ConfigMapName, err)
	}
	log.FromContext(ctx).Info("applied the ConfigMap", "revision", out.Config.Revision, "policies", len(out.Config.Policies))
	return nil
}

// ownerReferences points at every live policy, and every
// ClusterRateLimitPolicy whose entry the document holds, ordered by name.
func ownerReferences(policies []v1alpha1.RateLimitPolicy, clusters []compiler.ClusterResult) []metav1.OwnerReference {
	refs := make([]metav1.OwnerReference, 0, len(policies)+len(clusters))
	for _, c := range clusters {
		if c.CompiledGeneration == 0 {
			continue
		}
		refs = append(refs, metav1.OwnerReference{
			APIVersion: v1alpha1.GroupVersion.String(),
			Kind:       "ClusterRateLimitPolicy",
			Name:       c.Name,
			UID:        types.UID(c.UID),
		})
	}
	for i := range policies {
		p := &policies[i]
		if p.DeletionTimestamp != nil || p.GatewayEnforced() {
			continue
		}
		refs = append(refs, metav1.OwnerReference{
			APIVersion: v1alpha1.GroupVersion.String(),
			Kind:       "RateLimitPolicy",
			Name:       p.Name,
			UID:        p.UID,
		})
	}
	slices.SortFunc(refs, compareOwners)
	return refs
}

// compareOwners orders owner references by kind, then name.
func compareOwners(a, b metav1.OwnerReference) int {
	if c := strings.Compare(a.Kind, b.Kind); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// desiredConfigMap is the ConfigMap to apply.
func desiredConfigMap(ns string, out compiler.Output, owners []metav1.OwnerReference) *corev1ac.ConfigMapApplyConfiguration {
	cm := corev1ac.ConfigMap(config.ConfigMapName, ns).
		WithLabels(map[string]string{ManagedByLabel: ManagedByValue}).
		WithAnnotations(map[string]string{RevisionAnnotation: out.Config.Revision}).
		WithData(map[string]string{config.DataKey: out.Data})
	for _, o := range owners {
		cm.WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion(o.APIVersion).WithKind(o.Kind).WithName(o.Name).WithUID(o.UID))
	}
	return cm
}

// upToDate reports whether existing already holds what desiredConfigMap
// would apply.
func upToDate(existing *corev1.ConfigMap, out compiler.Output, owners []metav1.OwnerReference) bool {
	if existing.DeletionTimestamp != nil ||
		existing.Labels[ManagedByLabel] != ManagedByValue ||
		existing.Annotations[RevisionAnnotation] != out.Config.Revision ||
		len(existing.Data) != 1 || existing.Data[config.DataKey] != out.Data ||
		len(existing.BinaryData) != 0 {
		return false
	}
	have := slices.Clone(existing.OwnerReferences)
	slices.SortFunc(have, compareOwners)
	return slices.EqualFunc(have, owners, func(a, b metav1.OwnerReference) bool {
		return a.APIVersion == b.APIVersion && a.Kind == b.Kind && a.Name == b.Name && a.UID == b.UID &&
			a.Controller == nil && a.BlockOwnerDeletion == nil
	})
}

// reconcileStatus writes each live policy's status that desiredStatus
// computes, skipping those that did not change.
func (r *Reconciler) reconcileStatus(ctx context.Context, policies []v1alpha1.RateLimitPolicy, pods []corev1.Pod, out compiler.Output, specErr error) error {
	results := make(map[string]*compiler.PolicyResult, len(out.Policies))
	for i := range out.Policies {
		results[out.Policies[i].Name] = &out.Policies[i]
	}
	var errs []error
	for i := range policies {
		p := &policies[i]
		res, ok := results[p.Name]
		if !ok || p.DeletionTimestamp != nil {
			continue
		}
		status := desiredStatus(p, res, pods, out.Config, specErr, usageOf(r.Usage, p.Namespace, p.Name))
		if equality.Semantic.DeepEqual(p.Status, status) {
			continue
		}
		r.recordTransitions(p, status)
		updated := p.DeepCopy()
		updated.Status = status
		if err := statusupdate.Write(ctx, r.Client, p, updated, FieldOwner); err != nil {
			errs = append(errs, fmt.Errorf("update the status of RateLimitPolicy %s/%s: %w", p.Namespace, p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// desiredStatus is the status of p given the compiler's findings. It keeps
// each condition's lastTransitionTime while its status does not change.
func desiredStatus(p *v1alpha1.RateLimitPolicy, res *compiler.PolicyResult, pods []corev1.Pod, doc *config.Config, specErr error, usage *PolicyUsage) v1alpha1.RateLimitPolicyStatus {
	st := *p.Status.DeepCopy()
	st.ObservedGeneration = p.Generation
	st.TargetedPods = res.TargetedPods
	st.Store = res.Store
	st.ClusterRules = res.ClusterRules
	// The sidecars report the revision they enforce on their pods
	// (package programmed); the document holds an entry of the policy
	// whenever CompiledGeneration is set.
	var sidecars programmed.Result
	st.EnforcingPods = 0
	if doc != nil && res.CompiledGeneration != 0 {
		if sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector); err == nil {
			sidecars = programmed.EvaluatePolicy(p.Name, sel, pods, doc.Revision, p.Generation)
			st.EnforcingPods = sidecars.Enforcing
		}
	}
	st.Enforcing = fmt.Sprintf("%d/%d", st.EnforcingPods, st.TargetedPods)
	st.Rules = ruleStatuses(p, res, usage)
	st.Usage = nil
	if usage != nil {
		st.Usage = &v1alpha1.UsageStatus{Window: metav1.Duration{Duration: usage.Window}, Pods: usage.Pods}
	}
	set := func(typ string, ok bool, reason, msg string) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type:               typ,
			Status:             status,
			Reason:             reason,
			Message:            message.Truncate(msg, maxConditionMessage),
			ObservedGeneration: p.Generation,
		})
	}

	if res.Accepted() {
		set(v1alpha1.ConditionAccepted, true, v1alpha1.ReasonAccepted, "The spec is valid.")
	} else {
		set(v1alpha1.ConditionAccepted, false, v1alpha1.ReasonInvalid, invalidMessage(res))
	}
	refReason, refMessage := res.RefsCondition()
	set(v1alpha1.ConditionResolvedRefs, res.RefsResolved(), refReason, refMessage)

	switch {
	case specErr != nil && res.CompiledGeneration != 0:
		set(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonConfigMapError,
			fmt.Sprintf("Writing ConfigMap %s failed, retrying with backoff: %v", config.ConfigMapName, specErr))
	case res.LeftOut != "":
		set(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonDocumentFull, res.LeftOut)
	case res.CompiledGeneration == p.Generation && sidecars.Reason != "":
		set(v1alpha1.ConditionProgrammed, sidecars.Programmed, sidecars.Reason, sidecars.Message)
	case res.CompiledGeneration == p.Generation:
		set(v1alpha1.ConditionProgrammed, false, v1alpha1.ReasonWaitingForSidecars,
			fmt.Sprintf("Generation %d is compiled into ConfigMap %s; waiting for the sidecars of the targeted pods to report it loaded.",
				p.Generation, config.ConfigMapName))
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

// ruleStatuses reports on each rule of p: its mode, its counts over the
// usage window, and how it relates to a cluster default of its name. The
// usage section of the status goes with them.
func ruleStatuses(p *v1alpha1.RateLimitPolicy, res *compiler.PolicyResult, usage *PolicyUsage) []v1alpha1.RuleStatus {
	out := make([]v1alpha1.RuleStatus, 0, len(p.Spec.Rules))
	for i := range p.Spec.Rules {
		r := &p.Spec.Rules[i]
		rs := v1alpha1.RuleStatus{Name: r.Name, Mode: r.Mode}
		if rs.Mode == "" {
			rs.Mode = v1alpha1.ModeEnforce
		}
		if cd, ok := res.ClusterDefaults[r.Name]; ok {
			rs.ClusterDefault = &cd
		}
		if usage != nil {
			if c, ok := usage.Rules[r.Name]; ok {
				exempt := c.Exempt
				rs.Exempt = &exempt
				if rs.Mode == v1alpha1.ModeShadow {
					n := c.ShadowDenied
					rs.WouldHaveDenied = &n
				} else {
					n := c.Denied
					rs.Denied = &n
				}
			}
		}
		out = append(out, rs)
	}
	return out
}

func invalidMessage(res *compiler.PolicyResult) string {
	msgs := make([]string, len(res.Invalid))
	for i, e := range res.Invalid {
		msgs[i] = e.Error()
	}
	return "The spec is invalid: " + strings.Join(msgs, "; ")
}

// recordTransitions emits a Warning Event when the policy is newly rejected
// or newly fails to resolve its store, or when the reason changes.
func (r *Reconciler) recordTransitions(p *v1alpha1.RateLimitPolicy, next v1alpha1.RateLimitPolicyStatus) {
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
		action := "Validate"
		if typ == v1alpha1.ConditionResolvedRefs {
			action = "ResolveRefs"
		}
		r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, now.Reason, action, "%s",
			message.Truncate(fmt.Sprintf("Generation %d: %s", p.Generation, now.Message), maxEventNote))
	}
}

// requestFor is the reconcile key of namespace ns.
func requestFor(ns string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: config.ConfigMapName}}
}
