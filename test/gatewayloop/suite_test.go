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
	"bytes"
	"context"
	"encoding/json"
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

// The releases of Istio and Envoy Gateway whose CRDs the suite installs,
// from their Go modules on the module proxy: the objects the manager
// applies to gateways are validated by the API server against these
// schemas.
const (
	istioAPIModule          = "istio.io/api@v1.32.0"
	envoyGatewayModule      = "github.com/envoyproxy/gateway@v1.9.1"
	istioCRDFile            = "kubernetes/customresourcedefinitions.gen.yaml"
	envoyPatchPolicyCRDFile = "charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_envoypatchpolicies.yaml"
)

// gatewayImplCRDs returns Istio's CRDs (EnvoyFilter among them) and Envoy
// Gateway's EnvoyPatchPolicy CRD, downloading their modules into the Go
// module cache, outside the checkout, when they are not there yet.
func gatewayImplCRDs() []string {
	cmd := exec.Command("go", "mod", "download", "-json", istioAPIModule, envoyGatewayModule)
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "downloading %s and %s from the module proxy: %s", istioAPIModule, envoyGatewayModule, out)
	dirs := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var m struct{ Path, Version, Dir, Error string }
		Expect(dec.Decode(&m)).To(Succeed())
		Expect(m.Error).To(BeEmpty(), "downloading %s", m.Path)
		dirs[m.Path+"@"+m.Version] = m.Dir
	}
	Expect(dirs).To(HaveKey(istioAPIModule))
	Expect(dirs).To(HaveKey(envoyGatewayModule))
	return []string{
		filepath.Join(dirs[istioAPIModule], istioCRDFile),
		filepath.Join(dirs[envoyGatewayModule], envoyPatchPolicyCRDFile),
	}
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is unset: run the tests with `make test`, or KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)")

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		CRDInstallOptions:     envtest.CRDInstallOptions{Paths: append(gatewayAPICRDs(), gatewayImplCRDs()...)},
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
	// The specs' namespaces, and that of another tenant's gateway, exist
	// before the manager starts: it keeps the gateways' client
	// certificates there from its first pass.
	for _, ns := range []string{"shop", "mesh", "other"} {
		Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	}

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
		// --apply-gateway-config --apply-gateway-classes=fg-istio,fg-eg
		Apply: ratelimitservice.GatewayApply{Enabled: true, Classes: appliedClasses},
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
	startManagedStore(ctx, store, 3)
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
