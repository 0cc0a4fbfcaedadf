package compiler

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

var update = flag.Bool("update", false, "rewrite the testdata/*.golden files from the current output")

// readInput reads a multi-document YAML file of RateLimitPolicies, Pods,
// CounterStores and at most one ConfigMap, which holds the previous
// document.
func readInput(t *testing.T, file string) Input {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	in := Input{Stores: map[string]*v1alpha1.CounterStore{}}
	for i, doc := range strings.Split(string(raw), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: document %d: %v", file, i, err)
		}
		strict := func(v any) {
			t.Helper()
			if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
				t.Fatalf("%s: document %d (%s): %v", file, i, head.Kind, err)
			}
		}
		switch head.Kind {
		case "RateLimitPolicy":
			var p v1alpha1.RateLimitPolicy
			strict(&p)
			in.Namespace = p.Namespace
			in.Policies = append(in.Policies, p)
		case "Pod":
			var p corev1.Pod
			strict(&p)
			in.Pods = append(in.Pods, p)
		case "CounterStore":
			var s v1alpha1.CounterStore
			strict(&s)
			in.Stores[s.Name] = &s
		case "ClusterRateLimitPolicy":
			var c v1alpha1.ClusterRateLimitPolicy
			strict(&c)
			in.ClusterPolicies = append(in.ClusterPolicies, c)
		case "Namespace":
			var ns corev1.Namespace
			strict(&ns)
			in.Namespace, in.NamespaceLabels = ns.Name, ns.Labels
		case "ConfigMap":
			var cm corev1.ConfigMap
			strict(&cm)
			prev, err := config.Parse([]byte(cm.Data[config.DataKey]))
			if err != nil {
				t.Fatalf("%s: previous document: %v", file, err)
			}
			in.Previous = prev
		default:
			t.Fatalf("%s: document %d: unexpected kind %q", file, i, head.Kind)
		}
	}
	return in
}

// golden is the shape of a .golden file.
type golden struct {
	Action   Action          `json:"action"`
	Config   json.RawMessage `json:"config,omitempty"`
	Policies []goldenResult  `json:"policies"`
	Clusters []goldenCluster `json:"clusters,omitempty"`
}

type goldenCluster struct {
	ClusterResult
	Invalid []string `json:"invalid,omitempty"`
}

type goldenResult struct {
	PolicyResult
	Invalid []string `json:"invalid,omitempty"`
}

func render(t *testing.T, out Output) []byte {
	t.Helper()
	g := golden{Action: out.Action}
	if out.Data != "" {
		g.Config = json.RawMessage(out.Data)
	}
	for _, r := range out.Policies {
		gr := goldenResult{PolicyResult: r}
		for _, e := range r.Invalid {
			gr.Invalid = append(gr.Invalid, e.Error())
		}
		gr.PolicyResult.Invalid = nil
		g.Policies = append(g.Policies, gr)
	}
	for _, c := range out.Clusters {
		gc := goldenCluster{ClusterResult: c}
		for _, e := range c.Invalid {
			gc.Invalid = append(gc.Invalid, e.Error())
		}
		gc.ClusterResult.Invalid = nil
		g.Clusters = append(g.Clusters, gc)
	}
	b, err := json.MarshalIndent(g, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

func TestGolden(t *testing.T) {
	t.Parallel()
	inputs, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) == 0 {
		t.Fatal("no testdata/*.yaml inputs")
	}
	for _, file := range inputs {
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := Compile(readInput(t, file))
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			got := render(t, out)
			goldenFile := filepath.Join("testdata", name+".golden")
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
				t.Errorf("Compile(%s) differs from %s (rerun with -update if the change is intended)\n got:\n%s\nwant:\n%s",
					file, goldenFile, got, want)
			}
			if out.Action == Apply {
				// Whatever is written must load in the sidecar.
				c, err := config.Load([]byte(out.Data))
				if err != nil {
					t.Fatalf("the sidecar rejects the compiled document: %v", err)
				}
				if got, want := c.Revision, out.Config.Revision; got != want {
					t.Errorf("loaded revision = %q, want %q", got, want)
				}
			}
		})
	}
}

// TestDeterministic shows that the order of the inputs changes nothing, and
// that equal inputs give equal bytes.
func TestDeterministic(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/two-policies-same-pods.yaml")
	first, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	if first.Action != Apply {
		t.Fatalf("action = %v, want Apply", first.Action)
	}
	for i := range 10 {
		shuffled := in
		shuffled.Policies = slices.Clone(in.Policies)
		shuffled.Pods = slices.Clone(in.Pods)
		slices.Reverse(shuffled.Policies)
		rotate(shuffled.Pods, i)
		out, err := Compile(shuffled)
		if err != nil {
			t.Fatal(err)
		}
		if out.Data != first.Data {
			t.Fatalf("permutation %d: document differs:\n%s\nwant:\n%s", i, out.Data, first.Data)
		}
	}
}

func rotate[T any](s []T, n int) {
	if len(s) == 0 {
		return
	}
	n %= len(s)
	slices.Reverse(s[:n])
	slices.Reverse(s[n:])
	slices.Reverse(s)
}

