package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/floodgate-dev/floodgate/controllers/admission"
	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/controllers/sidecaraccess"
	"github.com/floodgate-dev/floodgate/controllers/webhookcert"
)

// Webhook certificate modes (--webhook-cert-mode).
const (
	// CertModeSelfManaged: the manager keeps a CA and serving certificate
	// in --webhook-cert-secret, writes them into --webhook-cert-dir,
	// rotates them, and writes the caBundle of both webhook
	// configurations.
	CertModeSelfManaged = "self-managed"
	// CertModeExternal: something else (cert-manager) fills
	// --webhook-cert-dir and the caBundles; the manager only reads the
	// files.
	CertModeExternal = "external"
)

// WebhookOptions configure the webhooks, their certificate and the
// injected sidecar, as fixed by the wiring contract with the Helm chart.
type WebhookOptions struct {
	// Namespace is the manager's namespace: where the certificate Secret
	// and the managed stores' objects live, and which is never injected.
	Namespace string
	// SidecarImage is the image of the injected sidecar.
	SidecarImage string
	// Port is the webhook server's port.
	Port int
	// CertDir holds tls.crt and tls.key, reloaded by controller-runtime's
	// certwatcher.
	CertDir string
	// CertMode is CertModeSelfManaged or CertModeExternal.
	CertMode string
	// CertSecret is the Secret of the self-managed certificate.
	CertSecret string
	// ServiceName is the webhook Service, named in the certificate.
	ServiceName string
	// MutatingConfig and ValidatingConfig name the webhook
	// configurations whose caBundle a self-managed certificate keeps.
	MutatingConfig, ValidatingConfig string
}

// DefaultNamespace is the manager's namespace when neither --namespace nor
// $POD_NAMESPACE says otherwise.
const DefaultNamespace = "floodgate-system"

func defaultWebhookOptions() WebhookOptions {
	return WebhookOptions{
		Namespace:        DefaultNamespace,
		SidecarImage:     "floodgate-sidecar:latest",
		Port:             9443,
		CertDir:          "/tmp/k8s-webhook-server/serving-certs",
		CertMode:         CertModeSelfManaged,
		CertSecret:       "floodgate-webhook-cert",
		ServiceName:      "floodgate-webhook",
		MutatingConfig:   "floodgate-sidecar-injector",
		ValidatingConfig: "floodgate-policy-validator",
	}
}

func (w *WebhookOptions) bindFlags(fs flagSet) {
	fs.StringVar(&w.Namespace, "namespace", w.Namespace,
		"The manager's namespace (default $POD_NAMESPACE, else floodgate-system): it holds the webhook certificate Secret and managed stores, and is never injected.")
	fs.StringVar(&w.SidecarImage, "sidecar-image", w.SidecarImage, "Image of the injected floodgate-sidecar container.")
	fs.IntVar(&w.Port, "webhook-port", w.Port, "Port of the webhook server.")
	fs.StringVar(&w.CertDir, "webhook-cert-dir", w.CertDir, "Directory of the webhook server's tls.crt and tls.key.")
	fs.StringVar(&w.CertMode, "webhook-cert-mode", w.CertMode,
		"self-managed: keep a CA and serving certificate in --webhook-cert-secret, rotate them and write the caBundles; external: only read --webhook-cert-dir (cert-manager).")
	fs.StringVar(&w.CertSecret, "webhook-cert-secret", w.CertSecret, "Secret of the self-managed webhook certificate, in --namespace.")
	fs.StringVar(&w.ServiceName, "webhook-service-name", w.ServiceName, "The webhook Service; the certificate names <service>.<namespace>.svc.")
	fs.StringVar(&w.MutatingConfig, "mutating-webhook-config", w.MutatingConfig, "MutatingWebhookConfiguration of the sidecar injector.")
	fs.StringVar(&w.ValidatingConfig, "validating-webhook-config", w.ValidatingConfig, "ValidatingWebhookConfiguration of the RateLimitPolicy validator.")
}

