// Package kubetest holds helpers for tests that run against envtest's real
// kube-apiserver: a wrapper for the real kubectl, authenticated as an admin
// user of the test control plane.
package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Kubectl runs the kubectl binary from the envtest assets directory against
// one test control plane.
type Kubectl struct {
	// Path is the kubectl binary.
	Path string
	// Kubeconfig is the file that points kubectl at the test API server.
	Kubeconfig string
}

// NewKubectl writes a kubeconfig for a new system:masters user of env into
// dir and returns a Kubectl that uses it. env must be started.
func NewKubectl(env *envtest.Environment, dir string) (*Kubectl, error) {
	user, err := env.AddUser(envtest.User{Name: "floodgate-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("adding a kubectl user to envtest: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("building the kubectl kubeconfig: %w", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	return &Kubectl{Path: bin, Kubeconfig: path}, nil
}

// ForConfig returns a Kubectl that authenticates as cfg does (a bearer
// token, say, of a pod's service account), writing its kubeconfig into
// dir. Only cfg's server, CA and credentials are used.
func ForConfig(cfg *rest.Config, dir, name string) (*Kubectl, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{
		Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile,
	}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "user"}
	kc.CurrentContext = "test"
	path := filepath.Join(dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	return &Kubectl{Path: bin, Kubeconfig: path}, nil
}

// Binary returns the kubectl in KUBEBUILDER_ASSETS.
func Binary() (string, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return "", fmt.Errorf("KUBEBUILDER_ASSETS is unset: run the tests with `make test`")
	}
	bin := filepath.Join(assets, "kubectl")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("kubectl not found in KUBEBUILDER_ASSETS: %w", err)
	}
	return bin, nil
}

// Run runs kubectl with args and returns its trimmed combined output.
func (k *Kubectl) Run(ctx context.Context, args ...string) (string, error) {
	return k.RunWithInput(ctx, nil, args...)
}

// RunWithInput runs kubectl with args, feeding stdin, and returns its trimmed
// combined output. A non-zero exit is an error whose text includes the
// output, so assertions can show what kubectl said.
func (k *Kubectl) RunWithInput(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, k.Path, append([]string{"--kubeconfig", k.Kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		return text, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, text)
	}
	return text, nil
}
