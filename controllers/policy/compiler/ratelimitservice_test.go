package compiler

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// TestGoldenRateLimitService compiles testdata/ratelimitservice/*.yaml as
// the central rate-limit service's document.
func TestGoldenRateLimitService(t *testing.T) {
	t.Parallel()
	inputs, err := filepath.Glob("testdata/ratelimitservice/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) == 0 {
		t.Fatal("no testdata/ratelimitservice/*.yaml inputs")
	}
	for _, file := range inputs {
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in := readInput(t, file)
			out, err := CompileRateLimitService(ServiceInput{Policies: in.Policies, Pods: in.Pods, Stores: in.Stores, Previous: in.Previous,
				Targets: goldenTargets[name]})
			if err != nil {
				t.Fatalf("CompileRateLimitService: %v", err)
			}
			got := render(t, out)
			goldenFile := filepath.Join("testdata", "ratelimitservice", name+".golden")
			if *update {
				if err := os.WriteFile(goldenFile, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(goldenFile)
			if err != nil {
				t.Fatalf("%v (run go test ./controllers/policy/compiler -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("CompileRateLimitService(%s) differs from %s (rerun with -update if the change is intended)\n got:\n%s\nwant:\n%s",
					file, goldenFile, got, want)
			}
			if out.Action != Apply {
				return
			}
			c, err := config.Load([]byte(out.Data))
			if err != nil {
				t.Fatalf("the central service rejects the compiled document: %v", err)
			}
			for _, p := range c.Policies {
				if p.PodSelector != nil {
					t.Errorf("policy %s/%s has a podSelector %v; every replica of the service enforces every policy", p.Namespace, p.Name, p.PodSelector)
				}
				target := goldenTargets[name][config.PolicyEntryValue(p.Namespace, p.Name)]
				want := slices.Sorted(slices.Values(target.Gateways))
				if !target.Found {
					want = nil
				}
				if !slices.Equal(p.Gateways, want) {
					t.Errorf("policy %s/%s may be asked about by gateways %q, want those of its found target, %q", p.Namespace, p.Name, p.Gateways, want)
				}
			}
		})
	}
}

// goldenTargets are what the manager found of the golden inputs'
// targets, by input file and policy.
var goldenTargets = map[string]map[string]v1alpha1.TargetStatus{
	"two-namespaces": {
		// An HTTPRoute that two Gateways accepted.
		"team-a/edge": {Ref: "HTTPRoute/api", Found: true, Gateways: []string{"team-a/internal", "infra/public"}},
		// A Gateway's listener.
		"team-b/edge": {Ref: "Gateway/public/https", Found: true, Gateways: []string{"team-b/public"}},
	},
	"conflict-and-carry": {
		"team-a/first": {Ref: "HTTPRoute/api", Found: true, Gateways: []string{"infra/public"}},
		// The carried entry is asked about by the gateways its target
		// has now.
		"team-c/broken": {Ref: "HTTPRoute/api", Found: true, Gateways: []string{"team-c/moved"}},
		// A target not found lets no gateway ask.
		"team-b/other-store": {Ref: "HTTPRoute/api", Gateways: []string{"infra/public"}},
	},
}

// TestNamespaceCompileIgnoresGatewayPolicies shows that a namespace's
// sidecars never get a policy that a gateway enforces, and that the
// central service never gets a pod policy.
func TestNamespaceCompileIgnoresGatewayPolicies(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/ratelimitservice/two-namespaces.yaml")
	ns, err := Compile(Input{Namespace: "team-a", Policies: in.Policies, Pods: in.Pods, Stores: in.Stores})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(ns.Policies), 1; got != want || ns.Policies[0].Name != "pods" {
		t.Fatalf("namespace results = %+v, want only the pod policy", ns.Policies)
	}
	svc, err := CompileRateLimitService(ServiceInput{Policies: in.Policies, Pods: in.Pods, Stores: in.Stores})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range svc.Policies {
		if r.Name == "pods" {
			t.Errorf("the central service's results hold the pod policy: %+v", r)
		}
	}
	if got, want := len(svc.Config.Policies), 2; got != want {
		t.Errorf("the central document holds %d policies, want %d", got, want)
	}
}
