package rlsidentity

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
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/internal/pki"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// The Secrets.
const (
	// CASecretName holds the CA, in the manager's namespace.
	CASecretName = "floodgate-ratelimit-ca"
	// ServingSecretName holds the central service's serving certificate,
	// in the manager's namespace, which is the service's.
	ServingSecretName = "floodgate-ratelimit-tls"
	// ClientSecretName holds the gateways' client certificates, one in
	// each namespace where gateway pods run.
	ClientSecretName = "floodgate-ratelimit-client"
)

// Secret keys. tls.crt and tls.key follow the kubernetes.io/tls type, and
// ca.crt is the bundle, as cert-manager writes it.
const (
	KeyTLSCert = "tls.crt"
	KeyTLSKey  = "tls.key"
	KeyCACert  = "ca.crt"
	KeyCAKey   = "ca.key"
	// KeyCASDS is ca.crt in the SDS file the generated gateway
	// configuration reads (gatewayconfig.TrustedCASDSFile).
	KeyCASDS = gatewayconfig.TrustedCASDSFile
)

// Annotations of the CA Secret.
const (
	// AnnotationRotate, set to any new value, asks for a staged rotation
	// of the CA and every certificate (as for the webhook certificate).
	AnnotationRotate = "floodgate.dev/rotate"
	// AnnotationRotated records the last AnnotationRotate value handled.
	AnnotationRotated = "floodgate.dev/rotated"
	// AnnotationCARolledAt and AnnotationLastIssuedAt time the stages of
	// a rotation (RFC 3339).
	AnnotationCARolledAt   = "rlsidentity.floodgate.dev/ca-rolled-at"
	AnnotationLastIssuedAt = "rlsidentity.floodgate.dev/last-issued-at"
	// AnnotationClientNamespaces lists, comma-separated, the namespaces
	// that hold a client Secret, so that one no longer wanted is deleted.
	AnnotationClientNamespaces = "rlsidentity.floodgate.dev/client-namespaces"
)

// Labels of every Secret it writes; one without them is not touched.
var secretLabels = map[string]string{
	"app.kubernetes.io/managed-by": "floodgate-manager",
	"app.kubernetes.io/component":  "ratelimit-identity",
}

// Defaults of Options.
const (
	DefaultCALifetime   = 10 * 365 * 24 * time.Hour
	DefaultLeafLifetime = 90 * 24 * time.Hour
	DefaultPropagation  = 5 * time.Minute
	DefaultSyncInterval = time.Minute
)

// The CA and serving Secrets live in the manager's namespace (get, create
// and update there come with the webhook certificate's Role); the client
// Secrets in the gateways' namespaces, which the chart's values name, all
// by one name.
//
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create
// +kubebuilder:rbac:groups="",resources=secrets,resourceNames=floodgate-ratelimit-client,verbs=update;delete

// Gateway is a Gateway that calls the central service, and where its
// pods run.
type Gateway struct {
	// Namespace and Name identify the Gateway: its certificate names it.
	Namespace, Name string
	// SecretNamespace is where its pods run, and its client certificate
	// is written; empty means Namespace.
	SecretNamespace string
}

// Ref is the gateway's config.GatewayRef.
func (g Gateway) Ref() string { return config.GatewayRef(g.Namespace, g.Name) }

func (g Gateway) secretNamespace() string {
	if g.SecretNamespace != "" {
		return g.SecretNamespace
	}
	return g.Namespace
}

// String renders g as ParseGateway reads it.
func (g Gateway) String() string {
	if g.SecretNamespace == "" || g.SecretNamespace == g.Namespace {
		return g.Ref()
	}
	return g.Ref() + "=" + g.SecretNamespace
}

