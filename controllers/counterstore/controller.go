// Package counterstore is the CounterStore controller of floodgate-manager.
//
// # Managed stores
//
// For a CounterStore with spec.managed, it runs a Redis Cluster in the
// manager's namespace (Options.Namespace, "floodgate-system" by default):
// a cluster-scoped owner needs its children in some namespace. The objects
// are built by pure functions (objects.go), carry a controller reference to
// the CounterStore, and are written with server-side apply under the field
// owner "floodgate-manager":
//
//   - the Secret counterstore-<name>-auth with the generated password of
//     the default user (the manager's admin user, also used for
//     replication and the probes; deleting the Secret rotates it, which
//     rolls every Pod and so re-forms the cluster, counters reset);
//   - the passwords of the namespaces' users (NamespaceUser, restricted to
//     the counter functions on their namespace's keys), in the user
//     Secrets that the sidecaraccess controller asks for
//     (UserSecretName): generated, set on the running nodes (ACL SETUSER)
//     before they are written, and rotated on floodgate.dev/rotate with
//     the old one accepted for Options.PasswordOverlap more, so that no
//     call fails while the new one reaches the sidecars; and the counter
//     functions' library, loaded on every master (syncUsers);
//   - the ConfigMap counterstore-<name>-config with redis.conf (cluster
//     mode, no persistence);
//   - the headless Service and the PodDisruptionBudget counterstore-<name>;
//   - the NetworkPolicy counterstore-<name>, unless spec.managed.networkPolicy
//     is Disabled: only the injected sidecars of the namespaces whose
//     policies use the store (kept up to date from their policies
//     ConfigMaps, ServedNamespaces), the manager's Pods and the store's own
//     Pods reach the Redis Pods;
//   - the StatefulSet counterstore-<name> of Shards*(1+ReplicasPerShard)
//     redis-server Pods, each announcing its Pod IP.
//
// The cluster is then formed and healed over the Redis protocol by package
// formation, from the Pods' status.podIP: the controller must be able to
// dial the Pods. Each reconcile runs one formation pass (observe, plan,
// act) and requeues after Options.ProgressPeriod until the cluster has the
// wanted shape, then every Options.ResyncPeriod to notice failures that no
// Kubernetes event announces. When Shards or ReplicasPerShard shrink, the
// StatefulSet keeps its leaving Pods until formation has drained them (no
// slot left on them), and only then scales down.
//
// # External stores
//
// For spec.external, the controller only observes: it connects to the seed
// addresses (with the password and TLS settings of the spec), follows the
// cluster's view to every node, and reports the health. It never changes an
// external cluster.
//
// # Status
//
// Ready is True when the cluster is formed, every slot is covered by a
// master the manager reaches, and every serving master reports
// cluster_state:ok; the policy controller compiles a store into the
// sidecars' config only then. Degraded is True when a Ready store lost
// redundancy. Endpoints are the masters' addresses (for an external
// store, its seed addresses), AuthSecretName the name of the Secret that
// holds the sidecars' credentials in their own namespaces,
// floodgate-store-auth, which package sidecaraccess keeps.
package counterstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore/formation"
	"github.com/floodgate-dev/floodgate/controllers/internal/statusupdate"
	"github.com/floodgate-dev/floodgate/internal/message"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
)

const (
	// ControllerName names the controller in logs, metrics and Events.
	ControllerName = "counterstore"
	// FieldOwner is the field manager of every object the controller
	// applies and of the store statuses it updates.
	FieldOwner = "floodgate-manager"

	// maxEndpoints is the API's limit on status.endpoints: seeds, not the
	// whole cluster.
	maxEndpoints = 32
	// maxConditionMessage bounds condition messages well below the API's
	// limit; they are for people.
	maxConditionMessage = 2048
	// maxEventNote is the API's limit on an Event note.
	maxEventNote = 1024
)

