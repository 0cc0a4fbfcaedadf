// Package sidecaraccess gives the sidecars of each namespace what they
// need from the API server, and nothing more.
//
// For every namespace that has RateLimitPolicies or pods opted in to
// injection, it keeps:
//   - the Role "floodgate-sidecar": get, list and watch on the one
//     ConfigMap "floodgate-policies", and get and patch on pods/status;
//   - the RoleBinding "floodgate-sidecar", binding that Role to the
//     service accounts that the namespace's opted-in pods (and pods with
//     the sidecar) run as: a sidecar has its pod's own service account,
//     and no other service account of the namespace gets the Role;
//   - the Secret "floodgate-store-auth", a copy of the password of the
//     CounterStore that the namespace's ConfigMap names, under the key
//     "password" (empty for a store without a password), the store's
//     ACL user under "username" (a managed store) and the PEM bundle that
//     verifies an external store's TLS certificates under "ca.crt" (when
//     its tls.caSecretRef names one). Injected sidecars mount it as an
//     optional volume and read the files for every new connection, so a
//     changed password or CA bundle reaches them without a restart, once
//     the kubelet has updated the volume.
//
// A sidecar can read no other ConfigMap and no Secret: the password and
// the CA bundle reach it through the kubelet, as files.
//
// # Limits of RBAC
//
// RBAC cannot restrict pods/status to "the pod the sidecar runs in". The
// ValidatingAdmissionPolicy floodgate-sidecar-pod-status (config/rbac and
// the Helm chart) does, in every namespace that has the Role: a service
// account of the namespace may update only the status of the pod its token
// is bound to, and in it only the floodgate.dev/policy-loaded condition.
//
// # Lifecycle
//
// The objects are removed when the namespace has neither policies nor
// opted-in pods. The mirrored Secret is written once the namespace's
// ConfigMap names a store, and is kept (not deleted) while policies or
// opted-in pods remain, even if the ConfigMap goes away, so that pods
// keep starting. The source passwords are read uncached: a change to a
// managed store's Secret (which the manager's cache watches) triggers an
// update at once, a change to an external store's Secret within
// ResyncPeriod. Pods read the password when they start, so running pods
// keep the old one until they restart.
package sidecaraccess

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

const (
	// ControllerName names the controller in logs and metrics.
	ControllerName = "sidecaraccess"
	// FieldOwner is the server-side apply field manager.
	FieldOwner = "floodgate-manager"
	// ResyncPeriod bounds how long a changed external store password
	// takes to reach the mirrored Secrets.
	ResyncPeriod = 10 * time.Minute
	// PendingRetry is how soon a namespace whose store user has no
	// password yet is tried again, should the user Secret's own change
	// not be seen first.
	PendingRetry = time.Second
)

// In every namespace it writes only its own objects: the Role and
// RoleBinding floodgate-sidecar and the Secret floodgate-store-auth, by
// name (an object is created before it has a name, so create cannot be
// narrowed). It watches Roles and RoleBindings (metadata only) to repair
// them, and Secrets only in the manager's namespace, where the stores'
// credentials live. pods/status get and patch are never used: RBAC lets
// the manager grant them to the sidecars only while it holds them itself.
//
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=list;watch;create
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,resourceNames=floodgate-sidecar,verbs=get;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create
// +kubebuilder:rbac:groups="",resources=secrets,resourceNames=floodgate-store-auth,verbs=patch;delete
// +kubebuilder:rbac:groups="",namespace=floodgate-system,resources=secrets,verbs=list;watch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods/status,verbs=get;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=ratelimitpolicies;counterstores,verbs=get;list;watch

// Reconciler keeps one namespace's sidecar access per call. Its fields are
// set before SetupWithManager and not changed afterwards.
type Reconciler struct {
	// Client reads through the manager's cache and writes to the API
	// server.
	Client client.Client
	// APIReader reads, uncached, the Roles, RoleBindings and Secrets this
	// controller writes and the stores' source Secrets: the manager
	// caches only their metadata, so that no Secret's data is held in
	// memory.
	APIReader client.Reader
	// ManagerNamespace holds the managed stores' password Secrets; it is
	// never given sidecar access.
	ManagerNamespace string
}

