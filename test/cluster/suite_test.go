// Package cluster is floodgate's suite on a real Kubernetes node: the node
// that hack/cluster.sh runs on this machine (a kubelet with containerd and
// runc, the CNI bridge, kube-proxy in iptables mode, and the control
// plane), with the images of `make images` imported into containerd.
// Nothing is played by the test: the kubelet starts the injected native
// sidecar, mounts its volumes, enforces its securityContext, runs its
// probes and evaluates the floodgate.dev/policy-loaded readiness gate; the
// StatefulSet controller runs the managed Redis Cluster; kube-proxy routes
// the Services.
//
// Run it with `make test-cluster` (part of `make test`), which starts the
// node, runs this suite with FLOODGATE_CLUSTER_KUBECONFIG pointing at it,
// and removes the node afterwards, also on Ctrl-C. The test process runs on
// the node, so it reaches pod and Service IPs directly.
//
// The specs are ordered: they install the chart once, deploy one
// application, and walk through what a user does with it, ending with
// `helm uninstall`.
package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

const (
	// release and releaseNS are where the chart is installed.
	release   = "floodgate"
	releaseNS = "floodgate-system"
	// registry is where the images of `make images` are named from.
	registry = "ghcr.io/floodgate-dev"
)

var (
	k8s        client.WithWatch
	kubeconfig string
	kubectlBin string
	helmBin    string
	root       string
	// appVersion is the chart's appVersion, the tag of every image.
	appVersion string
	helmHome   string
)

func TestCluster(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "floodgate on a real node")
}

var _ = BeforeSuite(func() {
	kubeconfig = os.Getenv("FLOODGATE_CLUSTER_KUBECONFIG")
	Expect(kubeconfig).NotTo(BeEmpty(),
		"FLOODGATE_CLUSTER_KUBECONFIG is unset: run this suite with `make test-cluster` (or hack/cluster.sh run go test ./test/cluster/), which starts a real node")
	kubectlBin = os.Getenv("FLOODGATE_KUBECTL")
	Expect(kubectlBin).NotTo(BeEmpty(), "FLOODGATE_KUBECTL is unset: hack/cluster.sh run sets it")
	helmBin = os.Getenv("FLOODGATE_HELM")
	Expect(helmBin).NotTo(BeEmpty(), "FLOODGATE_HELM is unset: `make test-cluster` sets it to hack/tools.sh helm")
	var err error
	root, err = filepath.Abs(filepath.Join("..", ".."))
	Expect(err).NotTo(HaveOccurred())
	chart, err := os.ReadFile(filepath.Join(root, "charts", "floodgate", "Chart.yaml"))
	Expect(err).NotTo(HaveOccurred())
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	Expect(yaml.Unmarshal(chart, &c)).To(Succeed())
	appVersion = c.AppVersion
	Expect(appVersion).NotTo(BeEmpty())

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	cfg.QPS, cfg.Burst = 50, 100
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	helmHome, err = os.MkdirTemp("", "floodgate-cluster-helm-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, helmHome)
})

// image returns the reference of one of the images of `make images`.
func image(name string) string { return registry + "/" + name + ":" + appVersion }

// run runs a command and returns its standard output; it fails the spec
// with both outputs when the command fails.
func run(ctx context.Context, stdin string, env []string, name string, args ...string) string {
	GinkgoHelper()
	out, err := tryRun(ctx, stdin, env, name, args...)
	Expect(err).NotTo(HaveOccurred())
	return out
}

func tryRun(ctx context.Context, stdin string, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	_, _ = fmt.Fprintf(GinkgoWriter, "$ %s %s (%v)\n%s%s", filepath.Base(name), strings.Join(args, " "),
		time.Since(start).Round(time.Millisecond), stdout.String(), stderr.String())
	if err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// kubectl runs the real kubectl against the node.
func kubectl(ctx context.Context, args ...string) string {
	GinkgoHelper()
	return run(ctx, "", nil, kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

// apply applies a manifest with kubectl.
func apply(ctx context.Context, manifest string) string {
	GinkgoHelper()
	return run(ctx, manifest, nil, kubectlBin, "--kubeconfig", kubeconfig, "apply", "-f", "-")
}

// helm runs the real helm against the node, with its own empty state
// directories.
func helm(ctx context.Context, args ...string) string {
	GinkgoHelper()
	env := []string{
		"KUBECONFIG=" + kubeconfig,
		"HELM_CACHE_HOME=" + filepath.Join(helmHome, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(helmHome, "config"),
		"HELM_DATA_HOME=" + filepath.Join(helmHome, "data"),
	}
	return run(ctx, "", env, helmBin, args...)
}
