// Package e2e is floodgate's end-to-end suite. It runs the whole system on
// this machine with real parts, as `make demo` does (both through
// test/simnode): envtest's kube-apiserver and etcd with the CRDs applied
// by kubectl and the webhooks registered, a Redis Cluster of 3 masters and
// 3 replicas on loopback, floodgate-manager as a local process serving the
// webhooks, and for each annotated Pod the injected floodgate-sidecar run
// as a local process with the injected arguments and environment in front
// of a real backend. Only loopback addresses are used.
//
// The suite shares one control plane, one manager and one Redis Cluster;
// each Describe works in its own namespace with its own policy and keys.
// The binaries are built once, in BeforeSuite. Every process it starts
// dies with it (Pdeathsig), and AfterSuite stops them all.
package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/floodgate-dev/floodgate/test/redistest"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

// storeName is the CounterStore every policy of the suite uses.
const storeName = "e2e"

var (
	stack   *simnode.Stack
	manager *simnode.Manager
	cluster *redistest.Cluster
	workDir string
	// failed keeps the logs of a run where a spec failed.
	failed bool
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "floodgate end-to-end suite")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is unset: run the tests with `make test`, or KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	Expect(err).NotTo(HaveOccurred())
	workDir, err = os.MkdirTemp("", "floodgate-e2e-")
	Expect(err).NotTo(HaveOccurred())
	bin := filepath.Join(workDir, "bin")

	By("building floodgate-manager and floodgate-sidecar")
	start := time.Now()
	Expect(simnode.BuildBinaries(ctx, GinkgoWriter, root, bin)).To(Succeed())
	AddReportEntry("binaries built", time.Since(start).Round(time.Millisecond).String())

	By("starting a Redis Cluster: 3 masters, 3 replicas on loopback")
	cluster, err = redistest.NewCluster(redistest.Options{Masters: 3, Replicas: 1})
	Expect(err).NotTo(HaveOccurred())

	By("starting the control plane and applying the CRDs with kubectl")
	stack, err = simnode.New(simnode.Options{Root: root, Work: filepath.Join(workDir, "run"), Bin: bin})
	Expect(err).NotTo(HaveOccurred())
	Expect(stack.StartControlPlane(ctx)).To(Succeed())

	By("starting floodgate-manager")
	manager, err = stack.StartManager(ctx)
	Expect(err).NotTo(HaveOccurred())

	By("applying the suite's CounterStore with kubectl")
	var addrs strings.Builder
	for _, a := range cluster.Addrs() {
		fmt.Fprintf(&addrs, "    - %q\n", a)
	}
	apply(ctx, "counterstore.yaml", fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata:
  name: %s
spec:
  external:
    addresses:
%s`, storeName, addrs.String()))
	waitStoreReady(ctx)
}, NodeTimeout(setupTimeout))

// setupTimeout bounds the suite's setup. On a cold Go build cache,
// building the two binaries (without -race, so nothing of the test build is
// reused) alone took more than 5 minutes on 2 cores busy with other tests.
const setupTimeout = 20 * time.Minute

var _ = AfterSuite(func() {
	if stack != nil {
		Expect(stack.Stop()).To(Succeed())
	}
	if cluster != nil {
		cluster.Close()
	}
	if workDir != "" {
		if failed || os.Getenv("FLOODGATE_E2E_KEEP") != "" {
			_, _ = fmt.Fprintf(GinkgoWriter, "logs kept in %s\n", workDir)
			return
		}
		Expect(os.RemoveAll(workDir)).To(Succeed())
	}
})

var _ = AfterEach(func() {
	if CurrentSpecReport().Failed() {
		failed = true
	}
})
