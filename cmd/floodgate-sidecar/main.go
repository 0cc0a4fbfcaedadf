// Command floodgate-sidecar is floodgate's enforcement proxy. It sits in
// front of an application, matches each request to the rate-limit rules in
// force, and proxies it or answers 429. With --grpc-listen it also serves
// Envoy's rate-limit service API on the same engine, and --check-config
// FILE validates and explains a policy file without serving. See package
// runner for the flags and their environment variables.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/floodgate-dev/floodgate/sidecar/configsource"
	"github.com/floodgate-dev/floodgate/sidecar/kubesource"
	"github.com/floodgate-dev/floodgate/sidecar/runner"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "floodgate-sidecar:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var cfg runner.Config
	fs := flag.NewFlagSet("floodgate-sidecar", flag.ContinueOnError)
	if err := cfg.Parse(fs, args, os.LookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if cfg.PrintRedisFunctions {
		_, src := redislayout.Library()
		_, err := fmt.Fprint(os.Stdout, src)
		return err
	}
	if cfg.CheckConfig != "" {
		return cfg.Check(os.Stdout, cfg.CheckConfig)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: runner.LogLevel(cfg.LogLevel)}))
	runner.RouteLibraryLogs(log)
	var source configsource.Source // nil: the runner watches --policy-file
	if cfg.Kubernetes {
		var err error
		if source, err = kubernetesSource(cfg, log); err != nil {
			return err
		}
	}
	r, err := runner.New(cfg, log, source) // validates cfg
	if err != nil {
		return err
	}
	gc := runner.PlanGC(cfg, os.LookupEnv, runner.ContainerMemoryLimit)
	runner.ApplyGC(gc)
	log.Info("garbage collector", "settings", gc.Why)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return r.Run(ctx)
}

// kubernetesSource builds the Kubernetes-mode source: the namespace's
// ConfigMap, read with the pod's service account (or --kubeconfig).
func kubernetesSource(cfg runner.Config, log *slog.Logger) (configsource.Source, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = "floodgate-sidecar"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return kubesource.New(kubesource.Options{Client: cs, Namespace: cfg.Namespace, PodName: cfg.PodName, ConfigMapName: cfg.ConfigMapName, Log: log})
}