// SetupWithManager registers the controller with mgr.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, opts controller.Options) error {
	if r.Client == nil || r.APIReader == nil {
		return errors.New("sidecaraccess: Client and APIReader are required")
	}
	if r.ManagerNamespace == "" {
		return errors.New("sidecaraccess: ManagerNamespace is empty")
	}
	toNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
	})
	toAll := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return r.namespacesWithConfig(ctx)
	})
	oursOnly := builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return ours(o.GetLabels()) }))
	// The objects this controller writes, and Secrets, are watched as
	// metadata only.
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		WithOptions(opts).
		Watches(&v1alpha1.RateLimitPolicy{}, toNamespace, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(event.UpdateEvent) bool { return false },
		})).
		Watches(&corev1.Pod{}, toNamespace, builder.WithPredicates(optedInPods())).
		Watches(&corev1.ConfigMap{}, toNamespace, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetName() == config.ConfigMapName
		}))).
		Watches(&rbacv1.Role{}, toNamespace, oursOnly, builder.OnlyMetadata).
		Watches(&rbacv1.RoleBinding{}, toNamespace, oursOnly, builder.OnlyMetadata).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			if o.GetNamespace() == r.ManagerNamespace {
				if tenant := o.GetLabels()[counterstore.UserNamespaceLabel]; tenant != "" {
					// One namespace's store user changed.
					return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: tenant}}}
				}
				// A store's Secret may have changed.
				return r.namespacesWithConfig(ctx)
			}
			if o.GetName() == SecretName && ours(o.GetLabels()) {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
			}
			return nil
		}), builder.OnlyMetadata).
		Watches(&v1alpha1.CounterStore{}, toAll).
		Complete(r)
}

// optedInPods passes the creation and deletion of pods that ask for, or
// have, the sidecar.
func optedInPods() predicate.Funcs {
	relevant := func(o client.Object) bool {
		pod, ok := o.(*corev1.Pod)
		return ok && (injection.OptedIn(pod) || injection.HasSidecar(pod))
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return relevant(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return relevant(e.Object) },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// namespacesWithConfig lists the namespaces that have a policies
// ConfigMap.
func (r *Reconciler) namespacesWithConfig(ctx context.Context) []reconcile.Request {
	var cms corev1.ConfigMapList
	if err := r.Client.List(ctx, &cms); err != nil {
		log.FromContext(ctx).Error(err, "listing the policies ConfigMaps")
		return nil
	}
	var reqs []reconcile.Request
	for _, cm := range cms.Items {
		if cm.Name == config.ConfigMapName {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: cm.Namespace}})
		}
	}
	return reqs
}

// Reconcile brings namespace req.Name's sidecar access to what its
// policies and pods need.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	ns := req.Name
	if ns == r.ManagerNamespace || slices.Contains(injection.SystemNamespaces, ns) {
		return ctrl.Result{}, nil
	}
	need, pods, err := r.needsAccess(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !need {
		return ctrl.Result{}, r.remove(ctx, ns)
	}
	if err := r.applyRBAC(ctx, ns, ServiceAccounts(pods)); err != nil {
		return ctrl.Result{}, ignoreTerminating(err)
	}
	if err := r.mirror(ctx, ns); errors.Is(err, ErrCredentialsPending) {
		log.FromContext(ctx).V(1).Info("waiting for the namespace's store user", "reason", err.Error())
		return ctrl.Result{RequeueAfter: PendingRetry}, nil
	} else if err != nil {
		return ctrl.Result{}, ignoreTerminating(err)
	}
	return ctrl.Result{RequeueAfter: ResyncPeriod}, nil
}

// needsAccess reports whether ns has policies or opted-in pods, and
// returns its opted-in pods and those with the sidecar.
func (r *Reconciler) needsAccess(ctx context.Context, ns string) (bool, []corev1.Pod, error) {
	var policies v1alpha1.RateLimitPolicyList
	if err := r.Client.List(ctx, &policies, client.InNamespace(ns)); err != nil {
		return false, nil, fmt.Errorf("list RateLimitPolicies in %s: %w", ns, err)
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return false, nil, fmt.Errorf("list pods in %s: %w", ns, err)
	}
	var ours []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && (injection.OptedIn(&p) || injection.HasSidecar(&p)) {
			ours = append(ours, p)
		}
	}
	need := len(ours) > 0 || slices.ContainsFunc(policies.Items, func(p v1alpha1.RateLimitPolicy) bool { return p.DeletionTimestamp == nil })
	return need, ours, nil
}