// Reasons of the CounterStore conditions.
const (
	// ReasonClusterReady: Ready, every slot is served.
	ReasonClusterReady = "ClusterReady"
	// ReasonForming: the cluster is not formed yet (no slot assigned).
	ReasonForming = "Forming"
	// ReasonSlotsUncovered: some slots have no reachable master.
	ReasonSlotsUncovered = "SlotsUncovered"
	// ReasonClusterDown: a master reports cluster_state:fail.
	ReasonClusterDown = "ClusterDown"
	// ReasonUnreachable: no node answers.
	ReasonUnreachable = "Unreachable"
	// ReasonInvalidSpec: the spec has a problem the API schema cannot
	// catch.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonSecretError: the password Secret is missing or unusable.
	ReasonSecretError = "SecretError"
	// ReasonApplyError: writing a child object failed; retried.
	ReasonApplyError = "ApplyError"
	// ReasonFullyRedundant: Degraded is False.
	ReasonFullyRedundant = "FullyRedundant"
	// ReasonRedundancyLost: Degraded is True.
	ReasonRedundancyLost = "RedundancyLost"
	// ReasonNotReady: Degraded is Unknown while the store is not Ready.
	ReasonNotReady = "NotReady"
)

// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=counterstores,verbs=get;list;watch
// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=counterstores/status,verbs=update
// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=ratelimitpolicies,verbs=get;list;watch
// The namespaces' policies ConfigMaps say which namespaces each store
// serves (its NetworkPolicy admits their sidecars).
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
//
// The managed stores' objects live in the manager's namespace only
// (floodgate-system here; the Helm chart binds this Role in its release
// namespace), and the cache watches them there only (app.CacheOptions).
// Secrets elsewhere are read one by one: an external store's
// passwordSecretRef and caSecretRef, which may name any namespace.
//
// +kubebuilder:rbac:groups=apps,namespace=floodgate-system,resources=statefulsets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",namespace=floodgate-system,resources=services;configmaps,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",namespace=floodgate-system,resources=secrets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=policy,namespace=floodgate-system,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=networking.k8s.io,namespace=floodgate-system,resources=networkpolicies,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconciler reconciles one CounterStore per call. Its fields are set
// before SetupWithManager and not changed afterwards. Reconcile is safe for
// concurrent use on different stores; the workqueue never runs two
// reconciles of one store at once, which formation relies on.
type Reconciler struct {
	// Client reads through the manager's cache and writes to the API
	// server.
	Client client.Client
	// APIReader reads Secrets, which the cache holds only as metadata.
	APIReader client.Reader
	// Recorder emits Events about formation steps and failures.
	Recorder events.EventRecorder
	// Options tune the controller; zero fields take their defaults.
	Options Options
	// Metrics export each store's status.
	Metrics *Metrics
}

// observation is what reconcileSpec learned, for reconcileStatus.
type observation struct {
	// failReason is set when the store could not even be observed; it
	// becomes Ready's reason, with failMessage.
	failReason, failMessage string
	// snapshot is nil when the store could not be observed.
	snapshot *formation.Snapshot
	health   formation.Health
	pass     *formation.Pass
	outcome  formation.Outcome
	// endpoints and authSecret are what the status publishes.
	endpoints  []string
	authSecret string
	// expires is when the earliest previous namespace password stops
	// being accepted, during a rotation: the next reconcile must come by
	// then.
	expires time.Time
	// waitForUser: nothing will change until the user acts; resync slowly.
	waitForUser bool
}

// Reconcile brings one CounterStore's objects and Redis Cluster toward its
// spec and reports what it found.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	var cs v1alpha1.CounterStore
	if err := r.Client.Get(ctx, req.NamespacedName, &cs); err != nil {
		if apierrors.IsNotFound(err) {
			r.Metrics.forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cs.DeletionTimestamp.IsZero() {
		// The children carry owner references: the garbage collector
		// removes them. Nothing outside the API server needs cleaning.
		r.Metrics.forget(cs.Name)
		return ctrl.Result{}, nil
	}
	o := r.Options.withDefaults()
	obs, specErr := r.reconcileSpec(ctx, &cs, o)
	statusErr := r.reconcileStatus(ctx, &cs, obs, specErr)
	if err := errors.Join(specErr, statusErr); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: obs.requeueAfter(o, time.Now())}, nil
}

