// Package webhookcert keeps floodgate-manager's webhook serving
// certificate in --webhook-cert-mode=self-managed.
//
// # What it keeps
//
// A CA and a serving certificate live in one Secret of the manager's
// namespace (type kubernetes.io/tls; keys tls.crt, tls.key, ca.crt, the
// caBundle, and ca.key). Every replica of the manager reads that Secret,
// writes tls.crt, tls.key and ca.crt into the webhook server's certificate
// directory, and writes the caBundle into every webhook of the mutating
// and validating webhook configurations. controller-runtime's webhook
// server loads the files through its certwatcher, so a new certificate is
// served without a restart. The Secret is owned by the mutating webhook
// configuration (which the chart installs), so that uninstalling removes
// it with the configuration.
//
// # Rotation without failed admissions
//
// Certificates are renewed at two thirds of their life (by default the CA
// lives ten years and the serving certificate one). A serving certificate
// is simply replaced: the caBundle already trusts its CA. A CA is rotated
// in stages, each waiting Policy.Propagation for the previous one to reach
// every API server and every replica:
//  1. the new CA joins the caBundle ahead of the old one, signing nothing;
//  2. after Propagation, the serving certificate is reissued by the new CA;
//  3. after Propagation again, the old CA leaves the caBundle.
//
// At every moment the certificate a replica serves is signed by a CA the
// API servers trust. Annotating the Secret floodgate.dev/rotate with any
// new value asks for the same staged rotation of the whole chain at once.
//
// Only when no usable CA exists (first start, or a Secret edited by hand)
// are the CA and the serving certificate created together.
//
// # Several replicas
//
// Every replica runs the same loop and needs no leader: writes to the
// Secret carry its resourceVersion, so of two replicas deciding the same
// rotation one wins and the other adopts its result. Each replica only
// ever writes the Secret's current caBundle and certificate, right after
// reading it.
package webhookcert

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/floodgate-dev/floodgate/internal/pki"
)

// Annotations on the Secret.
const (
	// AnnotationRotate, set to any new value, asks for a rotation of the
	// CA and the serving certificate.
	AnnotationRotate = "floodgate.dev/rotate"
	// AnnotationRotated records the last AnnotationRotate value handled.
	AnnotationRotated = "floodgate.dev/rotated"
	// AnnotationCARolledAt and AnnotationServingIssuedAt time the stages
	// of a rotation (RFC 3339).
	AnnotationCARolledAt      = "webhookcert.floodgate.dev/ca-rolled-at"
	AnnotationServingIssuedAt = "webhookcert.floodgate.dev/serving-issued-at"
)

// Defaults of Options.
const (
	DefaultCALifetime      = 10 * 365 * 24 * time.Hour
	DefaultServingLifetime = 365 * 24 * time.Hour
	DefaultPropagation     = 5 * time.Minute
	DefaultSyncInterval    = time.Minute
)

// +kubebuilder:rbac:groups="",namespace=floodgate-system,resources=secrets,verbs=get;create;update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,resourceNames=floodgate-sidecar-injector;floodgate-policy-validator,verbs=get;patch