// ParseGateway reads "<namespace>/<name>" or
// "<namespace>/<name>=<secret namespace>".
func ParseGateway(s string) (Gateway, error) {
	ref, secretNS, _ := strings.Cut(s, "=")
	ns, name, err := config.ParseGatewayRef(ref)
	if err != nil {
		return Gateway{}, fmt.Errorf("gateway %q: %w", s, err)
	}
	if secretNS != "" {
		if errs := validation.IsDNS1123Label(secretNS); len(errs) > 0 {
			return Gateway{}, fmt.Errorf("gateway %q: secret namespace %q: %s", s, secretNS, strings.Join(errs, "; "))
		}
	}
	return Gateway{Namespace: ns, Name: name, SecretNamespace: secretNS}, nil
}

// ClientKeys are the keys of gateway g's files in its client Secret:
// <namespace>.<name>.tls.crt, .tls.key, and .sds.yaml (the SDS file of
// both, gatewayconfig.ClientCertificateSDS). A namespace has no dot, so
// the keys of two gateways never meet.
func ClientKeys(g Gateway) (cert, key, sds string) {
	p := g.Namespace + "." + g.Name + "."
	return p + KeyTLSCert, p + KeyTLSKey, p + "sds.yaml"
}

// servingID and clientID name the leaves in State.Leaves.
const servingID = "serving"

func clientID(g Gateway) string { return "client:" + g.Ref() }

