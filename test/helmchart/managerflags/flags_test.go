// Package managerflags checks that floodgate-manager accepts the command
// line the chart gives it: every flag the Deployment passes must be one the
// manager defines, with a value it accepts, for the default values and for
// every values set in test/helmchart/testdata/values.
//
// It is a package of its own because it imports the manager's composition
// root (cmd/floodgate-manager/app): the chart's other tests do not depend
// on the manager building.
package managerflags

import (
	"errors"
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/floodgate-dev/floodgate/cmd/floodgate-manager/app"
	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

func TestManagerAcceptsChartFlags(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(helmtest.RepoRoot(t), "test", "helmchart", "testdata", "values", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values sets found (%v)", err)
	}
	cases := map[string][]string{"default": nil}
	for _, f := range files {
		cases[strings.TrimSuffix(filepath.Base(f), ".yaml")] = []string{"-f", f}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var deps []*unstructured.Unstructured
			for _, d := range helmtest.Manifest(t, args...).OfKind("Deployment") {
				// The central rate-limit service's Deployment runs the
				// sidecar binary; its flags are checked in test/helmchart.
				if d.GetLabels()["app.kubernetes.io/component"] == "manager" {
					deps = append(deps, d)
				}
			}
			if len(deps) != 1 {
				t.Fatalf("%d manager Deployments rendered, want 1", len(deps))
			}
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(deps[0].Object, &d); err != nil {
				t.Fatal(err)
			}
			cmdline := d.Spec.Template.Spec.Containers[0].Args

			o := app.DefaultOptions()
			fs := flag.NewFlagSet(app.Name, flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o.BindFlags(fs)
			var missing []string
			for _, a := range cmdline {
				flagName, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if fs.Lookup(flagName) == nil {
					missing = append(missing, "--"+flagName)
				}
			}
			if len(missing) > 0 {
				t.Fatalf("floodgate-manager does not define %s, which the chart passes (notes/k8s-contract.md fixes these names)", strings.Join(missing, ", "))
			}
			if err := fs.Parse(cmdline); err != nil {
				t.Fatalf("floodgate-manager rejects the chart's args %q: %v", cmdline, err)
			}
			if fs.NArg() != 0 {
				t.Fatalf("floodgate-manager sees positional arguments %q", fs.Args())
			}
			if err := o.Validate(); err != nil {
				var joined interface{ Unwrap() []error }
				if errors.As(err, &joined) {
					t.Fatalf("floodgate-manager's Validate rejects the chart's args: %v", joined.Unwrap())
				}
				t.Fatalf("floodgate-manager's Validate rejects the chart's args: %v", err)
			}
		})
	}
}