// applyRBAC writes the Role and RoleBinding where they differ; the binding
// names serviceAccounts, those of the pods that run sidecars.
func (r *Reconciler) applyRBAC(ctx context.Context, ns string, serviceAccounts []string) error {
	var role rbacv1.Role
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: RoleName}, &role)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get Role %s/%s: %w", ns, RoleName, err)
	}
	if err != nil || !roleUpToDate(&role) {
		if err := r.Client.Apply(ctx, DesiredRole(ns), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply Role %s/%s: %w", ns, RoleName, err)
		}
		log.FromContext(ctx).Info("applied the sidecar Role", "namespace", ns)
	}

	var binding rbacv1.RoleBinding
	err = r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: RoleName}, &binding)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get RoleBinding %s/%s: %w", ns, RoleName, err)
	}
	if err == nil && !roleRefOK(&binding) {
		// roleRef is immutable: replace the binding.
		if err := r.Client.Delete(ctx, &binding, client.Preconditions{UID: &binding.UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete RoleBinding %s/%s with a foreign roleRef: %w", ns, RoleName, err)
		}
	}
	if err != nil || !bindingUpToDate(&binding, serviceAccounts) {
		if err := r.Client.Apply(ctx, DesiredRoleBinding(ns, serviceAccounts), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply RoleBinding %s/%s: %w", ns, RoleName, err)
		}
		log.FromContext(ctx).Info("applied the sidecar RoleBinding", "namespace", ns)
	}
	return nil
}

// mirror copies the credentials of the store that ns's ConfigMap names.
func (r *Reconciler) mirror(ctx context.Context, ns string) error {
	var cm corev1.ConfigMap
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.ConfigMapName}, &cm); apierrors.IsNotFound(err) {
		return nil // no store chosen yet; keep any earlier copy
	} else if err != nil {
		return fmt.Errorf("get ConfigMap %s/%s: %w", ns, config.ConfigMapName, err)
	}
	doc, err := config.Parse([]byte(cm.Data[config.DataKey]))
	if err != nil {
		// The policy controller rewrites an unreadable document, and
		// that write triggers this reconcile again.
		log.FromContext(ctx).V(1).Info("not mirroring the store password: the policies document is unreadable", "error", err.Error())
		return nil //nolint:nilerr // not this controller's error to retry
	}
	if doc.Store.Type != config.StoreRedis {
		return nil // a memory store needs no password
	}
	creds, ok, err := StoreCredentials(ctx, r.Client, r.APIReader, r.ManagerNamespace, ns, doc.Store)
	if err != nil || !ok {
		return err
	}
	var s corev1.Secret
	err = r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: SecretName}, &s)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get Secret %s/%s: %w", ns, SecretName, err)
	}
	if err == nil && secretUpToDate(&s, doc.Store.Name, creds) {
		return nil
	}
	if err := r.Client.Apply(ctx, DesiredSecret(ns, doc.Store.Name, creds), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply Secret %s/%s: %w", ns, SecretName, err)
	}
	log.FromContext(ctx).Info("mirrored the store credentials", "namespace", ns, "store", doc.Store.Name, "user", creds.Username)
	return nil
}

// ErrCredentialsPending is StoreCredentials' error while a managed store's
// controller has not yet given a namespace's store user a password that
// every node accepts: try again shortly (the user Secret's change also
// triggers the manager's watches).
var ErrCredentialsPending = errors.New("the namespace's store user has no password yet")