// Options configure a Manager.
type Options struct {
	// Client writes the Secrets.
	Client client.Client
	// Reader reads them, uncached (the manager's API reader): the manager
	// caches no Secrets of other namespaces, and must see its own writes.
	Reader client.Reader
	// Namespace is the manager's and the central service's namespace.
	Namespace string
	// ServiceName is the central service's Service: the serving
	// certificate names <service>.<namespace>.svc and
	// <service>.<namespace>.svc.<ClusterDomain>.
	ServiceName string
	// ClusterDomain is the cluster's DNS domain; empty means
	// cluster.local.
	ClusterDomain string
	// Gateways are the Gateways that get a client certificate.
	Gateways []Gateway
	// OwnerWebhookConfig names the mutating webhook configuration that
	// owns the Secrets; empty, or absent from the cluster, leaves them
	// without an owner.
	OwnerWebhookConfig string
	// CALifetime, LeafLifetime and Propagation are Policy's; 0 takes the
	// defaults.
	CALifetime, LeafLifetime, Propagation time.Duration
	// SyncInterval is how often the Secrets are read again; 0 takes the
	// default.
	SyncInterval time.Duration
	// Log receives the manager's events.
	Log logr.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Manager keeps the certificates. Create it with New and run Start, or
// call Sync.
type Manager struct {
	o      Options
	policy Policy
	want   map[string]pki.Leaf
}

var _ manager.LeaderElectionRunnable = (*Manager)(nil)

// New validates o and returns a Manager.
func New(o Options) (*Manager, error) {
	var errs []error
	if o.Client == nil || o.Reader == nil {
		errs = append(errs, errors.New("rlsidentity: Client and Reader are required"))
	}
	if o.Namespace == "" || o.ServiceName == "" {
		errs = append(errs, errors.New("rlsidentity: Namespace and ServiceName are required"))
	}
	o.CALifetime = cmpOr(o.CALifetime, DefaultCALifetime)
	o.LeafLifetime = cmpOr(o.LeafLifetime, DefaultLeafLifetime)
	o.Propagation = cmpOr(o.Propagation, DefaultPropagation)
	o.SyncInterval = cmpOr(o.SyncInterval, DefaultSyncInterval)
	if o.CALifetime < 0 || o.LeafLifetime < 0 || o.Propagation < 0 || o.SyncInterval < 0 {
		errs = append(errs, errors.New("rlsidentity: durations must not be negative"))
	}
	if o.LeafLifetime > o.CALifetime/3 {
		errs = append(errs, fmt.Errorf("rlsidentity: the leaf lifetime %v must be at most a third of the CA lifetime %v, so that a leaf never outlives its CA's renewal", o.LeafLifetime, o.CALifetime))
	}
	if o.LeafLifetime/3 <= 2*o.Propagation {
		errs = append(errs, fmt.Errorf("rlsidentity: the leaf lifetime %v leaves too little time after renewal for two propagation periods of %v", o.LeafLifetime, o.Propagation))
	}
	want := map[string]pki.Leaf{servingID: ServingLeaf(o.ServiceName, o.Namespace, o.ClusterDomain)}
	for _, g := range o.Gateways {
		if _, err := ParseGateway(g.String()); err != nil {
			errs = append(errs, fmt.Errorf("rlsidentity: %w", err))
			continue
		}
		if _, dup := want[clientID(g)]; dup {
			errs = append(errs, fmt.Errorf("rlsidentity: gateway %s is listed twice", g.Ref()))
		}
		want[clientID(g)] = ClientLeaf(g.Namespace, g.Name)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Manager{o: o, want: want, policy: Policy{CALifetime: o.CALifetime, LeafLifetime: o.LeafLifetime, Propagation: o.Propagation}}, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: one
// manager keeps the certificates.
func (m *Manager) NeedLeaderElection() bool { return true }

// Start runs Sync until ctx ends: at the sync interval, or sooner when a
// rotation stage is due, and after a failure with backoff.
func (m *Manager) Start(ctx context.Context) error {
	return pki.Keep(ctx, m.o.SyncInterval, m.o.Now, m.Sync, func(err error, retryIn time.Duration) {
		m.o.Log.Error(err, "keeping the rate-limit service's certificates failed; retrying", "in", retryIn)
	})
}

// Sync brings the Secrets up to date once, and returns when the next
// rotation stage is due. A Secret it cannot write (a gateway namespace
// that does not exist, a Secret of that name that is not the manager's)
// is reported in the error; the others are still written.
func (m *Manager) Sync(ctx context.Context) (time.Time, error) {
	for attempt := 0; ; attempt++ {
		next, conflict, err := m.sync(ctx)
		if err == nil || !conflict || attempt == 4 {
			return next, err
		}
	}
}

// secretState is one Secret as read: nil when it does not exist.
type secretState struct {
	key client.ObjectKey
	obj *corev1.Secret
}

func (m *Manager) read(ctx context.Context, namespace, name string) (secretState, error) {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	var s corev1.Secret
	switch err := m.o.Reader.Get(ctx, key, &s); {
	case apierrors.IsNotFound(err):
		return secretState{key: key}, nil
	case err != nil:
		return secretState{}, fmt.Errorf("get Secret %s: %w", key, err)
	}
	if !ours(&s) {
		return secretState{}, fmt.Errorf("the Secret %s exists and is not floodgate-manager's (labels %v); rename or delete it", key, secretLabels)
	}
	return secretState{key: key, obj: &s}, nil
}

func ours(s *corev1.Secret) bool {
	for k, v := range secretLabels {
		if s.Labels[k] != v {
			return false
		}
	}
	return true
}

func (s secretState) data() map[string][]byte {
	if s.obj == nil {
		return nil
	}
	return s.obj.Data
}

func (s secretState) annotation(k string) string {
	if s.obj == nil {
		return ""
	}
	return s.obj.Annotations[k]
}

// sync is one attempt of Sync; conflict reports a lost race with another
// writer, after which the caller reads again.
func (m *Manager) sync(ctx context.Context) (time.Time, bool, error) {
	ca, err := m.read(ctx, m.o.Namespace, CASecretName)
	if err != nil {
		return time.Time{}, false, err
	}
	serving, err := m.read(ctx, m.o.Namespace, ServingSecretName)
	if err != nil {
		return time.Time{}, false, err
	}
	byNS := map[string][]Gateway{}
	for _, g := range m.o.Gateways {
		byNS[g.secretNamespace()] = append(byNS[g.secretNamespace()], g)
	}
	wantedNS := slices.Sorted(maps.Keys(byNS))
	recorded := splitList(ca.annotation(AnnotationClientNamespaces))
	clients, want, errs := m.readClients(ctx, byNS, wantedNS, recorded)

	st := decodeState(ca.data(), serving.data(), clients, m.o.Gateways,
		annotationTime(ca.annotation(AnnotationCARolledAt)), annotationTime(ca.annotation(AnnotationLastIssuedAt)))
	rotateWanted := ca.annotation(AnnotationRotate)
	rotate := rotateWanted != "" && rotateWanted != ca.annotation(AnnotationRotated)
	now := m.o.Now()
	rotated := ca.annotation(AnnotationRotated)
	for range 4 {
		d := Plan(st, want, now, m.policy, rotate)
		if !d.Changes() {
			break
		}
		if st, err = apply(st, d, want, now, m.policy); err != nil {
			return time.Time{}, false, err
		}
		m.o.Log.Info("rate-limit service certificates", "newCA", d.NewCA, "staged", d.Staged, "issued", d.Issue,
			"dropOldCAs", d.DropOld, "reason", d.Reason)
		if d.NewCA && d.Staged && rotate {
			rotate, rotated = false, rotateWanted
		}
	}
	owner, err := m.owner(ctx)
	if err != nil {
		return time.Time{}, false, err
	}

	// The CA first: what the other Secrets carry comes from it.
	caKey, err := pki.KeyPEM(st.CAKey)
	if err != nil {
		return time.Time{}, false, err
	}
	bundle := pki.CertPEM(st.Trusted...)
	annotations := map[string]string{
		AnnotationCARolledAt:       st.CARolledAt.UTC().Format(time.RFC3339Nano),
		AnnotationLastIssuedAt:     st.LastIssuedAt.UTC().Format(time.RFC3339Nano),
		AnnotationClientNamespaces: strings.Join(union(wantedNS, recorded), ","),
	}
	if rotated != "" {
		annotations[AnnotationRotated] = rotated
	}
	if conflict, err := m.write(ctx, ca, corev1.SecretTypeOpaque, map[string][]byte{KeyCACert: bundle, KeyCAKey: caKey}, annotations, owner); err != nil {
		return time.Time{}, conflict, err
	}

	servingData, err := leafData(st.Leaves[servingID], KeyTLSCert, KeyTLSKey)
	if err != nil {
		return time.Time{}, false, err
	}
	servingData[KeyCACert] = bundle
	if conflict, err := m.write(ctx, serving, corev1.SecretTypeTLS, servingData, nil, owner); err != nil {
		return time.Time{}, conflict, err
	}

	conflicted, err := m.writeClients(ctx, st, bundle, byNS, wantedNS, clients, owner)
	if err != nil {
		errs = append(errs, err)
	}
	if err := m.prune(ctx, recorded, wantedNS, clients, annotations, owner); err != nil {
		errs = append(errs, err)
	}
	return Next(st, want, m.policy), conflicted, errors.Join(errs...)
}

// readClients reads the client Secrets of the namespaces wanted and
// recorded, and returns them by namespace with the certificates wanted
// this time: a gateway whose Secret cannot be written (its namespace does
// not exist, or holds a Secret of that name that is not the manager's)
// gets none, rather than a new one at every sync, and is reported.
func (m *Manager) readClients(ctx context.Context, byNS map[string][]Gateway, wantedNS, recorded []string) (map[string]secretState, map[string]pki.Leaf, []error) {
	var errs []error
	clients := map[string]secretState{}
	want := maps.Clone(m.want)
	for _, ns := range union(wantedNS, recorded) {
		s, err := m.read(ctx, ns, ClientSecretName)
		if err == nil && s.obj == nil && slices.Contains(wantedNS, ns) {
			err = m.namespaceExists(ctx, ns, byNS[ns])
		}
		if err != nil {
			errs = append(errs, err)
			for _, g := range byNS[ns] {
				delete(want, clientID(g))
			}
			continue
		}
		clients[ns] = s
	}
	return clients, want, errs
}

// writeClients writes the client Secret of each wanted namespace that
// could be read.
func (m *Manager) writeClients(ctx context.Context, st State, bundle []byte, byNS map[string][]Gateway, wantedNS []string,
	clients map[string]secretState, owner *metav1.OwnerReference,
) (bool, error) {
	caSDS, err := gatewayconfig.TrustedCASDS(bundle)
	if err != nil {
		return false, err
	}
	conflicted := false
	var errs []error
	for _, ns := range wantedNS {
		s, ok := clients[ns]
		if !ok {
			continue
		}
		data := map[string][]byte{KeyCACert: bundle, KeyCASDS: caSDS}
		for _, g := range byNS[ns] {
			certKey, keyKey, sdsKey := ClientKeys(g)
			d, err := leafData(st.Leaves[clientID(g)], certKey, keyKey)
			if err != nil {
				return false, err
			}
			if d[sdsKey], err = gatewayconfig.ClientCertificateSDS(d[certKey], d[keyKey]); err != nil {
				return false, err
			}
			maps.Copy(data, d)
		}
		if conflict, err := m.write(ctx, s, corev1.SecretTypeOpaque, data, nil, owner); err != nil {
			conflicted = conflicted || conflict
			errs = append(errs, err)
		}
	}
	return conflicted, errors.Join(errs...)
}

// prune deletes the client Secrets of the recorded namespaces that no
// listed gateway runs in, and then records only the wanted namespaces.
func (m *Manager) prune(ctx context.Context, recorded, wantedNS []string, clients map[string]secretState,
	annotations map[string]string, owner *metav1.OwnerReference,
) error {
	var errs []error
	stale := false
	for _, ns := range recorded {
		if slices.Contains(wantedNS, ns) {
			continue
		}
		s, ok := clients[ns]
		if !ok {
			stale = true
			continue
		}
		if s.obj == nil {
			continue
		}
		uid := s.obj.UID
		if err := m.o.Client.Delete(ctx, s.obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete Secret %s of gateways no longer listed: %w", s.key, err))
			stale = true
			continue
		}
		m.o.Log.Info("deleted the client certificates of gateways no longer listed", "secret", s.key.String())
	}
	if stale || slices.Equal(recorded, wantedNS) || len(recorded) == 0 {
		return errors.Join(errs...)
	}
	// Every stale namespace is clean: record only the wanted ones.
	fresh, err := m.read(ctx, m.o.Namespace, CASecretName)
	if err == nil && fresh.obj != nil {
		annotations[AnnotationClientNamespaces] = strings.Join(wantedNS, ",")
		_, err = m.write(ctx, fresh, corev1.SecretTypeOpaque, fresh.obj.Data, annotations, owner)
	}
	return errors.Join(append(errs, err)...)
}

// namespaceExists returns an error when namespace ns, where gateways
// run, does not exist.
func (m *Manager) namespaceExists(ctx context.Context, ns string, gateways []Gateway) error {
	var n corev1.Namespace
	switch err := m.o.Reader.Get(ctx, client.ObjectKey{Name: ns}, &n); {
	case apierrors.IsNotFound(err):
		refs := make([]string, len(gateways))
		for i, g := range gateways {
			refs[i] = g.Ref()
		}
		return fmt.Errorf("namespace %s does not exist: the client certificates of the gateways whose pods run there (%s) wait for it", ns, strings.Join(refs, ", "))
	case err != nil:
		return fmt.Errorf("get namespace %s: %w", ns, err)
	}
	return nil
}

// write makes the Secret s hold data, with annotations (merged) and the
// owner, when it does not already; conflict reports a lost race.
func (m *Manager) write(ctx context.Context, s secretState, typ corev1.SecretType, data map[string][]byte, annotations map[string]string, owner *metav1.OwnerReference) (bool, error) {
	obj := s.obj
	exists := obj != nil
	if !exists {
		obj = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.key.Namespace, Name: s.key.Name}, Type: typ}
	} else {
		obj = obj.DeepCopy()
	}
	changed := !exists || !maps.EqualFunc(obj.Data, data, bytes.Equal)
	obj.Data = data
	for k, v := range annotations {
		if obj.Annotations[k] != v {
			if obj.Annotations == nil {
				obj.Annotations = map[string]string{}
			}
			obj.Annotations[k], changed = v, true
		}
	}
	if obj.Labels == nil {
		obj.Labels = map[string]string{}
	}
	maps.Copy(obj.Labels, secretLabels)
	if owner != nil && !slices.ContainsFunc(obj.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == owner.UID }) {
		obj.OwnerReferences, changed = append(obj.OwnerReferences, *owner), true
	}
	if !changed {
		return false, nil
	}
	var err error
	if exists {
		err = m.o.Client.Update(ctx, obj)
	} else {
		err = m.o.Client.Create(ctx, obj)
	}
	if err != nil {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err), fmt.Errorf("write Secret %s: %w", s.key, err)
	}
	m.o.Log.Info("wrote the rate-limit service's certificates", "secret", s.key.String())
	return false, nil
}

