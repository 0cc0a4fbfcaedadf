// Command floodgate-manager runs floodgate's Kubernetes controllers and
// webhooks: it compiles RateLimitPolicies into the per-namespace ConfigMaps
// that the sidecars watch, runs and heals CounterStores, injects the
// sidecar into opted-in pods, and validates policies at admission.
//
// Run it with -h for the flags. The wiring lives in package app; this file
// only hands it the command line and the signal-bound context.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/floodgate-dev/floodgate/cmd/floodgate-manager/app"
)

func main() {
	os.Exit(app.Main(ctrl.SetupSignalHandler(), os.Args[1:], os.Stderr))
}
