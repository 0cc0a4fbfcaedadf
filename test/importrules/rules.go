// Package importrules holds the import rules between floodgate's parts and
// checks them against the module's package graph.
//
// The rules keep the planes apart: the limiter math stays pure, the data
// plane (sidecar/...) never depends on the control plane, the control plane
// depends on the data plane only through its contract (sidecar/config) and
// the limiter, and shipped binaries never link test or bench code. A test
// in this package loads the graph with `go list` and fails, naming the
// chain of imports, when an edge breaks a rule.
package importrules

import (
	"slices"
	"sort"
	"strings"
)

// Module is floodgate's module path.
const Module = "github.com/floodgate-dev/floodgate"

// Graph maps each package to the packages it imports directly (non-test
// imports only).
type Graph map[string][]string

// Rule forbids some imports of some packages.
type Rule struct {
	// Name says what the rule protects, in the words of a violation.
	Name string
	// Applies selects the packages the rule constrains.
	Applies func(pkg string) bool
	// Direct limits the rule to direct imports; otherwise every package in
	// the transitive closure is checked.
	Direct bool
	// Forbidden reports whether a package may not be imported.
	Forbidden func(dep string) bool
}

// Violation is one forbidden import, with the chain that reaches it.
type Violation struct {
	Rule  string
	Chain []string // from the constrained package to the forbidden one
}

// String renders the chain with the module prefix trimmed.
func (v Violation) String() string {
	parts := make([]string, len(v.Chain))
	for i, p := range v.Chain {
		parts[i] = strings.TrimPrefix(p, Module+"/")
	}
	return v.Rule + ": " + strings.Join(parts, " -> ")
}

// Local returns a predicate that matches the module package rel and, when
// subtree is set, every package below it.
func Local(rel string, subtree bool) func(string) bool {
	p := Module + "/" + rel
	return func(pkg string) bool {
		return pkg == p || subtree && strings.HasPrefix(pkg, p+"/")
	}
}

// Any matches a package that one of the predicates matches.
func Any(preds ...func(string) bool) func(string) bool {
	return func(pkg string) bool {
		for _, f := range preds {
			if f(pkg) {
				return true
			}
		}
		return false
	}
}

// Prefix matches an import path equal to one of the prefixes or below one.
func Prefix(prefixes ...string) func(string) bool {
	return func(pkg string) bool {
		for _, p := range prefixes {
			if pkg == p || strings.HasPrefix(pkg, p+"/") {
				return true
			}
		}
		return false
	}
}

// All matches a package that every predicate matches.
func All(preds ...func(string) bool) func(string) bool {
	return func(pkg string) bool {
		for _, f := range preds {
			if !f(pkg) {
				return false
			}
		}
		return true
	}
}

// Not negates a predicate.
func Not(f func(string) bool) func(string) bool { return func(pkg string) bool { return !f(pkg) } }

// dataPlaneContract is what the control plane may use of the data plane:
// the compiled document, the limiter, and the store's Redis layout (key
// names, ACL key patterns and the counter functions' library, which the
// manager loads and grants).
var dataPlaneContract = Any(Local("sidecar/config", false), Local("sidecar/limiter", false), Local("sidecar/store/redislayout", false))

// Rules are floodgate's import rules.
var Rules = []Rule{
	{
		Name:    "the limiter math does no I/O",
		Applies: Local("sidecar/limiter", false),
		Direct:  true,
		Forbidden: Prefix("os", "net", "io", "syscall", "log", "database", "bufio", "crypto/tls",
			"os/exec", "runtime/cgo"),
	},
	{
		Name:      "the limiter math imports no HTTP, Kubernetes or Redis package",
		Applies:   Local("sidecar/limiter", false),
		Forbidden: Prefix("net/http", "k8s.io", "sigs.k8s.io", "github.com/redis", "google.golang.org/grpc"),
	},
	{
		Name:    "the Redis layout is names and Lua only: no I/O, no Redis client",
		Applies: Local("sidecar/store/redislayout", false),
		Direct:  true,
		Forbidden: Any(Prefix("os", "net", "io", "syscall", "log", "bufio", "crypto/tls", "github.com/redis"),
			All(Local("sidecar", true), Not(Local("sidecar/limiter", false)))),
	},
	{
		Name:      "the data plane does not depend on the control plane",
		Applies:   Local("sidecar", true),
		Forbidden: Any(Local("controllers", true), Local("api", true)),
	},
	{
		Name:      "the API types do not depend on the controllers",
		Applies:   Local("api", true),
		Forbidden: Local("controllers", true),
	},
	{
		Name:      "the control plane uses the data plane only through its contract and the limiter",
		Applies:   Local("controllers", true),
		Forbidden: All(Local("sidecar", true), Not(dataPlaneContract)),
	},
	{
		Name:      "shipped binaries link no test or bench code",
		Applies:   Local("cmd", true),
		Forbidden: Any(Local("test", true), Local("bench", true)),
	},
	{
		Name:    "kubectl-floodgate decides offline: no Redis, no sidecar runtime or Kubernetes source",
		Applies: Local("cmd/kubectl-floodgate", true),
		Forbidden: Any(Local("sidecar/store/redisstore", true), Local("sidecar/runner", true),
			Local("sidecar/kubesource", true), Local("sidecar/envoyrls", true), Prefix("github.com/redis")),
	},
	{
		// The manager generates gateways' Envoy configuration
		// (controllers/gatewayconfig) from go-control-plane's message
		// types; Envoy's gRPC services stay out, as gRPC does.
		Name:    "floodgate-manager links none of the sidecar's runtime, gRPC or JWT",
		Applies: Local("cmd/floodgate-manager", true),
		Forbidden: Any(All(Local("sidecar", true), Not(dataPlaneContract)),
			Prefix("github.com/envoyproxy/go-control-plane/envoy/service", "github.com/golang-jwt", "github.com/go-jose", "google.golang.org/grpc")),
	},
}

// Check returns every violation of rules in g, sorted. A transitive
// violation is reported once per constrained package and forbidden
// package, with the shortest chain of imports that reaches it.
func Check(g Graph, rules []Rule) []Violation {
	pkgs := make([]string, 0, len(g))
	for p := range g {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	var out []Violation
	for _, r := range rules {
		for _, p := range pkgs {
			if !r.Applies(p) {
				continue
			}
			if r.Direct {
				for _, d := range g[p] {
					if r.Forbidden(d) {
						out = append(out, Violation{Rule: r.Name, Chain: []string{p, d}})
					}
				}
				continue
			}
			out = append(out, reach(g, p, r)...)
		}
	}
	return out
}

// reach walks g breadth first from p and reports each forbidden package
// with the shortest chain to it. It does not walk through a forbidden
// package: its own imports are its violation, not p's.
func reach(g Graph, p string, r Rule) []Violation {
	parent := map[string]string{p: ""}
	queue := []string{p}
	var found []string
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, d := range g[cur] {
			if _, seen := parent[d]; seen {
				continue
			}
			parent[d] = cur
			if r.Forbidden(d) {
				found = append(found, d)
				continue
			}
			queue = append(queue, d)
		}
	}
	sort.Strings(found)
	out := make([]Violation, 0, len(found))
	for _, d := range found {
		var chain []string
		for c := d; c != ""; c = parent[c] {
			chain = append(chain, c)
		}
		slices.Reverse(chain)
		out = append(out, Violation{Rule: r.Name, Chain: chain})
	}
	return out
}