func (obs *observation) requeueAfter(o Options, now time.Time) time.Duration {
	d := obs.requeuePeriod(o)
	if !obs.expires.IsZero() {
		d = max(time.Millisecond, min(d, obs.expires.Sub(now)+time.Second))
	}
	return d
}

func (obs *observation) requeuePeriod(o Options) time.Duration {
	switch {
	case obs.waitForUser:
		return o.ResyncPeriod
	case obs.outcome.Incomplete:
		return time.Millisecond // a migration stopped at its budget: go on
	case obs.pass != nil && obs.pass.Converged() && obs.health.Ready() && !obs.health.Degraded():
		return o.ResyncPeriod
	case obs.pass == nil && obs.health.Ready() && !obs.health.Degraded():
		return o.ResyncPeriod // a healthy external store
	}
	return o.ProgressPeriod
}

func (r *Reconciler) reconcileSpec(ctx context.Context, cs *v1alpha1.CounterStore, o Options) (*observation, error) {
	switch {
	case cs.Spec.Managed != nil && cs.Spec.External == nil:
		return r.reconcileManaged(ctx, cs, o)
	case cs.Spec.External != nil && cs.Spec.Managed == nil:
		return r.reconcileExternal(ctx, cs, o)
	}
	err := errors.New("spec: set exactly one of managed or external")
	return &observation{failReason: ReasonInvalidSpec, failMessage: err.Error()}, reconcile.TerminalError(err)
}

// validateManaged checks what the CRD schema checks too, so that an object
// stored before the schema had a rule still gets a clear error.
func validateManaged(cs *v1alpha1.CounterStore) error {
	m := cs.Spec.Managed
	var errs []error
	if len(cs.Name) > 39 || !dnsLabel.MatchString(cs.Name) {
		errs = append(errs, fmt.Errorf("metadata.name: a managed store's name must be a DNS label of at most 39 characters, got %q", cs.Name))
	}
	if m.Shards < 1 || m.Shards > 128 {
		errs = append(errs, fmt.Errorf("spec.managed.shards: must be between 1 and 128, got %d", m.Shards))
	}
	if m.ReplicasPerShard < 0 || m.ReplicasPerShard > 5 {
		errs = append(errs, fmt.Errorf("spec.managed.replicasPerShard: must be between 0 and 5, got %d", m.ReplicasPerShard))
	}
	if t := nodeTimeout(m); t < time.Second || t > time.Minute {
		errs = append(errs, fmt.Errorf("spec.managed.nodeTimeout: must be between 1s and 60s, got %v", t))
	}
	return errors.Join(errs...)
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func (r *Reconciler) reconcileManaged(ctx context.Context, cs *v1alpha1.CounterStore, o Options) (*observation, error) {
	if err := validateManaged(cs); err != nil {
		return &observation{failReason: ReasonInvalidSpec, failMessage: err.Error()}, reconcile.TerminalError(err)
	}
	m := cs.Spec.Managed
	ns := o.Namespace

	creds, err := r.ensureCredentials(ctx, cs, ns)
	if err != nil {
		obs := &observation{failReason: ReasonSecretError, failMessage: err.Error()}
		if errors.Is(err, errBadPassword) {
			obs.waitForUser = true
			return obs, nil
		}
		return obs, err
	}
	password := creds.Admin
	for _, obj := range []client.Object{DesiredConfigMap(cs, ns), DesiredService(cs, ns), DesiredPDB(cs, ns)} {
		if err := r.apply(ctx, obj); err != nil {
			return &observation{failReason: ReasonApplyError, failMessage: err.Error()}, err
		}
	}
	if err := r.syncNetworkPolicy(ctx, cs, ns); err != nil {
		return &observation{failReason: ReasonApplyError, failMessage: err.Error()}, err
	}

	var sts appsv1.StatefulSet
	current := 0
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: ObjectName(cs.Name)}, &sts); {
	case err == nil:
		if sts.Spec.Replicas != nil {
			current = int(*sts.Spec.Replicas)
		}
	case !apierrors.IsNotFound(err):
		return &observation{failReason: ReasonApplyError, failMessage: err.Error()}, fmt.Errorf("get StatefulSet %s/%s: %w", ns, ObjectName(cs.Name), err)
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels(SelectorLabels(cs.Name))); err != nil {
		return &observation{failReason: ReasonApplyError, failMessage: err.Error()}, fmt.Errorf("list the Pods of CounterStore %s: %w", cs.Name, err)
	}
	desired := TotalNodes(m)
	spec := formation.Spec{
		Shards:           int(m.Shards),
		ReplicasPerShard: int(m.ReplicasPerShard),
		Members:          Members(pods.Items, ObjectName(cs.Name), desired, current),
	}

	sess := formation.NewSession(formation.Dialer{Password: password, Timeout: o.DialTimeout})
	defer func() { _ = sess.Close() }() // closing idle connections; nothing to report
	res, formErr := sess.Reconcile(ctx, spec, o.MigrateBudget)
	if formErr != nil && res.Snapshot == nil {
		return &observation{failReason: ReasonUnreachable, failMessage: formErr.Error()}, formErr
	}
	r.recordPass(ctx, cs, res, formErr)

	// Shrink only once the leaving Pods hold nothing.
	replicas := desired
	if current > desired && !res.Pass.Drained {
		replicas = current
	}
	if err := r.apply(ctx, DesiredStatefulSet(cs, ns, int32(replicas), password)); err != nil {
		return &observation{failReason: ReasonApplyError, failMessage: err.Error()}, err
	}
	expires, usersErr := r.syncUsers(ctx, cs, ns, sess, res.Snapshot, o)

	h := formation.Assess(res.Snapshot, int(m.ReplicasPerShard))
	return &observation{
		snapshot:   res.Snapshot,
		health:     h,
		pass:       res.Pass,
		outcome:    res.Outcome,
		endpoints:  h.Masters,
		authSecret: config.StoreAuthSecret,
		expires:    expires,
	}, errors.Join(formErr, usersErr)
}

