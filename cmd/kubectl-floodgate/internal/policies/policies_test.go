package policies

import (
	"strings"
	"testing"

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
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n": "no RateLimitPolicy, sidecar config or envoyproxy/ratelimit config",
	} {
		_, err := compile(t, data, Options{Namespace: "shop"})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Compile error %v, want one containing %q", err, want)
		}
	}
}