// Options configure a Manager.
type Options struct {
	// Client writes the Secret and the webhook configurations.
	Client client.Client
	// Reader reads them, uncached (the manager's API reader): the loop
	// must see other replicas' writes, and runs before caches start.
	Reader client.Reader
	// Namespace and SecretName locate the Secret.
	Namespace, SecretName string
	// ServiceName is the webhook Service: the certificate names
	// <service>.<namespace>.svc and <service>.<namespace>.svc.cluster.local.
	ServiceName string
	// ExtraHosts are further DNS names or IP addresses of the certificate,
	// for a webhook reached by URL (tests, local runs).
	ExtraHosts []string
	// CertDir is the webhook server's certificate directory.
	CertDir string
	// MutatingWebhookConfig and ValidatingWebhookConfig name the
	// configurations whose caBundle is kept; empty skips one.
	MutatingWebhookConfig, ValidatingWebhookConfig string
	// CALifetime, ServingLifetime and Propagation are Policy's; 0 takes
	// the defaults.
	CALifetime, ServingLifetime, Propagation time.Duration
	// SyncInterval is how often the Secret is read again; 0 takes the
	// default.
	SyncInterval time.Duration
	// Log receives the manager's events.
	Log logr.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Manager keeps the certificate. Create it with New, call Sync once before
// the webhook server starts (it needs the files), and run Start.
type Manager struct {
	o      Options
	policy Policy
}

var _ manager.LeaderElectionRunnable = (*Manager)(nil)

// New validates o and returns a Manager.
func New(o Options) (*Manager, error) {
	var errs []error
	if o.Client == nil || o.Reader == nil {
		errs = append(errs, errors.New("webhookcert: Client and Reader are required"))
	}
	for name, v := range map[string]string{"Namespace": o.Namespace, "SecretName": o.SecretName, "ServiceName": o.ServiceName, "CertDir": o.CertDir} {
		if v == "" {
			errs = append(errs, fmt.Errorf("webhookcert: %s is empty", name))
		}
	}
	if o.CALifetime == 0 {
		o.CALifetime = DefaultCALifetime
	}
	if o.ServingLifetime == 0 {
		o.ServingLifetime = DefaultServingLifetime
	}
	if o.Propagation == 0 {
		o.Propagation = DefaultPropagation
	}
	if o.SyncInterval == 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.ServingLifetime > o.CALifetime {
		errs = append(errs, fmt.Errorf("webhookcert: the serving lifetime %v exceeds the CA lifetime %v", o.ServingLifetime, o.CALifetime))
	}
	if o.Propagation < 0 || o.SyncInterval < 0 || o.CALifetime < 0 || o.ServingLifetime < 0 {
		errs = append(errs, errors.New("webhookcert: durations must not be negative"))
	}
	if o.ServingLifetime/3 <= 2*o.Propagation {
		errs = append(errs, fmt.Errorf("webhookcert: the serving lifetime %v leaves too little time after renewal for two propagation periods of %v", o.ServingLifetime, o.Propagation))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	hosts := make([]string, 0, 2+len(o.ExtraHosts))
	hosts = append(hosts,
		fmt.Sprintf("%s.%s.svc", o.ServiceName, o.Namespace),
		fmt.Sprintf("%s.%s.svc.cluster.local", o.ServiceName, o.Namespace))
	hosts = append(hosts, o.ExtraHosts...)
	return &Manager{o: o, policy: Policy{
		CALifetime: o.CALifetime, ServingLifetime: o.ServingLifetime, Propagation: o.Propagation, Hosts: hosts,
	}}, nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every
// replica serves webhooks, so every replica keeps its files.
func (m *Manager) NeedLeaderElection() bool { return false }

// Start runs Sync until ctx ends: at the sync interval, or sooner when a
// rotation stage is due, and after a failure with backoff.
func (m *Manager) Start(ctx context.Context) error {
	return pki.Keep(ctx, m.o.SyncInterval, m.o.Now, m.Sync, func(err error, retryIn time.Duration) {
		m.o.Log.Error(err, "keeping the webhook certificate failed; retrying", "in", retryIn)
	})
}

// Sync brings the Secret, the files and the caBundles up to date once, and
// returns when the next rotation stage is due.
func (m *Manager) Sync(ctx context.Context) (time.Time, error) {
	var b Bundle
	var err error
	for attempt := 0; ; attempt++ {
		var conflict bool
		b, conflict, err = m.syncSecret(ctx)
		if err == nil || !conflict || attempt == 4 {
			break
		}
	}
	if err != nil {
		return time.Time{}, err
	}
	if err := m.writeFiles(b); err != nil {
		return time.Time{}, err
	}
	if err := m.patchCABundles(ctx, pki.CertPEM(b.Trusted...)); err != nil {
		return time.Time{}, err
	}
	return Next(b, m.policy), nil
}

// syncSecret reads the Secret, applies Plan until it asks for nothing,
// and writes the result. conflict reports a lost race with another
// replica, after which the caller reads again.
func (m *Manager) syncSecret(ctx context.Context) (Bundle, bool, error) {
	key := client.ObjectKey{Namespace: m.o.Namespace, Name: m.o.SecretName}
	var s corev1.Secret
	exists := true
	if err := m.o.Reader.Get(ctx, key, &s); apierrors.IsNotFound(err) {
		exists = false
		s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: m.o.Namespace, Name: m.o.SecretName}}
	} else if err != nil {
		return Bundle{}, false, fmt.Errorf("get Secret %s: %w", key, err)
	}
	b := decode(s.Data, annotationTime(s.Annotations, AnnotationCARolledAt), annotationTime(s.Annotations, AnnotationServingIssuedAt))
	rotateWanted := s.Annotations[AnnotationRotate]
	rotate := rotateWanted != "" && rotateWanted != s.Annotations[AnnotationRotated]

	now := m.o.Now()
	changed := false
	for range 4 {
		d := Plan(b, now, m.policy, rotate)
		if !d.Changes() {
			break
		}
		var err error
		if b, err = apply(b, d, now, m.policy); err != nil {
			return Bundle{}, false, err
		}
		m.o.Log.Info("webhook certificate", "newCA", d.NewCA, "staged", d.Staged, "newServing", d.NewServing,
			"dropOldCAs", d.DropOld, "reason", d.Reason, "secret", key.String())
		if d.NewCA && d.Staged && rotate {
			rotate = false
			setAnnotation(&s, AnnotationRotated, rotateWanted)
		}
		changed = true
	}
	owner, err := m.owner(ctx)
	if err != nil {
		return Bundle{}, false, err
	}
	if owner != nil && !slices.ContainsFunc(s.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == owner.UID }) {
		s.OwnerReferences = append(s.OwnerReferences, *owner)
		changed = true
	}
	if !changed {
		return b, false, nil
	}

	data, err := encode(b)
	if err != nil {
		return Bundle{}, false, err
	}
	s.Type = corev1.SecretTypeTLS
	s.Data = data
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels["app.kubernetes.io/managed-by"] = "floodgate-manager"
	s.Labels["app.kubernetes.io/component"] = "webhook-cert"
	setAnnotation(&s, AnnotationCARolledAt, b.CARolledAt.UTC().Format(time.RFC3339Nano))
	setAnnotation(&s, AnnotationServingIssuedAt, b.ServingIssuedAt.UTC().Format(time.RFC3339Nano))
	if exists {
		err = m.o.Client.Update(ctx, &s)
	} else {
		err = m.o.Client.Create(ctx, &s)
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return Bundle{}, true, fmt.Errorf("write Secret %s: %w", key, err)
	}
	if err != nil {
		return Bundle{}, false, fmt.Errorf("write Secret %s: %w", key, err)
	}
	return b, false, nil
}