// syncNetworkPolicy applies the store's NetworkPolicy, with the
// namespaces it serves now, or deletes it when the spec disables it.
func (r *Reconciler) syncNetworkPolicy(ctx context.Context, cs *v1alpha1.CounterStore, ns string) error {
	if NetworkPolicyEnabled(cs.Spec.Managed) {
		served, err := ServedNamespaces(ctx, r.Client, cs.Name)
		if err != nil {
			return err
		}
		return r.apply(ctx, DesiredNetworkPolicy(cs, ns, served))
	}
	var np networkingv1.NetworkPolicy
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: ObjectName(cs.Name)}, &np); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("get NetworkPolicy %s/%s: %w", ns, ObjectName(cs.Name), err)
	case !metav1.IsControlledBy(&np, cs):
		return nil // not ours
	}
	if err := r.Client.Delete(ctx, &np, client.Preconditions{UID: &np.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete NetworkPolicy %s/%s: %w", ns, np.Name, err)
	}
	log.FromContext(ctx).Info("deleted the store's NetworkPolicy: the spec disables it", "store", cs.Name)
	return nil
}

// ownUserSecret reports whether sec is a namespace user's Secret of cs, as
// NewUserSecret makes it.
func (r *Reconciler) ownUserSecret(cs *v1alpha1.CounterStore, sec *corev1.Secret) bool {
	tenant := sec.Labels[UserNamespaceLabel]
	return sec.DeletionTimestamp == nil && dnsLabel.MatchString(tenant) && metav1.IsControlledBy(sec, cs) && sec.Name == UserSecretName(cs.Name, tenant)
}

