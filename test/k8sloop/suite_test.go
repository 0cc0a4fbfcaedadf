// Package k8sloop runs floodgate's Kubernetes loop against envtest's real
// kube-apiserver: the sidecar injector and the RateLimitPolicy validator
// installed as real webhooks (envtest's WebhookInstallOptions, with the
// configurations of config/webhook), served with a self-managed
// certificate that the webhookcert manager rotates; the
// ValidatingAdmissionPolicies of config/ (a sidecar's own pod status, and
// the pod labels only floodgate sets); the policy and sidecar-access
// controllers; and an in-process floodgate-sidecar in Kubernetes mode with
// an injected pod's identity.
package k8sloop

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/cmd/floodgate-manager/app"
	"github.com/floodgate-dev/floodgate/controllers/admission"
	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/controllers/sidecaraccess"
	"github.com/floodgate-dev/floodgate/controllers/webhookcert"
	"github.com/floodgate-dev/floodgate/test/kubetest"
)

// controlPlaneStart bounds each start of etcd and the kube-apiserver,
// BeforeSuite's and the restart a spec makes after killing the API server:
// a wait for the state the spec needs (the API server healthy), not a
// bound on floodgate. envtest's default of 20 s was missed by a restart on
// 2 cores busy with other tests and two spinning processes.
const controlPlaneStart = 2 * time.Minute

// The names the manager's flags default to, as in the Helm chart.
const (
	managerNamespace = "floodgate-system"
	certSecret       = "floodgate-webhook-cert"
	injectorConfig   = "floodgate-sidecar-injector"
	validatorConfig  = "floodgate-policy-validator"
	sidecarImage     = "registry.example/floodgate-sidecar:test"
	// propagation is the certificate manager's staging delay: longer
	// than certwatcher's 10s poll, so that even a missed file event
	// cannot leave a replica on a certificate whose CA was dropped.
	propagation = 12 * time.Second
)

var (
	testEnv   *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
	kubectl   *kubetest.Kubectl
	// webhookAddr is where the webhook server listens.
	webhookAddr string
	// managerCache is the manager's cache, which its controllers and
	// webhooks read (see managerFollows).
	managerCache client.Reader

	stopManager context.CancelFunc
	managerDone = make(chan error, 1)
)

func TestK8sLoop(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "floodgate Kubernetes loop suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is unset: run the tests with `make test`, or KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)")

	mutating, validating := webhookConfigurations()
	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			MutatingWebhooks:   []*admissionregistrationv1.MutatingWebhookConfiguration{mutating},
			ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{validating},
		},
		ControlPlaneStartTimeout: controlPlaneStart,
	}
	// A fixed certificate directory keeps the API server's serving
	// certificate across the restart one spec makes, so that clients
	// reconnect.
	testEnv.ControlPlane.GetAPIServer().CertDir = GinkgoT().TempDir()
	var err error
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())

	scheme, err := app.NewScheme()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	kubectl, err = kubetest.NewKubectl(testEnv, GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())

	ctx, cancel := context.WithCancel(context.Background())
	stopManager = cancel
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: managerNamespace}})).To(Succeed())
	// The policy that keeps each sidecar to its own pod's condition, and
	// the one that keeps the labels a store's NetworkPolicy trusts to the
	// pods floodgate labels (its param is the injector's configuration,
	// which envtest installs), as config/ and the Helm chart install them.
	for _, f := range []string{filepath.Join("rbac", "sidecar_pod_status_policy.yaml"), filepath.Join("webhook", "pod_labels_policy.yaml")} {
		out, err := kubectl.Run(ctx, "apply", "-f", filepath.Join("..", "..", "config", f))
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Println(out)
	}

	// The manager is composed as floodgate-manager composes it (same
	// scheme, cache options and setup functions, same RBAC), with the
	// webhook server on envtest's host and port and a self-managed
	// certificate that also names that host.
	wio := &testEnv.WebhookInstallOptions
	webhookAddr = net.JoinHostPort(wio.LocalServingHost, strconv.Itoa(wio.LocalServingPort))
	certDir := GinkgoT().TempDir()
	// The manager runs as its own service account, with exactly the
	// roles config/rbac grants it: a permission the manager needs and
	// the roles lack fails the suite.
	managerCfg, err := kubetest.ManagerIdentity(ctx, kubectl, cfg, filepath.Join("..", ".."))
	Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(managerCfg, ctrl.Options{
		// The conflict spec injects 409s into the manager's writes.
		NewClient:              conflicting,
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  app.CacheOptions(managerNamespace),
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: certDir,
		}),
	})
	Expect(err).NotTo(HaveOccurred())
	managerCache = mgr.GetCache()

	certs, err := webhookcert.New(webhookcert.Options{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
		Namespace: managerNamespace, SecretName: certSecret, ServiceName: "floodgate-webhook",
		ExtraHosts: []string{wio.LocalServingHost}, CertDir: certDir,
		MutatingWebhookConfig: injectorConfig, ValidatingWebhookConfig: validatorConfig,
		Propagation: propagation, SyncInterval: 500 * time.Millisecond,
		Log: ctrl.Log.WithName("webhookcert"),
	})
	Expect(err).NotTo(HaveOccurred())
	_, err = certs.Sync(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(mgr.Add(certs)).To(Succeed())

	Expect(injection.Setup(mgr, injection.DefaultOptions(sidecarImage), managerNamespace)).To(Succeed())
	Expect(admission.Setup(mgr)).To(Succeed())
	pr := &policy.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(app.Name)}
	Expect(pr.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	sa := &sidecaraccess.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ManagerNamespace: managerNamespace}
	Expect(sa.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	go func() {
		defer GinkgoRecover()
		managerDone <- mgr.Start(ctx)
	}()

	By("waiting for the webhooks to admit through the self-managed certificate")
	Eventually(func() error {
		return k8sClient.Create(ctx, validPolicy("default", "probe-"+rand.String(5), "default"), client.DryRunAll)
	}).WithTimeout(60 * time.Second).Should(Succeed())
})

var _ = AfterSuite(func() {
	if stopManager != nil {
		stopManager()
		Eventually(managerDone, 60*time.Second).Should(Receive(BeNil()))
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// webhookConfigurations reads config/webhook/manifests.yaml, the
// configurations generated from the +kubebuilder:webhook markers, and
// names them as config/webhook/kustomization.yaml and the Helm chart do.
func webhookConfigurations() (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "webhook", "manifests.yaml"))
	Expect(err).NotTo(HaveOccurred())
	var m admissionregistrationv1.MutatingWebhookConfiguration
	var v admissionregistrationv1.ValidatingWebhookConfiguration
	for _, doc := range splitYAML(data) {
		var meta metav1.TypeMeta
		Expect(yaml.Unmarshal(doc, &meta)).To(Succeed())
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			Expect(yaml.UnmarshalStrict(doc, &m)).To(Succeed())
		case "ValidatingWebhookConfiguration":
			Expect(yaml.UnmarshalStrict(doc, &v)).To(Succeed())
		}
	}
	Expect(m.Webhooks).To(HaveLen(1))
	Expect(v.Webhooks).To(HaveLen(2), "the RateLimitPolicy and ClusterRateLimitPolicy validators")
	m.Name, v.Name = injectorConfig, validatorConfig
	return &m, &v
}

func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}
