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
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// A policy whose JWT key Secret or ConfigMap does not exist gets
// ResolvedRefs=False (RefNotFound, naming the field) and is not compiled;
// the other policies of the namespace are (the bypass of issue 18: the
// document named a file no sidecar could read, and the sidecars rejected
// it whole, the valid login limit beside it included).
func TestMissingJWTRefIsIsolated(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/defaults.yaml")
	login := in.Policies[0]
	login.Name, login.UID = "login", "5d0f3c1e-0000-4000-8000-00000000000a"
	broken := in.Policies[0]
	broken.Name, broken.UID = "per-user", "5d0f3c1e-0000-4000-8000-00000000000b"
	broken.Spec.JWT = &v1alpha1.JWT{HMACSecretRef: &v1alpha1.KeyReference{Name: "jwt-key", Key: "hmac"}}
	broken.Spec.Rules = []v1alpha1.Rule{{Name: "per-user", Key: []v1alpha1.KeyPart{{JWTClaim: "sub"}},
		Limit: v1alpha1.Limit{Requests: 10, Per: metav1.Duration{Duration: time.Second}}}}
	jwks := broken
	jwks.Name, jwks.UID = "per-tenant", "5d0f3c1e-0000-4000-8000-00000000000c"
	jwks.Spec.JWT = &v1alpha1.JWT{JWKSConfigMapRef: &v1alpha1.KeyReference{Name: "jwks", Key: "keys.json"}}
	in.Policies = []v1alpha1.RateLimitPolicy{login, broken, jwks}
	in.Objects = &Objects{Secrets: map[string]bool{}, ConfigMaps: map[string]bool{"jwks": true}}
	out, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]PolicyResult{}
	for _, r := range out.Policies {
		results[r.Name] = r
	}
	if r := results["per-user"]; r.RefsResolved() || r.RefReason != v1alpha1.ReasonRefNotFound ||
		!strings.Contains(r.RefMessage, "spec.jwt.hmacSecretRef") || !strings.Contains(r.RefMessage, `Secret "jwt-key"`) || r.CompiledGeneration != 0 {
		t.Errorf("per-user: %+v, want RefNotFound naming spec.jwt.hmacSecretRef, not compiled", r)
	}
	pu := results["per-user"]
	if reason, _ := pu.RefsCondition(); reason != v1alpha1.ReasonRefNotFound {
		t.Errorf("per-user ResolvedRefs reason %q", reason)
	}
	for _, name := range []string{"login", "per-tenant"} {
		if r := results[name]; !r.RefsResolved() || r.CompiledGeneration == 0 {
			t.Errorf("%s: %+v, want resolved and compiled", name, r)
		}
	}
	var names []string
	for _, p := range out.Config.Policies {
		names = append(names, p.Name)
	}
	if fmt.Sprint(names) != "[login per-tenant]" {
		t.Errorf("document policies %v, want [login per-tenant]", names)
	}
}

// Key alternatives, a rule without a key, and the defaults that close the
// bypasses are written out: onMissingKey Shared, onInvalidToken Reject.
func TestCompileKeysAndSafeDefaults(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/defaults.yaml")
	p := &in.Policies[0]
	p.Spec.JWT = &v1alpha1.JWT{UpstreamVerified: true}
	p.Spec.TrustedProxies = &v1alpha1.TrustedProxies{CIDRs: []v1alpha1.CIDR{"10.0.0.0/8"}, Header: "X-Real-IP"}
	p.Spec.Rules = []v1alpha1.Rule{{
		Name:  "chain",
		Keys:  [][]v1alpha1.KeyPart{{{JWTClaim: "sub"}}, {{Header: "X-API-Key"}}, {{ClientIP: &v1alpha1.ClientIPKey{IPv6PrefixLength: 48}}}},
		Limit: v1alpha1.Limit{Requests: 10, Per: metav1.Duration{Duration: time.Second}},
	}, {
		Name:  "global",
		Limit: v1alpha1.Limit{Requests: 1000, Per: metav1.Duration{Duration: time.Second}},
	}}
	out, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Policies[0].Invalid) > 0 || out.Config == nil {
		t.Fatalf("not compiled: %v", out.Policies[0].Invalid)
	}
	c := out.Config.Policies[0]
	chain, global := c.Rules[0], c.Rules[1]
	if len(chain.Keys) != 3 || chain.Keys[0][0].JWTClaim != "sub" || chain.Keys[1][0].Header != "X-API-Key" ||
		chain.Keys[2][0].ClientIP == nil || chain.Keys[2][0].ClientIP.IPv6PrefixLength != 48 || len(chain.Key) != 0 {
		t.Errorf("chain keys %+v, key %+v", chain.Keys, chain.Key)
	}
	if chain.OnMissingKey != config.OnMissingKeyShared || c.JWT.OnInvalidToken != config.OnInvalidTokenReject {
		t.Errorf("defaults: onMissingKey %q, onInvalidToken %q", chain.OnMissingKey, c.JWT.OnInvalidToken)
	}
	if len(global.Key) != 0 || len(global.Keys) != 0 {
		t.Errorf("global rule keyed: %+v %+v", global.Key, global.Keys)
	}
	if c.TrustedProxies.Header != "X-Real-IP" {
		t.Errorf("trustedProxies %+v", c.TrustedProxies)
	}
}