// syncUsers gives the store's masters the counter functions' library, and
// every reachable node the users of the namespaces that have a user Secret
// (UserSecretLabels), with the passwords each one's Secret holds or, when
// it needs a new one (a new namespace, a rotation request, the end of a
// rotation's overlap), the ones it should hold: those are written to the
// Secret only once every reachable node accepts them, so that no sidecar
// is given a password a node refuses. Users of namespaces without a Secret
// any more, and the one shared sidecar user of earlier releases, are
// deleted. It returns when the earliest previous password expires (zero
// outside a rotation), when the next reconcile must come.
//
// It runs after every formation pass, on the nodes that pass observed: a
// new node is met in one pass and given slots in a later one (the others
// must learn of it by gossip first), so it has the users and the library
// before it serves a slot.
func (r *Reconciler) syncUsers(ctx context.Context, cs *v1alpha1.CounterStore, ns string, sess *formation.Session, snap *formation.Snapshot, o Options) (time.Time, error) {
	var addrs, masters []string
	for _, n := range snap.Nodes {
		if !n.Reachable {
			continue
		}
		addrs = append(addrs, n.Addr)
		if n.Self.Flags&formation.FlagMaster != 0 {
			masters = append(masters, n.Addr)
		}
	}
	var errs []error
	name, src := redislayout.Library()
	if loaded, err := sess.EnsureLibrary(ctx, masters, name, src); err != nil {
		errs = append(errs, fmt.Errorf("counter functions: %w", err))
	} else if len(loaded) > 0 {
		log.FromContext(ctx).Info("loaded the counter functions", "library", name, "nodes", loaded)
	}

	var secrets corev1.SecretList
	if err := r.APIReader.List(ctx, &secrets, client.InNamespace(ns), client.MatchingLabels{UserStoreLabel: cs.Name}); err != nil {
		return time.Time{}, errors.Join(append(errs, fmt.Errorf("list the namespace users' Secrets: %w", err))...)
	}
	keep := map[string]bool{}
	var expires time.Time
	now := time.Now()
	for i := range secrets.Items {
		sec := &secrets.Items[i]
		tenant := sec.Labels[UserNamespaceLabel]
		if !r.ownUserSecret(cs, sec) {
			continue
		}
		user := NamespaceUser(tenant)
		cur, rotate, err := UserCredentialsFrom(sec)
		if err != nil {
			cur = UserCredentials{} // unusable: replaced by a generated one
		}
		keep[user] = true
		next, changed, err := NextUserCredentials(cur, rotate, now, o.PasswordOverlap, GeneratePassword)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		nodes, err := sess.EnsureUser(ctx, addrs, formation.User{Name: user, Passwords: next.Passwords(), Rules: NamespaceACLRules(tenant)})
		if len(nodes) > 0 {
			log.FromContext(ctx).Info("set a namespace's store user", "user", user, "nodes", nodes, "passwords", len(next.Passwords()))
			r.Recorder.Eventf(cs, nil, corev1.EventTypeNormal, "NamespaceUser", "SetPasswords",
				"%s", message.Truncate(fmt.Sprintf("the store user %s accepts %d password(s) on %s", user, len(next.Passwords()), strings.Join(nodes, ", ")), maxEventNote))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("namespace %s's user: %w", tenant, err))
			continue
		}
		if changed {
			// Every reachable node accepts next: only now may the
			// namespace's sidecars be given the new password, or lose
			// the old one.
			if err := r.apply(ctx, DesiredUserSecret(cs, ns, tenant, next)); err != nil {
				errs = append(errs, err)
				continue
			}
			if next.Password != cur.Password && cur.Password != "" {
				log.FromContext(ctx).Info("rotated a namespace's store password", "user", user, "previousAcceptedUntil", next.PreviousExpires)
			}
		}
		if next.Previous != "" && (expires.IsZero() || next.PreviousExpires.Before(expires)) {
			expires = next.PreviousExpires
		}
	}
	deleted, err := sess.PruneUsers(ctx, addrs, func(name string) bool {
		return name == LegacySidecarUser || strings.HasPrefix(name, UserPrefix) && !keep[name]
	})
	if len(deleted) > 0 {
		log.FromContext(ctx).Info("deleted the store users of namespaces without access", "users", deleted)
	}
	if err != nil {
		errs = append(errs, err)
	}
	return expires, errors.Join(errs...)
}