// TestRevisionFollowsContent shows that the revision changes with the
// content and only with it.
func TestRevisionFollowsContent(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/full.yaml")
	a, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := b.Config.Revision, a.Config.Revision; got != want {
		t.Errorf("revision of equal input = %q, want %q", got, want)
	}

	changed := in
	changed.Policies = []v1alpha1.RateLimitPolicy{*in.Policies[0].DeepCopy()}
	changed.Policies[0].Spec.Rules[0].Limit.Requests++
	c, err := Compile(changed)
	if err != nil {
		t.Fatal(err)
	}
	if c.Config.Revision == a.Config.Revision {
		t.Errorf("revision %q did not change when a limit changed", c.Config.Revision)
	}

	// A pod turning Ready changes replicas, hence the revision.
	readied := in
	readied.Pods = slices.Clone(in.Pods)
	for i := range readied.Pods {
		readied.Pods[i] = *readied.Pods[i].DeepCopy()
		readied.Pods[i].Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	d, err := Compile(readied)
	if err != nil {
		t.Fatal(err)
	}
	if d.Config.Revision == a.Config.Revision {
		t.Errorf("revision %q did not change when replicas changed", d.Config.Revision)
	}
}

// TestCompileDoesNotModifyInput guards the purity of Compile.
func TestCompileDoesNotModifyInput(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/invalid-keeps-previous.yaml")
	before, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Compile(in); err != nil {
		t.Fatal(err)
	}
	after, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("Compile modified its input:\nbefore %s\nafter  %s", before, after)
	}
}

func TestReplicasCountReadyPodsAtLeastOne(t *testing.T) {
	t.Parallel()
	pod := func(name string, ready bool, phase corev1.PodPhase, deleting bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "a"}}}
		p.Status.Phase = phase
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		if deleting {
			now := metav1.Now()
			p.DeletionTimestamp = &now
		}
		return p
	}
	for _, tc := range []struct {
		name                 string
		pods                 []corev1.Pod
		targeted, ready, rep int32
	}{
		{"none", nil, 0, 0, 1},
		{"not ready", []corev1.Pod{pod("a", false, corev1.PodRunning, false)}, 1, 0, 1},
		{"two ready", []corev1.Pod{pod("a", true, corev1.PodRunning, false), pod("b", true, corev1.PodRunning, false)}, 2, 2, 2},
		{"deleting and finished pods do not count", []corev1.Pod{
			pod("a", true, corev1.PodRunning, true),
			pod("b", true, corev1.PodSucceeded, false),
			pod("c", false, corev1.PodFailed, false),
			pod("d", true, corev1.PodRunning, false),
		}, 1, 1, 1},
	} {
		in := readInput(t, "testdata/defaults.yaml")
		in.Policies[0].Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}
		in.Pods = tc.pods
		out, err := Compile(in)
		if err != nil {
			t.Fatal(err)
		}
		r := out.Policies[0]
		if r.TargetedPods != tc.targeted || r.ReadyPods != tc.ready {
			t.Errorf("%s: targeted, ready = %d, %d, want %d, %d", tc.name, r.TargetedPods, r.ReadyPods, tc.targeted, tc.ready)
		}
		if got := out.Config.Policies[0].Replicas; got != tc.rep {
			t.Errorf("%s: replicas = %d, want %d", tc.name, got, tc.rep)
		}
	}
}

func TestActionString(t *testing.T) {
	t.Parallel()
	for a, want := range map[Action]string{Apply: "Apply", Delete: "Delete", Action(0): "Action(0)"} {
		if got := a.String(); got != want {
			t.Errorf("Action(%d).String() = %q, want %q", int(a), got, want)
		}
	}
}

func TestMountPaths(t *testing.T) {
	t.Parallel()
	if got, want := SecretFile("jwt", "key"), "/var/run/floodgate/secrets/jwt/key"; got != want {
		t.Errorf("SecretFile = %q, want %q", got, want)
	}
	if got, want := ConfigMapFile("jwks", "jwks.json"), "/var/run/floodgate/configmaps/jwks/jwks.json"; got != want {
		t.Errorf("ConfigMapFile = %q, want %q", got, want)
	}
}

func ExampleCompile() {
	policy := v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "shop", UID: "u-1", Generation: 1},
		Spec: v1alpha1.RateLimitPolicySpec{
			Rules: []v1alpha1.Rule{{
				Name:  "per-key",
				Key:   []v1alpha1.KeyPart{{Header: "X-API-Key"}},
				Limit: v1alpha1.Limit{Requests: 100, Per: metav1.Duration{Duration: 60e9}},
			}},
		},
	}
	store := &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Status: v1alpha1.CounterStoreStatus{
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue}},
			Endpoints:  []string{"redis-0.redis:6379"},
		},
	}
	out, err := Compile(Input{
		Namespace: "shop",
		Policies:  []v1alpha1.RateLimitPolicy{policy},
		Stores:    map[string]*v1alpha1.CounterStore{"default": store},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	r := out.Config.Policies[0].Rules[0]
	fmt.Println(out.Action, out.Config.Store.Addresses, r.Limit.Algorithm, r.Limit.Per.Duration, out.Config.Policies[0].Replicas)
	// Output: Apply [redis-0.redis:6379] TokenBucket 1m0s 1
}