// StoreCredentials returns what the sidecars of namespace ns authenticate
// to store with: a managed store's user of ns (counterstore.NamespaceUser),
// whose ACL rules allow the counter functions on ns's keys and the cluster
// topology, and nothing else; an external store's passwordSecretRef and the
// CA bundle of its tls.caSecretRef; or no password. c reads the
// CounterStore (a cache will do) and creates ns's user Secret of a
// managed store when it is missing; apiReader reads the Secrets from the
// API server, as the manager caches no Secret's data; managerNS holds a
// managed store's Secrets. ok is false when the CounterStore is gone. A
// managed store's admin password is never returned, whatever runs in the
// namespace; until ns's user has a password the error wraps
// ErrCredentialsPending. The central rate-limit service, which runs the
// sidecar binary and the same functions, authenticates with these too, as
// the user of its own namespace, managerNS.
func StoreCredentials(ctx context.Context, c client.Client, apiReader client.Reader, managerNS, ns string, store config.Store) (creds Credentials, ok bool, err error) {
	var cs v1alpha1.CounterStore
	if err := c.Get(ctx, client.ObjectKey{Name: store.Name}, &cs); apierrors.IsNotFound(err) {
		return Credentials{}, false, nil
	} else if err != nil {
		return Credentials{}, false, fmt.Errorf("get CounterStore %s: %w", store.Name, err)
	}
	read := func(sns, name string) (*corev1.Secret, error) {
		var s corev1.Secret
		if err := apiReader.Get(ctx, client.ObjectKey{Namespace: sns, Name: name}, &s); err != nil {
			return nil, fmt.Errorf("read the credentials of CounterStore %s from Secret %s/%s: %w", store.Name, sns, name, err)
		}
		return &s, nil
	}
	switch {
	case cs.Spec.Managed != nil:
		// Only ns's own user: the store's admin password never leaves
		// the manager's namespace, whatever runs in ns.
		name := counterstore.UserSecretName(store.Name, ns)
		s, err := read(managerNS, name)
		if apierrors.IsNotFound(err) {
			if err := c.Create(ctx, counterstore.NewUserSecret(&cs, managerNS, ns)); err != nil && !apierrors.IsAlreadyExists(err) {
				return Credentials{}, false, fmt.Errorf("create the store user Secret %s/%s of namespace %s: %w", managerNS, name, ns, err)
			}
			log.FromContext(ctx).Info("asked for a namespace's store user", "namespace", ns, "store", store.Name, "secret", name)
			return Credentials{}, false, fmt.Errorf("CounterStore %s, namespace %s: %w", store.Name, ns, ErrCredentialsPending)
		}
		if err != nil {
			return Credentials{}, false, err
		}
		pw := s.Data[counterstore.UserPasswordKey]
		if len(pw) == 0 {
			return Credentials{}, false, fmt.Errorf("CounterStore %s, namespace %s (Secret %s/%s): %w", store.Name, ns, managerNS, name, ErrCredentialsPending)
		}
		return Credentials{Username: counterstore.NamespaceUser(ns), Password: pw}, true, nil
	case cs.Spec.External != nil:
		creds := Credentials{Password: []byte{}}
		if ref := cs.Spec.External.PasswordSecretRef; ref != nil {
			s, err := read(ref.Namespace, ref.Name)
			if err != nil {
				return Credentials{}, false, err
			}
			pw, found := s.Data[ref.Key]
			if !found {
				return Credentials{}, false, fmt.Errorf("the password Secret %s/%s of CounterStore %s has no key %q", ref.Namespace, ref.Name, store.Name, ref.Key)
			}
			creds.Password = pw
		}
		if t := cs.Spec.External.TLS; t != nil && t.CASecretRef != nil {
			ref := t.CASecretRef
			s, err := read(ref.Namespace, ref.Name)
			if err != nil {
				return Credentials{}, false, err
			}
			if creds.CA = s.Data[ref.Key]; len(creds.CA) == 0 {
				return Credentials{}, false, fmt.Errorf("the CA Secret %s/%s of CounterStore %s has no key %q", ref.Namespace, ref.Name, store.Name, ref.Key)
			}
		}
		return creds, true, nil
	}
	return Credentials{Password: []byte{}}, true, nil
}

// remove deletes this controller's objects from ns, and ns's store users'
// Secrets from the manager's namespace (the stores' controller then
// deletes the users from the nodes).
func (r *Reconciler) remove(ctx context.Context, ns string) error {
	var errs []error
	var users corev1.SecretList
	if err := r.APIReader.List(ctx, &users, client.InNamespace(r.ManagerNamespace), client.MatchingLabels{counterstore.UserNamespaceLabel: ns}); err != nil {
		errs = append(errs, fmt.Errorf("list the store users of %s: %w", ns, err))
	}
	for i := range users.Items {
		u := &users.Items[i]
		if u.Labels[counterstore.UserStoreLabel] == "" || u.DeletionTimestamp != nil {
			continue
		}
		if err := r.Client.Delete(ctx, u, client.Preconditions{UID: &u.UID}); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("delete the store user Secret %s/%s of %s: %w", r.ManagerNamespace, u.Name, ns, err))
			continue
		}
		log.FromContext(ctx).Info("removed a namespace's store user: no policy or opted-in pod is left", "namespace", ns, "store", u.Labels[counterstore.UserStoreLabel])
	}
	for _, obj := range []client.Object{
		&rbacv1.RoleBinding{}, &rbacv1.Role{}, &corev1.Secret{},
	} {
		name := RoleName
		if _, ok := obj.(*corev1.Secret); ok {
			name = SecretName
		}
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
			errs = append(errs, client.IgnoreNotFound(err))
			continue
		}
		if !ours(obj.GetLabels()) || obj.GetDeletionTimestamp() != nil {
			continue
		}
		uid := obj.GetUID()
		if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("delete %T %s/%s: %w", obj, ns, name, err))
			continue
		}
		log.FromContext(ctx).Info("removed sidecar access: no policy or opted-in pod is left", "namespace", ns, "object", name)
	}
	return errors.Join(errs...)
}

// ignoreTerminating drops the error of a write into a namespace being
// deleted: its objects go with it.
func ignoreTerminating(err error) error {
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return nil
	}
	return err
}