// Members turns the store's Pods into formation members in ordinal order:
// ordinals below max(desired, current) and every existing Pod. A missing
// Pod is a member without an address (so nothing is forgotten while it may
// still come), and a Pod at or past desired is leaving. Pods whose name is
// not <sts>-<ordinal> are ignored.
func Members(pods []corev1.Pod, sts string, desired, current int) []formation.Member {
	byOrdinal := map[int]*corev1.Pod{}
	n := max(desired, current)
	for i := range pods {
		p := &pods[i]
		suffix, ok := strings.CutPrefix(p.Name, sts+"-")
		if !ok {
			continue
		}
		ord, err := strconv.Atoi(suffix)
		if err != nil || ord < 0 || strconv.Itoa(ord) != suffix {
			continue
		}
		byOrdinal[ord] = p
		n = max(n, ord+1)
	}
	members := make([]formation.Member, n)
	for i := range n {
		m := formation.Member{Name: sts + "-" + strconv.Itoa(i), Leaving: i >= desired}
		if p := byOrdinal[i]; p != nil {
			if p.Status.PodIP != "" {
				m.Addr = joinHostPort(p.Status.PodIP, RedisPort)
			}
			m.Host = p.Spec.NodeName
		}
		members[i] = m
	}
	return members
}

func joinHostPort(ip string, port int) string {
	if strings.Contains(ip, ":") {
		return "[" + ip + "]:" + strconv.Itoa(port)
	}
	return ip + ":" + strconv.Itoa(port)
}

// errBadPassword marks a password Secret the user must fix.
var errBadPassword = errors.New("unusable password")

// ensureCredentials returns the store's admin password, generating it on
// first use. The Secret is read from the API server directly: the cache
// holds Secrets as metadata only.
func (r *Reconciler) ensureCredentials(ctx context.Context, cs *v1alpha1.CounterStore, ns string) (Credentials, error) {
	var sec corev1.Secret
	var cur Credentials
	switch err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: AuthSecretName(cs.Name)}, &sec); {
	case err == nil:
		if cur, err = CredentialsFrom(&sec); err != nil {
			return Credentials{}, fmt.Errorf("secret %s/%s: %w: %w", ns, AuthSecretName(cs.Name), errBadPassword, err)
		}
		if cur.Admin != "" && len(sec.Data) == 1 {
			return cur, nil
		}
	case !apierrors.IsNotFound(err):
		return Credentials{}, fmt.Errorf("get Secret %s/%s: %w", ns, AuthSecretName(cs.Name), err)
	}
	// A new store, or a Secret with more than the admin password (the
	// sidecar user's of an earlier release, which goes).
	if cur.Admin == "" {
		p, err := GeneratePassword()
		if err != nil {
			return Credentials{}, err
		}
		cur.Admin = p
	}
	if err := r.apply(ctx, DesiredSecret(cs, ns, cur)); err != nil {
		return Credentials{}, err
	}
	return cur, nil
}

