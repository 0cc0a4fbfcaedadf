// Package helmchart tests the floodgate Helm chart (charts/floodgate) with
// the real helm binary: lint, golden renders, schema validation, the wiring
// contract with the manager, drift from the generated CRDs and RBAC, the
// values documentation, and an install into envtest's real kube-apiserver.
//
// Run with `make test`, which exports FLOODGATE_HELM and KUBEBUILDER_ASSETS.
// `go test ./test/helmchart -update` rewrites the golden files.
package helmchart

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

// valueSets are the values files in testdata/values, by name. Each is
// linted, rendered against a golden file and installed where noted.
func valueSets(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "values", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no values files in testdata/values")
	}
	sets := make(map[string]string, len(files))
	for _, f := range files {
		sets[strings.TrimSuffix(filepath.Base(f), ".yaml")] = f
	}
	return sets
}

func TestLint(t *testing.T) {
	t.Parallel()
	chart := helmtest.ChartDir(t)
	cases := map[string][]string{
		"default":        {"lint", chart},
		"default-strict": {"lint", "--strict", chart},
	}
	for name, file := range valueSets(t) {
		cases[name+"-strict"] = []string{"lint", "--strict", chart, "-f", file}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := helmtest.Run(t, append(args, "--namespace", helmtest.Namespace, "--kube-version", helmtest.KubeVersion)...)
			if r.Err != nil {
				t.Fatalf("helm %s failed: %v\nstdout:\n%s", strings.Join(args, " "), r.Err, r.Stdout)
			}
			if !strings.Contains(r.Stdout, "1 chart(s) linted, 0 chart(s) failed") {
				t.Errorf("helm lint did not report a clean chart:\n%s", r.Stdout)
			}
			for _, line := range strings.Split(r.Stdout, "\n") {
				if strings.Contains(line, "[WARNING]") || strings.Contains(line, "[ERROR]") {
					t.Errorf("helm lint: %s", line)
				}
			}
		})
	}
}