func setAnnotation(s *corev1.Secret, k, v string) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[k] = v
}

func annotationTime(a map[string]string, k string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, a[k])
	if err != nil {
		return time.Time{}
	}
	return t
}

// writeFiles puts the certificate into CertDir when it differs.
func (m *Manager) writeFiles(b Bundle) error {
	key, err := pki.KeyPEM(b.ServingKey)
	if err != nil {
		return err
	}
	files := map[string][]byte{KeyTLSCert: pki.CertPEM(b.Serving), KeyTLSKey: key, KeyCACert: pki.CertPEM(b.Trusted...)}
	changed, err := writeAtomic(m.o.CertDir, files)
	if err != nil {
		return fmt.Errorf("write the webhook certificate to %s: %w", m.o.CertDir, err)
	}
	if changed {
		m.o.Log.Info("wrote the webhook serving certificate", "dir", m.o.CertDir, "notAfter", b.Serving.NotAfter, "issuer", b.Serving.Issuer.CommonName)
	}
	return nil
}

// patchCABundles writes bundle into every webhook of both configurations.
// A configuration that does not exist yet is skipped: the next sync
// writes it.
func (m *Manager) patchCABundles(ctx context.Context, bundle []byte) error {
	var errs []error
	if name := m.o.MutatingWebhookConfig; name != "" {
		var c admissionregistrationv1.MutatingWebhookConfiguration
		errs = append(errs, m.patchOne(ctx, name, &c, func() bool {
			changed := false
			for i := range c.Webhooks {
				if !bytes.Equal(c.Webhooks[i].ClientConfig.CABundle, bundle) {
					c.Webhooks[i].ClientConfig.CABundle, changed = slices.Clone(bundle), true
				}
			}
			return changed
		}))
	}
	if name := m.o.ValidatingWebhookConfig; name != "" {
		var c admissionregistrationv1.ValidatingWebhookConfiguration
		errs = append(errs, m.patchOne(ctx, name, &c, func() bool {
			changed := false
			for i := range c.Webhooks {
				if !bytes.Equal(c.Webhooks[i].ClientConfig.CABundle, bundle) {
					c.Webhooks[i].ClientConfig.CABundle, changed = slices.Clone(bundle), true
				}
			}
			return changed
		}))
	}
	return errors.Join(errs...)
}

