// Command localenv runs a local Kubernetes control plane for the demo: the
// real kube-apiserver and etcd from envtest, with floodgate's CRDs installed.
// It writes an admin kubeconfig, prints "ready" on stdout, and runs until it
// gets SIGINT or SIGTERM, when it stops both processes.
//
// Usage: KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh) go run ./hack/localenv -kubeconfig FILE
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "localenv:", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "where to write the admin kubeconfig (required)")
	crds := flag.String("crds", "config/crd/bases", "directory of CRDs to install; empty installs none")
	flag.Parse()
	if *kubeconfig == "" {
		return fmt.Errorf("-kubeconfig is required")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return fmt.Errorf("KUBEBUILDER_ASSETS is unset: set it to the output of hack/envtest-assets.sh")
	}

	env := &envtest.Environment{}
	if *crds != "" {
		if _, err := os.Stat(*crds); err == nil {
			env.CRDDirectoryPaths = []string{*crds}
			env.ErrorIfCRDPathMissing = true
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if _, err := env.Start(); err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "localenv: stopping:", err)
		}
	}()

	user, err := env.AddUser(envtest.User{Name: "floodgate-demo-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("adding the admin user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("building the kubeconfig: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(*kubeconfig), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(*kubeconfig, data, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	fmt.Println("ready")
	<-ctx.Done()
	return nil
}
