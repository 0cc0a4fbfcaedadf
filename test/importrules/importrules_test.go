package importrules

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// loadGraph lists every package of the module and its dependencies with
// `go list -deps`, non-test imports only.
func loadGraph(t *testing.T) Graph {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-f", "{{.ImportPath}}\t{{join .Imports \" \"}}", Module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	g := Graph{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, "\t")
		g[pkg] = strings.Fields(imports)
	}
	return g
}

// TestModuleFollowsImportRules checks the real package graph.
func TestModuleFollowsImportRules(t *testing.T) {
	t.Parallel()
	g := loadGraph(t)
	// The rules must constrain packages that exist: a renamed package
	// would otherwise make a rule vacuous.
	for _, r := range Rules {
		n := 0
		for p := range g {
			if r.Applies(p) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("rule %q applies to no package of the module", r.Name)
		}
	}
	for _, v := range Check(g, Rules) {
		t.Errorf("%v", v)
	}
}

// TestRulesCatchForbiddenEdges adds one forbidden edge per rule to a graph
// that follows every rule and checks that the rule, with its chain, is
// reported.
func TestRulesCatchForbiddenEdges(t *testing.T) {
	t.Parallel()
	m := func(rel string) string { return Module + "/" + rel }
	clean := func() Graph {
		return Graph{
			m("sidecar/limiter"):           {"context", "errors", "fmt", "time"},
			m("sidecar/config"):            {m("sidecar/limiter"), "net/netip"},
			m("sidecar/proxy"):             {m("sidecar/config"), "net/http"},
			m("sidecar/store/redis"):       {"github.com/redis/go-redis/v9", m("sidecar/store/redislayout")},
			m("sidecar/store/redislayout"): {m("sidecar/limiter"), "crypto/sha1", "embed", "strings"},
			m("api/v1alpha1"):              {m("sidecar/limiter"), "k8s.io/api/core/v1"},
			m("controllers/policy"):        {m("api/v1alpha1"), m("sidecar/config"), m("sidecar/store/redislayout")},
			m("cmd/floodgate-manager"):     {m("controllers/policy")},
			m("cmd/floodgate-sidecar"):     {m("sidecar/proxy")},
			m("cmd/kubectl-floodgate"):     {m("sidecar/proxy"), m("controllers/policy")},
			m("sidecar/runner"):            {m("sidecar/proxy")},
			m("test/redistest"):            {"os/exec"},
			m("bench/harness"):             {"net/http"},
		}
	}
	if v := Check(clean(), Rules); len(v) != 0 {
		t.Fatalf("Check(clean graph) = %v, want no violation", v)
	}
	for _, tc := range []struct {
		from, to string
		rule     string
		chain    string
	}{
		{m("sidecar/limiter"), "os", "the limiter math does no I/O", "sidecar/limiter -> os"},
		{m("sidecar/store/redislayout"), "github.com/redis/go-redis/v9", "the Redis layout is names and Lua only: no I/O, no Redis client",
			"sidecar/store/redislayout -> github.com/redis/go-redis/v9"},
		{m("sidecar/store/redislayout"), m("sidecar/config"), "the Redis layout is names and Lua only: no I/O, no Redis client",
			"sidecar/store/redislayout -> sidecar/config"},
		{m("controllers/policy"), m("sidecar/store/redis"), "the control plane uses the data plane only through its contract and the limiter",
			"controllers/policy -> sidecar/store/redis"},
		{m("sidecar/limiter"), m("sidecar/proxy"), "the limiter math imports no HTTP, Kubernetes or Redis package",
			"sidecar/limiter -> sidecar/proxy -> net/http"},
		{m("sidecar/config"), m("api/v1alpha1"), "the data plane does not depend on the control plane",
			"sidecar/config -> api/v1alpha1"},
		{m("sidecar/proxy"), m("controllers/policy"), "the data plane does not depend on the control plane",
			"sidecar/proxy -> controllers/policy"},
		{m("api/v1alpha1"), m("controllers/policy"), "the API types do not depend on the controllers",
			"api/v1alpha1 -> controllers/policy"},
		{m("controllers/policy"), m("sidecar/proxy"), "the control plane uses the data plane only through its contract and the limiter",
			"controllers/policy -> sidecar/proxy"},
		{m("cmd/floodgate-sidecar"), m("test/redistest"), "shipped binaries link no test or bench code",
			"cmd/floodgate-sidecar -> test/redistest"},
		{m("cmd/floodgate-manager"), m("bench/harness"), "shipped binaries link no test or bench code",
			"cmd/floodgate-manager -> bench/harness"},
		{m("api/v1alpha1"), m("sidecar/store/redis"), "floodgate-manager links none of the sidecar's runtime, gRPC or JWT",
			"cmd/floodgate-manager -> controllers/policy -> api/v1alpha1 -> sidecar/store/redis"},
		{m("sidecar/proxy"), m("sidecar/runner"), "kubectl-floodgate decides offline: no Redis, no sidecar runtime or Kubernetes source",
			"cmd/kubectl-floodgate -> sidecar/proxy -> sidecar/runner"},
		{m("sidecar/proxy"), "github.com/redis/go-redis/v9", "kubectl-floodgate decides offline: no Redis, no sidecar runtime or Kubernetes source",
			"cmd/kubectl-floodgate -> sidecar/proxy -> github.com/redis/go-redis/v9"},
	} {
		g := clean()
		g[tc.from] = append(g[tc.from], tc.to)
		found := false
		for _, v := range Check(g, Rules) {
			if v.Rule == tc.rule && strings.HasSuffix(v.String(), tc.chain) {
				found = true
			}
		}
		if !found {
			t.Errorf("edge %s -> %s: Check = %v, want rule %q with chain %q", tc.from, tc.to, Check(g, Rules), tc.rule, tc.chain)
		}
	}
}