func (w *WebhookOptions) validate() []error {
	var errs []error
	for _, c := range []struct{ flag, v string }{{"namespace", w.Namespace}, {"webhook-service-name", w.ServiceName}} {
		for _, msg := range validation.IsDNS1123Label(c.v) {
			errs = append(errs, fmt.Errorf("--%s: %s, got %q", c.flag, msg, c.v))
		}
	}
	if w.SidecarImage == "" {
		errs = append(errs, errors.New("--sidecar-image: must not be empty"))
	}
	if w.Port < 1 || w.Port > 65535 {
		errs = append(errs, fmt.Errorf("--webhook-port: must be between 1 and 65535, got %d", w.Port))
	}
	if w.CertDir == "" {
		errs = append(errs, errors.New("--webhook-cert-dir: must not be empty"))
	}
	switch w.CertMode {
	case CertModeSelfManaged:
		for _, c := range []struct{ flag, v string }{
			{"webhook-cert-secret", w.CertSecret},
			{"mutating-webhook-config", w.MutatingConfig},
			{"validating-webhook-config", w.ValidatingConfig},
		} {
			for _, msg := range validation.IsDNS1123Subdomain(c.v) {
				errs = append(errs, fmt.Errorf("--%s: %s, got %q", c.flag, msg, c.v))
			}
		}
	case CertModeExternal:
	default:
		errs = append(errs, fmt.Errorf("--webhook-cert-mode: must be %s or %s, got %q", CertModeSelfManaged, CertModeExternal, w.CertMode))
	}
	return errs
}

// flagSet is the part of flag.FlagSet the options bind to.
type flagSet interface {
	StringVar(p *string, name, value, usage string)
	IntVar(p *int, name string, value int, usage string)
}

// webhookServer is the controller-runtime webhook server of o: it loads
// the files of --webhook-cert-dir through certwatcher, so a renewed
// certificate is served without a restart.
//
// It always offers HTTP/2, whatever --enable-http2 says for the metrics
// server. The API server keeps its connection to a webhook replica open
// between admission requests, and a replica that stops must close it.
// Over HTTP/1.1 that close races the API server's next request on the
// connection, which then fails ("write: broken pipe") and, with
// failurePolicy Fail, refuses the pod. Over HTTP/2 the stopping replica
// sends GOAWAY first, and the API server's client retries any request the
// replica did not take on a new connection, to another replica. The
// stream-reset attacks that --enable-http2 guards the metrics server
// against are bounded in the Go runtime the manager is built with (Go
// 1.21.3 and later cap the handlers a connection can start).
func webhookServer(o *Options) webhook.Server {
	return webhook.NewServer(webhook.Options{Port: o.Webhook.Port, CertDir: o.Webhook.CertDir, TLSOpts: []func(*tls.Config){webhookTLS}})
}

// webhookTLS offers HTTP/2 and HTTP/1.1 to the webhook's callers.
func webhookTLS(c *tls.Config) { c.NextProtos = []string{"h2", "http/1.1"} }

// setupWebhookCert keeps the self-managed certificate: one sync now, so
// that the files exist when the webhook server starts, then a loop.
func setupWebhookCert(ctx context.Context, mgr ctrl.Manager, o *Options) error {
	w := o.Webhook
	if w.CertMode != CertModeSelfManaged {
		return nil
	}
	m, err := webhookcert.New(webhookcert.Options{
		Client:                  mgr.GetClient(),
		Reader:                  mgr.GetAPIReader(),
		Namespace:               w.Namespace,
		SecretName:              w.CertSecret,
		ServiceName:             w.ServiceName,
		CertDir:                 w.CertDir,
		MutatingWebhookConfig:   w.MutatingConfig,
		ValidatingWebhookConfig: w.ValidatingConfig,
		Log:                     ctrl.Log.WithName("webhookcert"),
	})
	if err != nil {
		return err
	}
	syncCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := m.Sync(syncCtx); err != nil {
		return fmt.Errorf("first sync of the webhook certificate: %w", err)
	}
	return mgr.Add(m)
}

// setupWebhooks registers the sidecar injector and the RateLimitPolicy
// validator on the webhook server.
func setupWebhooks(_ context.Context, mgr ctrl.Manager, o *Options) error {
	if err := injection.Setup(mgr, injection.DefaultOptions(o.Webhook.SidecarImage), o.Webhook.Namespace); err != nil {
		return err
	}
	return admission.Setup(mgr)
}

// setupSidecarAccess runs the controller of the sidecars' Role,
// RoleBinding and store password.
func setupSidecarAccess(_ context.Context, mgr ctrl.Manager, o *Options) error {
	r := &sidecaraccess.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ManagerNamespace: o.Webhook.Namespace}
	return r.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: 2})
}
