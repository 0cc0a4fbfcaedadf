// Command demo runs floodgate end to end on one machine and prints what it
// does: it is what `make demo` runs.
//
// Real parts only: envtest's kube-apiserver and etcd with floodgate's CRDs
// and webhooks installed, a Redis Cluster of three masters and three
// replicas on loopback, floodgate-manager as a local process serving its
// webhooks, and the floodgate-sidecar that the injection webhook put into a
// Pod, run as a local process with exactly the injected configuration in
// front of a small sample backend. The demo plays the kubelet: it runs that
// container and marks the Pod ready.
//
// Everything it starts is stopped when it ends, at the end or on Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	var o options
	flag.StringVar(&o.work, "work", ".demo", "working directory for logs, kubeconfig and binaries")
	flag.StringVar(&o.bin, "bin", "", "directory holding floodgate-manager and floodgate-sidecar (default: build them into WORK/bin)")
	flag.IntVar(&o.redisBasePort, "redis-base-port", 21001, "first port of the demo's Redis Cluster; each node also uses its port + 10000 for the cluster bus, kept below the ephemeral port range (32768+) so that outgoing connections cannot take them")
	flag.BoolVar(&o.keep, "keep", false, "keep everything running after the report until Ctrl-C")
	flag.Parse()
	// envtest logs through controller-runtime; the demo prints its own
	// report, and the processes it starts log to files.
	logf.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	start := time.Now()
	d := &demo{opts: o, start: start}
	err := d.run(ctx)
	d.cleanup()
	switch {
	case errors.Is(err, context.Canceled):
		fmt.Println("\ninterrupted: everything the demo started has been stopped")
		os.Exit(130)
	case err != nil:
		fmt.Fprintf(os.Stderr, "\ndemo failed: %v\nlogs are in %s\n", err, d.work)
		os.Exit(1)
	}
	fmt.Printf("\ndemo finished in %s; everything it started has been stopped\n", time.Since(start).Round(time.Second))
}

type options struct {
	work          string
	bin           string
	redisBasePort int
	keep          bool
}

// run is the demo, step by step.
func (d *demo) run(ctx context.Context) error {
	work, err := filepath.Abs(d.opts.work)
	if err != nil {
		return err
	}
	d.work = work
	if err := os.RemoveAll(filepath.Join(work, "run")); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(work, "run"), 0o755); err != nil {
		return err
	}

	steps := []struct {
		title string
		fn    func(context.Context) error
	}{
		{"Preparing: redis-server, envtest binaries, floodgate binaries", d.prepare},
		{"Starting the control plane: kube-apiserver and etcd, with floodgate's CRDs and webhooks", d.startControlPlane},
		{"Starting a Redis Cluster: 3 masters and 3 replicas on loopback", d.startRedis},
		{"Starting floodgate-manager: policy and store controllers, injection and validation webhooks", d.startManager},
		{"Applying a CounterStore and a RateLimitPolicy with kubectl", d.applyPolicies},
		{"Creating an annotated Pod: the webhook injects the sidecar", d.createPod},
		{"Running the injected sidecar in front of the sample backend", d.startSidecar},
		{"Traffic: allowed and denied per rule", d.trafficPerRule},
		{"Invalid input is refused at admission", d.showRejection},
		{"Editing the policy live", d.editPolicy},
		{"Killing a Redis master: fail-open and fail-closed", d.killMaster},
		{"Where to find the metrics", d.showMetrics},
	}
	for i, s := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		fmt.Printf("\n\033[1m[%d/%d] %s\033[0m  (t=%s)\n", i+1, len(steps), s.title, time.Since(d.start).Round(100*time.Millisecond))
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.title, err)
		}
	}
	if d.opts.keep {
		fmt.Println("\neverything keeps running (-keep); press Ctrl-C to stop")
		<-ctx.Done()
	}
	return nil
}
