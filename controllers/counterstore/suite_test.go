package counterstore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/floodgate-dev/floodgate/cmd/floodgate-manager/app"
	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/test/kubetest"
)

// passwordOverlap is how long the suite's manager keeps an old sidecar
// password after a rotation.
const passwordOverlap = 5 * time.Second

var (
	testEnv *envtest.Environment
	// k8sClient talks to the API server directly, so tests see what is
	// stored.
	k8sClient client.Client
	// restConfig reaches the API server as envtest's admin.
	restConfig *rest.Config
	// storeMetrics is the suite's own registry of the CounterStore
	// metrics, which the controller exports.
	storeMetrics = prometheus.NewRegistry()
	stopManager  context.CancelFunc
	managerDone  = make(chan error, 1)
)

func TestCounterStoreController(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "CounterStore controller suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is unset: run the tests with `make test`, which builds kube-apiserver, etcd and kubectl "+
			"and points KUBEBUILDER_ASSETS at them (hack/envtest-assets.sh)")

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	restConfig = cfg

	scheme, err := app.NewScheme()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	ctx, cancel := context.WithCancel(context.Background())
	stopManager = cancel
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: counterstore.DefaultNamespace}})).
		To(Or(Succeed(), WithTransform(apierrors.IsAlreadyExists, BeTrue())))

	// The manager is built as floodgate-manager builds it (same scheme
	// and cache options) and runs both controllers, so a policy without a
	// storeRef can be checked against the default store end to end.
	// The manager runs as its own service account, with exactly the
	// roles config/rbac grants it.
	kubectl, err := kubetest.NewKubectl(testEnv, GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
	managerCfg, err := kubetest.ManagerIdentity(ctx, kubectl, cfg, filepath.Join("..", ".."))
	Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(managerCfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  app.CacheOptions(counterstore.DefaultNamespace),
	})
	Expect(err).NotTo(HaveOccurred())
	pr := &policy.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder(app.Name)}
	Expect(pr.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	// Production defaults, except a shorter dial timeout (a killed node on
	// loopback refuses at once anyway) and a shorter password overlap (the
	// rotation spec plays the kubelet within a second).
	Expect(counterstore.Setup(ctx, mgr, counterstore.NewMetrics(storeMetrics), counterstore.Options{DialTimeout: time.Second, PasswordOverlap: passwordOverlap},
		controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	go func() {
		defer GinkgoRecover()
		managerDone <- mgr.Start(ctx)
	}()
})

var _ = AfterSuite(func() {
	if stopManager != nil {
		stopManager()
		Eventually(managerDone, 30*time.Second).Should(Receive(BeNil()))
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})