// Each policy lists its ready pods, by index into the document's sorted pod
// names, so that each sidecar knows its place among the replicas sharing
// the limit while the store is down.
func TestReplicaPodsPlaceEverySidecar(t *testing.T) {
	t.Parallel()
	pod := func(name, app string, ready bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}}}
		p.Status.Phase = corev1.PodRunning
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		return p
	}
	in := readInput(t, "testdata/defaults.yaml")
	a := in.Policies[0]
	a.Name, a.Spec.PodSelector = "a", metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	all := in.Policies[0]
	all.Name, all.UID = "all", "5d0f3c1e-0000-4000-8000-00000000000d"
	in.Policies = []v1alpha1.RateLimitPolicy{a, all}
	in.Pods = []corev1.Pod{pod("web-b", "web", true), pod("db-0", "db", true), pod("web-a", "web", true), pod("web-c", "web", false)}
	out, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	c := out.Config
	if fmt.Sprint(c.Pods) != "[db-0 web-a web-b]" {
		t.Errorf("pods %v, want the ready pods, sorted", c.Pods)
	}
	for _, p := range c.Policies {
		want := map[string]string{"a": "[1 2]", "all": "[0 1 2]"}[p.Name]
		if fmt.Sprint(p.ReplicaPods) != want || int(p.Replicas) != len(p.ReplicaPods) {
			t.Errorf("policy %s: replicaPods %v replicas %d, want %s", p.Name, p.ReplicaPods, p.Replicas, want)
		}
	}
	if err := c.Validate(); err != nil {
		t.Errorf("the document fails the sidecar's validation: %v", err)
	}
}

// Policies that together do not fit in the ConfigMap leave out the ones
// created last, each reported on its own (still Accepted: the spec is
// valid); the others are written.
func TestDocumentTooLargeLeavesOutTheNewestPolicy(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/defaults.yaml")
	base := in.Policies[0]
	var rules []v1alpha1.Rule
	for i := range 64 {
		rules = append(rules, v1alpha1.Rule{Name: fmt.Sprintf("rule-%02d", i),
			Match: &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchRegularExpression, Value: "/" + strings.Repeat("x", 900)}},
			Key:   []v1alpha1.KeyPart{{Header: "X-API-Key"}}, Limit: v1alpha1.Limit{Requests: 10, Per: metav1.Duration{Duration: time.Second}}})
	}
	in.Policies = nil
	for i := range 25 {
		p := base
		p.Name, p.UID = fmt.Sprintf("p%02d", i), types.UID(fmt.Sprintf("5d0f3c1e-0000-4000-8000-%012d", i))
		p.CreationTimestamp = metav1.NewTime(time.Unix(1_700_000_000+int64(i), 0))
		p.Spec.Rules = rules
		in.Policies = append(in.Policies, p)
	}
	out, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Data) > MaxDocumentBytes {
		t.Fatalf("document of %d bytes, over %d", len(out.Data), MaxDocumentBytes)
	}
	kept := len(out.Config.Policies)
	if kept == 0 || kept == 25 {
		t.Fatalf("%d policies kept, want some but not all", kept)
	}
	for _, r := range out.Policies {
		inDoc := slices.ContainsFunc(out.Config.Policies, func(p config.Policy) bool { return p.Name == r.Name })
		var idx int
		_, _ = fmt.Sscanf(r.Name, "p%d", &idx)
		if inDoc != (idx < kept) {
			t.Errorf("%s in the document: %v; want the %d created first", r.Name, inDoc, kept)
		}
		if !inDoc && (!r.Accepted() || r.CompiledGeneration != 0 || !strings.Contains(r.LeftOut, "do not fit in one ConfigMap")) {
			t.Errorf("%s left out: accepted %v, compiled generation %d, reason %q; want accepted, 0 and the reason", r.Name, r.Accepted(), r.CompiledGeneration, r.LeftOut)
		}
		if inDoc && r.LeftOut != "" {
			t.Errorf("%s is in the document but reported left out: %s", r.Name, r.LeftOut)
		}
	}
}

