// Package gatewayloop runs the gateway half of floodgate against envtest's
// real kube-apiserver, with the Gateway API CRDs of the
// sigs.k8s.io/gateway-api module installed: the manager's policy and
// central rate-limit service controllers and the keeper of the service's
// certificates, a real Redis Cluster, and replicas of the central
// rate-limit service (floodgate-sidecar in Kubernetes mode watching
// floodgate-ratelimit-policies, answering Envoy's rate-limit API over TLS
// to gateways with a client certificate) that a real gRPC client asks,
// with a gateway's certificate, with the descriptors floodgate's generated
// route actions produce.
package gatewayloop

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
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
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/controllers/ratelimitservice"
	"github.com/floodgate-dev/floodgate/controllers/rlsidentity"
)

// serviceNamespace is the central service's (and the manager's) namespace.
const serviceNamespace = "floodgate-system"

var (
	testEnv     *envtest.Environment
	cfg         *rest.Config
	k8sClient   client.Client
	stopManager context.CancelFunc
	managerDone = make(chan error, 1)
)

func TestGatewayLoop(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "floodgate gateway loop suite")
}

// gatewayAPICRDs returns the standard-channel HTTPRoute, GRPCRoute,
// Gateway and GatewayClass CRDs of the sigs.k8s.io/gateway-api module in
// go.mod.
func gatewayAPICRDs() []string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api").Output()
	Expect(err).NotTo(HaveOccurred(), "locating the sigs.k8s.io/gateway-api module")
	dir := filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "standard")
	var files []string
	for _, kind := range []string{"gatewayclasses", "gateways", "httproutes", "grpcroutes"} {
		files = append(files, filepath.Join(dir, "gateway.networking.k8s.io_"+kind+".yaml"))
	}
	return files
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is unset: run the tests with `make test`, or KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)")

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		CRDInstallOptions:     envtest.CRDInstallOptions{Paths: gatewayAPICRDs()},
		ErrorIfCRDPathMissing: true,
	}
	var err error
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())

	scheme, err := app.NewScheme()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	ctx, cancel := context.WithCancel(context.Background())
	stopManager = cancel
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: serviceNamespace}})).To(Succeed())
	// The namespace of another tenant's gateway.
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}})).To(Succeed())

	// Composed as floodgate-manager --ratelimit-service composes it.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  app.CacheOptions(serviceNamespace),
	})
	Expect(err).NotTo(HaveOccurred())
	pr := &policy.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(app.Name)}
	Expect(pr.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	rr := &ratelimitservice.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(app.Name),
		Namespace: serviceNamespace,
		Service:   gatewayconfig.Service{Name: "floodgate-ratelimit", Namespace: serviceNamespace, Port: 8082, TLS: true},
	}
	Expect(rr.SetupWithManager(mgr, controller.Options{})).To(Succeed())
	Expect(rr.GatewayAPI).To(BeTrue(), "envtest serves the Gateway API CRDs")
	// --ratelimit-service-tls --ratelimit-gateways=shop/public,other/gw
	ids, err := rlsidentity.New(rlsidentity.Options{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: serviceNamespace, ServiceName: "floodgate-ratelimit",
		Gateways: []rlsidentity.Gateway{{Namespace: "shop", Name: "public"}, {Namespace: "other", Name: "gw"}},
		Log:      ctrl.Log.WithName("rlsidentity"),
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(mgr.Add(ids)).To(Succeed())
	go func() {
		defer GinkgoRecover()
		managerDone <- mgr.Start(ctx)
	}()
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