// owner returns the reference that makes the Secret a dependent of the
// mutating webhook configuration, or nil when none is configured or it
// does not exist. The configuration belongs to the installation (the
// chart), the Secret to the manager; as a dependent, the Secret is
// garbage-collected when `helm uninstall` deletes the configuration,
// instead of staying behind in the release namespace.
func (m *Manager) owner(ctx context.Context) (*metav1.OwnerReference, error) {
	name := m.o.MutatingWebhookConfig
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

func (m *Manager) patchOne(ctx context.Context, name string, obj client.Object, set func() bool) error {
	if err := m.o.Reader.Get(ctx, client.ObjectKey{Name: name}, obj); apierrors.IsNotFound(err) {
		m.o.Log.V(1).Info("webhook configuration not found; its caBundle is written once it exists", "name", name)
		return nil
	} else if err != nil {
		return fmt.Errorf("get webhook configuration %s: %w", name, err)
	}
	base, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("copy webhook configuration %s", name)
	}
	if !set() {
		return nil
	}
	if err := m.o.Client.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patch the caBundle of webhook configuration %s: %w", name, err)
	}
	m.o.Log.Info("wrote the caBundle", "configuration", name)
	return nil
}

// writeAtomic writes files into dir the way the kubelet updates a Secret
// volume: into a new directory, then one rename of the "..data" symlink,
// so that a reader never sees a certificate with the wrong key. Each file
// is a symlink through "..data". It reports whether anything changed.
func writeAtomic(dir string, files map[string][]byte) (bool, error) {
	same := true
	for name, data := range files {
		cur, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(cur, data) {
			same = false
			break
		}
	}
	if same {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	tsDir, err := os.MkdirTemp(dir, "..cert-")
	if err != nil {
		return false, err
	}
	if err := os.Chmod(tsDir, 0o755); err != nil {
		return false, err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(tsDir, name), data, 0o600); err != nil {
			return false, err
		}
	}
	tmpLink := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmpLink)
	if err := os.Symlink(filepath.Base(tsDir), tmpLink); err != nil {
		return false, err
	}
	if err := os.Rename(tmpLink, filepath.Join(dir, "..data")); err != nil {
		return false, err
	}
	for name := range files {
		target := filepath.Join("..data", name)
		link := filepath.Join(dir, name)
		if cur, err := os.Readlink(link); err == nil && cur == target {
			continue
		}
		tmp := filepath.Join(dir, "."+name+".tmp")
		_ = os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return false, err
		}
		if err := os.Rename(tmp, link); err != nil {
			return false, err
		}
	}
	old, err := filepath.Glob(filepath.Join(dir, "..cert-*"))
	if err != nil {
		return false, err
	}
	for _, o := range old {
		if o != tsDir {
			_ = os.RemoveAll(o)
		}
	}
	return true, nil
}
