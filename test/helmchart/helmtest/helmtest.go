// Package helmtest runs the real helm binary against the floodgate chart for
// tests: rendering with `helm template`, linting, and installing into a test
// control plane. helm comes from $FLOODGATE_HELM, which `make test` sets to
// the pinned build of hack/tools.sh.
//
// Every helm run gets its own empty HELM_CACHE_HOME, HELM_CONFIG_HOME and
// HELM_DATA_HOME, so tests neither read nor write the user's helm state and
// can run in parallel.
package helmtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Release and Namespace are the release name and namespace the tests render
// the chart with. With release name "floodgate" the chart's full name is
// "floodgate", so the default object names are the contract's defaults
// (floodgate-webhook, floodgate-sidecar-injector, ...).
const (
	Release   = "floodgate"
	Namespace = "floodgate-system"
)

// KubeVersion is the Kubernetes version `helm template` renders for: the
// version of the envtest control plane.
const KubeVersion = "1.37.2"

// runTimeout bounds one helm run.
const runTimeout = 3 * time.Minute

// Binary returns the helm binary named by $FLOODGATE_HELM, failing t when it
// is unset or missing.
func Binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("FLOODGATE_HELM")
	if bin == "" {
		t.Fatal("FLOODGATE_HELM is unset: run the tests with `make test`, which builds helm with hack/tools.sh helm and exports its path")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("FLOODGATE_HELM=%s: %v (run `make test`, which builds it)", bin, err)
	}
	return bin
}

// RepoRoot returns the root of the floodgate checkout.
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the helmtest source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// ChartDir returns the chart's directory, charts/floodgate.
func ChartDir(t testing.TB) string {
	t.Helper()
	return filepath.Join(RepoRoot(t), "charts", "floodgate")
}

// Result is the outcome of one helm run.
type Result struct {
	// Stdout and Stderr are helm's output streams.
	Stdout, Stderr string
	// Err is non-nil when helm could not run or exited non-zero.
	Err error
}

// Run runs helm with args and an isolated helm home, and returns what it
// printed. A non-zero exit is reported in Result.Err, not as a test failure,
// so that tests can assert on failures too.
func Run(t testing.TB, args ...string) Result {
	t.Helper()
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, Binary(t), args...)
	cmd.Env = append(cleanEnv(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return Result{Stdout: stdout.String(), Stderr: stderr.String(), Err: err}
}

// cleanEnv is the test's environment without the variables that would
// point helm at the user's cluster or helm state.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "KUBECONFIG" || strings.HasPrefix(name, "HELM_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// MustRun is Run that fails t when helm fails.
func MustRun(t testing.TB, args ...string) Result {
	t.Helper()
	r := Run(t, args...)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	return r
}

// TemplateArgs returns the arguments of `helm template` for the chart with
// the test release name and namespace, followed by extra.
func TemplateArgs(t testing.TB, extra ...string) []string {
	t.Helper()
	return append([]string{"template", Release, ChartDir(t),
		"--namespace", Namespace, "--kube-version", KubeVersion}, extra...)
}

// Template renders the chart with extra arguments (such as -f file or
// --set k=v) and returns the manifest, failing t when helm fails.
func Template(t testing.TB, extra ...string) string {
	t.Helper()
	return MustRun(t, TemplateArgs(t, extra...)...).Stdout
}

// Objects parses a multi-document manifest. Empty documents (such as a
// template that rendered nothing) are skipped.
func Objects(manifest string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading manifest: %w", err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("parsing document %q: %w", firstLine(doc), err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// Manifest renders the chart and parses it, failing t on any error.
func Manifest(t testing.TB, extra ...string) Set {
	t.Helper()
	objs, err := Objects(Template(t, extra...))
	if err != nil {
		t.Fatal(err)
	}
	return Set(objs)
}

// Set is a rendered chart's objects.
type Set []*unstructured.Unstructured

// Find returns the object of kind and name, or nil.
func (s Set) Find(kind, name string) *unstructured.Unstructured {
	for _, o := range s {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Get is Find that fails t when the object is missing, listing what the
// chart rendered instead.
func (s Set) Get(t testing.TB, kind, name string) *unstructured.Unstructured {
	t.Helper()
	if o := s.Find(kind, name); o != nil {
		return o
	}
	t.Fatalf("the chart rendered no %s %q; it rendered:\n%s", kind, name, strings.Join(s.Names(), "\n"))
	return nil
}

// OfKind returns the objects of kind.
func (s Set) OfKind(kind string) Set {
	var out Set
	for _, o := range s {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// Names lists the objects as "Kind namespace/name", sorted.
func (s Set) Names() []string {
	out := make([]string, 0, len(s))
	for _, o := range s {
		out = append(out, fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName()))
	}
	sort.Strings(out)
	return out
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}
