package webhookcert_test

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/floodgate-dev/floodgate/controllers/webhookcert"
)

// TestSecretIsOwnedByTheMutatingWebhookConfiguration: the certificate
// Secret the manager creates is a dependent of the mutating webhook
// configuration, which the chart installs, so that `helm uninstall`
// (which deletes the configuration) leaves no Secret behind on a real
// cluster, where the garbage collector runs. A Secret written before,
// without the reference, gets it at the next sync.
func TestSecretIsOwnedByTheMutatingWebhookConfiguration(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is unset: run the tests with `make test`, which builds the envtest binaries")
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fg"}}); err != nil {
		t.Fatal(err)
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "fg-injector"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "inject.floodgate.dev",
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "fg", Name: "fg-webhook", Path: ptr.To("/inject")},
			},
		}},
	}
	if err := c.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	sync := func(mutating string) {
		t.Helper()
		m, err := webhookcert.New(webhookcert.Options{
			Client: c, Reader: c, Namespace: "fg", SecretName: "fg-webhook-cert", ServiceName: "fg-webhook",
			CertDir: t.TempDir(), MutatingWebhookConfig: mutating, Log: logr.Discard(),
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	owned := func() bool {
		t.Helper()
		var s corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: "fg", Name: "fg-webhook-cert"}, &s); err != nil {
			t.Fatal(err)
		}
		for _, r := range s.OwnerReferences {
			if r.UID == mwc.UID && r.Kind == "MutatingWebhookConfiguration" && r.Name == mwc.Name &&
				r.APIVersion == "admissionregistration.k8s.io/v1" {
				return true
			}
		}
		return false
	}
	// A Secret written while no configuration is named (as before).
	sync("")
	if owned() {
		t.Fatal("the Secret is owned though no configuration was named")
	}
	sync(mwc.Name)
	if !owned() {
		t.Error("after a sync, the Secret is not owned by the mutating webhook configuration")
	}
}