func (r *Reconciler) reconcileExternal(ctx context.Context, cs *v1alpha1.CounterStore, o Options) (*observation, error) {
	ext := cs.Spec.External
	d := formation.Dialer{Timeout: o.DialTimeout}
	if ref := ext.PasswordSecretRef; ref != nil {
		p, err := r.secretValue(ctx, ref)
		if err != nil {
			return &observation{failReason: ReasonSecretError, failMessage: err.Error(), waitForUser: true}, nil
		}
		d.Password = p
	}
	if t := ext.TLS; t != nil {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // the user's explicit choice, documented as for testing only
		if ref := t.CASecretRef; ref != nil {
			pem, err := r.secretValue(ctx, ref)
			if err != nil {
				return &observation{failReason: ReasonSecretError, failMessage: err.Error(), waitForUser: true}, nil
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM([]byte(pem)) {
				err := fmt.Errorf("secret %s/%s key %q holds no PEM certificate", ref.Namespace, ref.Name, ref.Key)
				return &observation{failReason: ReasonSecretError, failMessage: err.Error(), waitForUser: true}, nil
			}
			cfg.RootCAs = pool
		}
		d.TLS = cfg
	}
	seeds := make([]string, len(ext.Addresses))
	for i, a := range ext.Addresses {
		seeds[i] = string(a)
	}
	sess := formation.NewSession(d)
	defer func() { _ = sess.Close() }() // closing idle connections; nothing to report
	snap, err := sess.ObserveCluster(ctx, seeds)
	if err != nil {
		return &observation{failReason: ReasonUnreachable, failMessage: err.Error()}, err
	}
	obs := &observation{snapshot: snap, health: formation.Assess(snap, -1), endpoints: slices.Sorted(slices.Values(seeds))}
	if d.Password != "" {
		obs.authSecret = config.StoreAuthSecret
	}
	return obs, nil
}

// secretValue reads one key of a Secret.
func (r *Reconciler) secretValue(ctx context.Context, ref *v1alpha1.SecretKeySelector) (string, error) {
	var sec corev1.Secret
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &sec); err != nil {
		return "", fmt.Errorf("get Secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	v, ok := sec.Data[ref.Key]
	if !ok || len(v) == 0 {
		return "", fmt.Errorf("secret %s/%s has no key %q", ref.Namespace, ref.Name, ref.Key)
	}
	return string(v), nil
}

// apply writes obj with server-side apply under FieldOwner, taking over
// any field another manager set: these objects are the controller's.
func (r *Reconciler) apply(ctx context.Context, obj client.Object) error {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("convert %T %s to unstructured: %w", obj, obj.GetName(), err)
	}
	delete(u, "status")
	unstructured.RemoveNestedField(u, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u, "spec", "template", "metadata", "creationTimestamp")
	ac := client.ApplyConfigurationFromUnstructured(&unstructured.Unstructured{Object: u})
	if err := r.Client.Apply(ctx, ac, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		return fmt.Errorf("apply %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// recordPass logs a formation pass and emits an Event when it acted or
// failed.
func (r *Reconciler) recordPass(ctx context.Context, cs *v1alpha1.CounterStore, res formation.Result, err error) {
	lg := log.FromContext(ctx)
	p := res.Pass
	if len(p.Actions) > 0 {
		descs := make([]string, len(p.Actions))
		for i, a := range p.Actions {
			descs[i] = a.String()
		}
		lg.Info("formation pass", "step", p.Step, "actions", descs, "movedSlots", res.Outcome.MovedSlots, "movedKeys", res.Outcome.MovedKeys)
		note := fmt.Sprintf("%s: %s", p.Step, strings.Join(descs, "; "))
		r.Recorder.Eventf(cs, nil, corev1.EventTypeNormal, "Formation", string(p.Step), "%s", message.Truncate(note, maxEventNote))
	} else if len(p.Waiting) > 0 {
		lg.V(1).Info("formation waits", "step", p.Step, "waiting", p.Waiting)
	}
	if err != nil {
		lg.Error(err, "formation pass failed", "step", p.Step)
		r.Recorder.Eventf(cs, nil, corev1.EventTypeWarning, "FormationFailed", string(p.Step), "%s", message.Truncate(err.Error(), maxEventNote))
	}
}

// reconcileStatus writes the status that desiredStatus computes, skipping
// the write when nothing changed, and exports it as metrics.
func (r *Reconciler) reconcileStatus(ctx context.Context, cs *v1alpha1.CounterStore, obs *observation, specErr error) error {
	next := cs.DeepCopy()
	next.Status = desiredStatus(cs, obs, specErr)
	r.Metrics.record(cs.Name, &next.Status)
	if err := statusupdate.Write(ctx, r.Client, cs, next, FieldOwner); err != nil {
		return fmt.Errorf("update the status of CounterStore %s: %w", cs.Name, err)
	}
	return nil
}

// desiredStatus is the status of cs given what reconcileSpec observed and
// the error it met, if any. Conditions keep their lastTransitionTime while
// their status does not change; the observed cluster is kept when this
// reconcile could not observe it.
func desiredStatus(cs *v1alpha1.CounterStore, obs *observation, specErr error) v1alpha1.CounterStoreStatus {
	next := *cs.Status.DeepCopy()
	next.ObservedGeneration = cs.Generation
	ready, degraded := conditions(obs, specErr)
	ready.ObservedGeneration, degraded.ObservedGeneration = cs.Generation, cs.Generation
	meta.SetStatusCondition(&next.Conditions, ready)
	meta.SetStatusCondition(&next.Conditions, degraded)
	if obs != nil && obs.snapshot != nil {
		h := obs.health
		next.SlotsCovered = int32(h.SlotsCovered)
		next.Nodes = v1alpha1.NodeCounts{Primaries: int32(h.Primaries), Replicas: int32(h.Replicas), Failed: int32(h.Failed)}
		if len(obs.endpoints) > 0 {
			next.Endpoints = obs.endpoints[:min(len(obs.endpoints), maxEndpoints)]
		}
		next.AuthSecretName = obs.authSecret
	}
	return next
}

// conditions computes Ready and Degraded from an observation; specErr, if
// any, is what went wrong on the way.
func conditions(obs *observation, specErr error) (ready, degraded metav1.Condition) {
	ready = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse}
	degraded = metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionUnknown, Reason: ReasonNotReady,
		Message: "the store is not Ready"}
	switch {
	case obs == nil:
		ready.Reason, ready.Message = ReasonApplyError, errString(specErr)
		return ready, degraded
	case obs.failReason != "":
		ready.Reason, ready.Message = obs.failReason, message.Truncate(obs.failMessage, maxConditionMessage)
		return ready, degraded
	}
	h := obs.health
	// Progress notes go into Degraded, or into a Ready that is False:
	// Ready's message stays stable while the store serves, since the
	// policy controller recompiles on every change of it.
	var notes []string
	if obs.pass != nil {
		if len(obs.pass.Actions) > 0 {
			notes = append(notes, fmt.Sprintf("formation step %s: %d actions", obs.pass.Step, len(obs.pass.Actions)))
		}
		notes = append(notes, obs.pass.Waiting...)
	}
	if specErr != nil {
		notes = append(notes, "error: "+specErr.Error())
	}
	switch {
	case h.Ready():
		ready.Status, ready.Reason = metav1.ConditionTrue, ReasonClusterReady
		ready.Message = fmt.Sprintf("%d masters serve all %d slots", h.Primaries, formation.NumSlots)
	case h.Primaries == 0 && len(h.Unreachable) == len(obs.snapshot.Nodes):
		ready.Reason = ReasonUnreachable
		ready.Message = fmt.Sprintf("no Redis node is reachable (%d expected)", len(obs.snapshot.Nodes))
		if len(obs.snapshot.Nodes) > 0 && obs.snapshot.Nodes[0].Err != nil {
			ready.Message += ": " + obs.snapshot.Nodes[0].Err.Error()
		}
	case h.Assigned == 0:
		ready.Reason, ready.Message = ReasonForming, "forming the cluster"
	case h.SlotsCovered < formation.NumSlots:
		ready.Reason = ReasonSlotsUncovered
		ready.Message = fmt.Sprintf("%d of %d slots are served by a reachable master", h.SlotsCovered, formation.NumSlots)
	default:
		ready.Reason, ready.Message = ReasonClusterDown, "a master reports cluster_state:fail"
	}
	if !h.Ready() {
		if len(notes) > 0 {
			ready.Message += "; " + strings.Join(notes, "; ")
		}
		ready.Message = message.Truncate(ready.Message, maxConditionMessage)
		return ready, degraded
	}

	var lost []string
	if n := len(h.Unreachable); n > 0 {
		lost = append(lost, fmt.Sprintf("unreachable: %s", strings.Join(h.Unreachable, ", ")))
	}
	if h.MissingReplicas > 0 {
		lost = append(lost, fmt.Sprintf("%d replicas missing", h.MissingReplicas))
	}
	if h.Failed > 0 {
		lost = append(lost, fmt.Sprintf("%d nodes flagged failed", h.Failed))
	}
	if obs.pass != nil {
		lost = append(lost, obs.pass.Problems...)
	}
	if len(lost) == 0 {
		degraded.Status, degraded.Reason = metav1.ConditionFalse, ReasonFullyRedundant
		degraded.Message = fmt.Sprintf("every master has its replicas (%d in all) and every node is up", h.Replicas)
	} else {
		degraded.Status, degraded.Reason = metav1.ConditionTrue, ReasonRedundancyLost
		degraded.Message = strings.Join(lost, "; ")
	}
	if len(notes) > 0 {
		degraded.Message += "; " + strings.Join(notes, "; ")
	}
	degraded.Message = message.Truncate(degraded.Message, maxConditionMessage)
	return ready, degraded
}

func errString(err error) string {
	if err == nil {
		return "unknown error"
	}
	return message.Truncate(err.Error(), maxConditionMessage)
}