// owner returns the reference that makes a Secret a dependent of the
// mutating webhook configuration, or nil when none is configured or it
// does not exist: the configuration belongs to the installation (the
// chart), so `helm uninstall` removes the Secrets with it, in every
// namespace (a cluster-scoped owner may have dependents anywhere).
func (m *Manager) owner(ctx context.Context) (*metav1.OwnerReference, error) {
	name := m.o.OwnerWebhookConfig
	if name == "" {
		return nil, nil
	}
	var c admissionregistrationv1.MutatingWebhookConfiguration
	if err := m.o.Reader.Get(ctx, client.ObjectKey{Name: name}, &c); apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("get webhook configuration %s: %w", name, err)
	}
	return &metav1.OwnerReference{
		APIVersion: admissionregistrationv1.SchemeGroupVersion.String(),
		Kind:       "MutatingWebhookConfiguration",
		Name:       c.Name,
		UID:        c.UID,
	}, nil
}

// decodeState reads the state from the Secrets' data. Parts that are
// missing, unreadable or mismatched are left out, for Plan to replace.
func decodeState(ca, serving map[string][]byte, clients map[string]secretState, gateways []Gateway, rolledAt, issuedAt time.Time) State {
	s := State{Trusted: pki.ParseCerts(ca[KeyCACert]), CARolledAt: rolledAt, LastIssuedAt: issuedAt, Leaves: map[string]Leaf{}}
	if key := pki.ParseKey(ca[KeyCAKey]); key != nil {
		for _, c := range s.Trusted {
			if c.IsCA && pki.Matches(c, key) {
				s.CA, s.CAKey = c, key
				break
			}
		}
	}
	leaf := func(id string, data map[string][]byte, certKey, keyKey string) {
		certs := pki.ParseCerts(data[certKey])
		if len(certs) == 0 {
			return
		}
		if key := pki.ParseKey(data[keyKey]); key != nil && pki.Matches(certs[0], key) {
			s.Leaves[id] = Leaf{Cert: certs[0], Key: key}
		}
	}
	leaf(servingID, serving, KeyTLSCert, KeyTLSKey)
	for _, g := range gateways {
		c, ok := clients[g.secretNamespace()]
		if !ok {
			continue
		}
		certKey, keyKey, _ := ClientKeys(g)
		leaf(clientID(g), c.data(), certKey, keyKey)
	}
	return s
}

// leafData is l's certificate and key in PEM under certKey and keyKey.
func leafData(l Leaf, certKey, keyKey string) (map[string][]byte, error) {
	if l.Cert == nil || l.Key == nil {
		return nil, errors.New("rlsidentity: a certificate is missing after planning")
	}
	k, err := pki.KeyPEM(l.Key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{certKey: pki.CertPEM(l.Cert), keyKey: k}, nil
}

func annotationTime(v string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}
