package policies

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/admit"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/load"
	"github.com/floodgate-dev/floodgate/config/crd"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

func rlp(name, ns, extra string) string {
	return `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: ` + name + `, namespace: ` + ns + `}
spec:
  podSelector: {}
` + extra + `  rules:
  - name: r
    key: [{jwtClaim: sub}]
    limit: {requests: 10, per: 1s}
`
}

const jwt = "  jwt: {hmacSecretRef: {name: keys, key: hmac}}\n"

func compile(t *testing.T, data string, o Options) (*Set, error) {
	t.Helper()
	v, err := admit.FromFS(crd.Bases, "bases")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := load.Parse("in.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return Compile(docs, v, o)
}

func TestCompileRateLimitPolicies(t *testing.T) {
	t.Parallel()
	set, err := compile(t, rlp("b", "shop", jwt)+"---\n"+rlp("a", "shop", jwt), Options{Replicas: 3, MountDir: "/tmp/keys/"})
	if err != nil {
		t.Fatal(err)
	}
	c := set.Config
	if set.From != FromRateLimitPolicies || c.Store.Type != config.StoreMemory || len(c.Policies) != 2 {
		t.Fatalf("set from %q, store %q, %d policies", set.From, c.Store.Type, len(c.Policies))
	}
	for _, p := range c.Policies {
		if p.Replicas != 3 {
			t.Errorf("policy %s: replicas %d, want 3", p.Name, p.Replicas)
		}
		if got, want := p.JWT.HMACSecretFile, "/tmp/keys/secrets/keys/hmac"; got != want {
			t.Errorf("policy %s: key file %q, want %q", p.Name, got, want)
		}
		if p.Namespace != "shop" || p.UID != "offline-"+p.Name {
			t.Errorf("policy %s: namespace %q, uid %q", p.Name, p.Namespace, p.UID)
		}
	}
}

func TestCompileRefuses(t *testing.T) {
	t.Parallel()
	for data, want := range map[string]string{
		rlp("a", "shop", jwt) + "---\n" + rlp("b", "other", jwt): `is in namespace "other", the others in "shop"`,
		rlp("a", "shop", ""): `RateLimitPolicy "a" would be rejected`,
		clusterPolicy("floor", "{}", "    - name: r\n      key: [{clientIP: {}}]\n      limit: {requests: 10, per: 1s}\n      match: {when: [\"request.method\"]}\n"): `ClusterRateLimitPolicy "floor" would be rejected`,
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n": "no RateLimitPolicy, ClusterRateLimitPolicy, sidecar config or envoyproxy/ratelimit config",
	} {
		_, err := compile(t, data, Options{Namespace: "shop"})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Compile error %v, want one containing %q", err, want)
		}
	}
}

func clusterPolicy(name, podSelector, rules string) string {
	return `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: ClusterRateLimitPolicy
metadata: {name: ` + name + `}
spec:
  namespaceSelector: {matchLabels: {env: prod}}
  podSelector: ` + podSelector + `
  defaults:
    rules:
` + rules
}

const perIP = `  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: %d, per: 1s}
`

func team(name, podSelector string, requests int) string {
	return `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: ` + name + `, namespace: shop}
spec:
  podSelector: ` + podSelector + `
  rules:
` + fmt.Sprintf(perIP, requests)
}

// ClusterRateLimitPolicies compile with the namespace's policies, as
// selecting it: a cluster policy alone gets its entry (for a pod it
// selects), a team's tighter rule replaces the default, and a looser one
// leaves it in force, with a note saying which.
func TestCompileClusterRateLimitPolicies(t *testing.T) {
	t.Parallel()
	floor := clusterPolicy("floor", "{matchLabels: {tier: web}}", "  "+strings.ReplaceAll(fmt.Sprintf(perIP, 1000), "\n  ", "\n    "))
	replacedBy := func(set *Set) []string {
		for _, p := range set.Config.Policies {
			if p.Name == "cluster.floor" {
				return p.Rules[0].ReplacedBy
			}
		}
		t.Fatalf("no entry cluster.floor in %+v", set.Config.Policies)
		return nil
	}
	for _, tt := range []struct {
		name, in  string
		podLabels labels.Set
		entries   int
		replaced  bool
		note      string
	}{
		{"alone", floor, nil, 1, false, ""},
		{"tightened on the pods both select", floor + "---\n" + team("api", "{matchLabels: {app: api}}", 100), nil, 2, true,
			`RateLimitPolicy api, rule per-ip: Rule "per-ip" tightens the default "per-ip" of ClusterRateLimitPolicy floor and replaces it`},
		{"alone, for a pod it selects", floor, labels.Set{"tier": "web", "app": "shop"}, 1, false, ""},
		{"loosened", floor + "---\n" + team("api", "{}", 5000), nil, 2, false,
			`RateLimitPolicy api, rule per-ip: Rule "per-ip" would loosen the default "per-ip" of ClusterRateLimitPolicy floor`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			set, err := compile(t, tt.in, Options{Namespace: "shop", PodLabels: tt.podLabels})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := len(set.Config.Policies), tt.entries; got != want {
				t.Fatalf("%d entries, want %d: %+v", got, want, set.Config.Policies)
			}
			if got, want := len(replacedBy(set)) > 0, tt.replaced; got != want {
				t.Errorf("default replaced: %v, want %v", got, want)
			}
			notes := strings.Join(set.Notes, "\n")
			if tt.note == "" && notes != "" {
				t.Errorf("notes %q, want none", notes)
			}
			if !strings.Contains(notes, tt.note) {
				t.Errorf("notes %q, want one containing %q", notes, tt.note)
			}
			for _, p := range set.Config.Policies {
				if p.Replicas != 1 {
					t.Errorf("policy %s: replicas %d, want 1 (the made-up pods are not Ready)", p.Name, p.Replicas)
				}
			}
		})
	}
}