// An external store's TLS settings reach the compiled document; its CA
// bundle is named by the file every sidecar has it at (config.StoreCAFile,
// in the credentials Secret the manager mirrors), whatever Secret and key
// the CounterStore reads it from, which a sidecar of another namespace
// could not mount.
func TestExternalStoreTLS(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/defaults.yaml")
	for name, cs := range in.Stores {
		tlsStore := cs.DeepCopy()
		tlsStore.Spec = v1alpha1.CounterStoreSpec{External: &v1alpha1.ExternalStore{
			Addresses: []v1alpha1.HostPort{"redis.data.svc:6379"},
			TLS: &v1alpha1.StoreTLS{ServerName: "redis.data.svc",
				CASecretRef: &v1alpha1.SecretKeySelector{Namespace: "data", Name: "redis-ca", Key: "bundle.pem"}},
		}}
		in.Stores[name] = tlsStore
	}
	out, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	want := &config.TLS{CAFile: config.StoreCAFile, ServerName: "redis.data.svc"}
	if got := out.Config.Store.TLS; got == nil || *got != *want {
		t.Errorf("store TLS = %+v, want %+v", got, want)
	}
}

// A Delay rule is no tightening of a Deny default, nor the reverse, and
// one that holds requests longer than a Delay default loosens it.
func TestDelayReplacesADefaultOnlyAsATightening(t *testing.T) {
	t.Parallel()
	per := metav1.Duration{Duration: time.Second}
	delay := func(maxDelay time.Duration, delayAfter int64) v1alpha1.Limit {
		return v1alpha1.Limit{Requests: 100, Per: per, OnExceed: v1alpha1.OnExceedDelay,
			MaxDelay: metav1.Duration{Duration: maxDelay}, DelayAfter: delayAfter}
	}
	deny := v1alpha1.Limit{Requests: 100, Per: per}
	for _, tc := range []struct {
		name          string
		def, team     v1alpha1.Limit
		replaced      bool
		reason, words string
	}{
		{"Delay under a Deny default", deny, delay(time.Second, 0), false, v1alpha1.ReasonDiffers, "its onExceed is Delay, the default's Deny"},
		{"Deny under a Delay default", delay(time.Second, 0), deny, false, v1alpha1.ReasonDiffers, "its onExceed is Deny, the default's Delay"},
		{"a longer maxDelay", delay(time.Second, 0), delay(2*time.Second, 0), false, v1alpha1.ReasonLoosens, "holds a request up to 2s, the default 1s"},
		{"a larger delayAfter", delay(time.Second, 0), delay(time.Second, 5), false, v1alpha1.ReasonLoosens, "a capacity of 5 is more than 1"},
		{"a shorter maxDelay", delay(2*time.Second, 5), delay(time.Second, 5), true, v1alpha1.ReasonTightens, "tightens"},
	} {
		c := &v1alpha1.ClusterRateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "base"}}
		team := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: "team", Namespace: "a"}}
		d := &v1alpha1.Rule{Name: "r", Limit: tc.def}
		r := &v1alpha1.Rule{Name: "r", Limit: tc.team}
		st := replacement(c, d, team, r)
		if st.Replaced != tc.replaced || st.Reason != tc.reason || !strings.Contains(st.Message, tc.words) {
			t.Errorf("%s: replacement = %v %s %q, want %v %s saying %q", tc.name, st.Replaced, st.Reason, st.Message, tc.replaced, tc.reason, tc.words)
		}
	}
}

// A rule's responseHeaders reaches the sidecar document, and is validated
// there; Full, the default, is written as unset so that both spellings
// make one document.
func TestCompileResponseHeaders(t *testing.T) {
	t.Parallel()
	in := readInput(t, "testdata/defaults.yaml")
	p := &in.Policies[0]
	lim := v1alpha1.Limit{Requests: 10, Per: metav1.Duration{Duration: time.Second}}
	p.Spec.Rules = []v1alpha1.Rule{
		{Name: "unset", Limit: lim},
		{Name: "full", Limit: lim, ResponseHeaders: v1alpha1.ResponseHeadersFull},
		{Name: "retry", Limit: lim, ResponseHeaders: v1alpha1.ResponseHeadersRetryAfter},
		{Name: "none", Limit: lim, ResponseHeaders: v1alpha1.ResponseHeadersNone},
	}
	out, err := Compile(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Policies[0].Invalid) > 0 || out.Config == nil {
		t.Fatalf("not compiled: %v", out.Policies[0].Invalid)
	}
	if err := out.Config.Validate(); err != nil {
		t.Fatalf("the document does not validate: %v", err)
	}
	for i, want := range []string{"", "", config.ResponseHeadersRetryAfter, config.ResponseHeadersNone} {
		r := out.Config.Policies[0].Rules[i]
		if got := r.ResponseHeaders; got != want {
			t.Errorf("rule %s: responseHeaders = %q, want %q", r.Name, got, want)
		}
	}
}
