package compiler

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// MaxDocumentBytes bounds the compiled document, so that the ConfigMap
// holding it stays under the API server's 1 MiB object limit.
const MaxDocumentBytes = 1000 << 10

// assemble sets out's document to entries under store. When they do not
// all fit in one document (MaxDocumentBytes, and config.MaxRules rules),
// the document is shared out: each namespace that has entries gets a fair
// share of the bytes and of the rules (fairShares; a per-namespace
// document has one), and keeps its policies created first that fit in
// its share. A policy left out is reported in its result (LeftOut), and
// no other namespace's policy is touched. live is ordered by creation;
// entries of no live policy (a ClusterRateLimitPolicy's) count as the
// oldest. The document is validated as the sidecars will before it is
// set.
func (out *Output) assemble(entries []config.Policy, store config.Store, pods []corev1.Pod, live []*v1alpha1.RateLimitPolicy) error {
	slices.SortFunc(entries, func(a, b config.Policy) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Namespace, b.Namespace))
	})
	out.Action = Apply
	if err := out.setDocument(entries, store, pods); err != nil {
		return err
	}
	rules := 0
	for i := range out.Config.Policies {
		rules += len(out.Config.Policies[i].Rules)
	}
	if len(out.Data) > MaxDocumentBytes || rules > config.MaxRules {
		keep := out.share(live)
		entries = slices.DeleteFunc(entries, func(e config.Policy) bool { return !keep[e.UID] })
		if err := out.setDocument(entries, store, pods); err != nil {
			return err
		}
		if len(out.Data) > MaxDocumentBytes {
			return fmt.Errorf("the shared-out document is %d bytes, over %d", len(out.Data), MaxDocumentBytes)
		}
	}
	if err := out.Config.Validate(); err != nil {
		return fmt.Errorf("the assembled document fails the sidecars' validation: %w", err)
	}
	return nil
}

// setDocument sets out's Config and Data to entries under store.
func (out *Output) setDocument(entries []config.Policy, store config.Store, pods []corev1.Pod) error {
	out.Config = &config.Config{APIVersion: config.APIVersion, Store: store, Policies: entries}
	placeReplicas(out.Config, pods)
	data, err := Marshal(out.Config)
	if err != nil {
		return err
	}
	out.Data = data
	return nil
}

// size is what an entry takes of the document: its bytes (with the comma
// that separates it) and its rules.
type size struct{ bytes, rules int }

// share decides which entries of out.Config, which does not fit, the
// document keeps: the uids kept. Each namespace's share comes from
// fairShares; within it, entries are taken in the order their policies
// were created while they fit, so a policy too large for what is left
// does not keep a later, smaller one out. It sets LeftOut in the results
// of the policies it leaves out.
func (out *Output) share(live []*v1alpha1.RateLimitPolicy) map[string]bool {
	age := make(map[string]int, len(live))
	byUID := make(map[string]*v1alpha1.RateLimitPolicy, len(live))
	for i, p := range live {
		age[string(p.UID)] = i + 1
		byUID[string(p.UID)] = p
	}
	type item struct {
		entry *config.Policy
		size  size
		age   int
	}
	groups := map[string][]item{}
	var names []string
	entryBytes := 0
	for i := range out.Config.Policies {
		e := &out.Config.Policies[i]
		// As Marshal writes it: indented, one level into the
		// document's list of policies, then a comma and a newline.
		b, _ := json.MarshalIndent(e, "    ", "  ")
		it := item{entry: e, size: size{bytes: len("    ") + len(b) + len(",\n"), rules: len(e.Rules)}, age: age[e.UID]}
		entryBytes += it.size.bytes
		ns := e.Namespace
		if !out.spansNamespaces() {
			ns = ""
		}
		if _, ok := groups[ns]; !ok {
			names = append(names, ns)
		}
		groups[ns] = append(groups[ns], it)
	}
	slices.Sort(names)
	// What the document holds besides its entries; leaving entries out
	// only shrinks it (fewer pods to list).
	overhead := len(out.Data) - entryBytes
	demand := make([]size, len(names))
	for i, ns := range names {
		for _, it := range groups[ns] {
			demand[i].bytes += it.size.bytes
			demand[i].rules += it.size.rules
		}
	}
	shares := fairShares(demand, size{bytes: MaxDocumentBytes - overhead, rules: config.MaxRules})
	keep := map[string]bool{}
	for i, ns := range names {
		g := groups[ns]
		slices.SortStableFunc(g, func(a, b item) int { return cmp.Compare(a.age, b.age) })
		var used size
		for _, it := range g {
			if used.bytes+it.size.bytes <= shares[i].bytes && used.rules+it.size.rules <= shares[i].rules {
				used.bytes += it.size.bytes
				used.rules += it.size.rules
				keep[it.entry.UID] = true
				continue
			}
			out.leaveOut(byUID[it.entry.UID], leftOutMessage(out.spansNamespaces(), ns, len(names), shares[i], used, it.size))
		}
	}
	return keep
}

// spansNamespaces reports whether the document is the central rate-limit
// service's, whose results name their namespaces.
func (out *Output) spansNamespaces() bool {
	return len(out.Policies) > 0 && out.Policies[0].Namespace != ""
}

// leaveOut reports in the result of policy p that the document leaves it
// out. A ClusterRateLimitPolicy's entry (p nil) has no result to report
// in: it is the oldest of its namespace's document, and the
// RateLimitPolicies are left out before it.
func (out *Output) leaveOut(p *v1alpha1.RateLimitPolicy, msg string) {
	if p == nil {
		return
	}
	for k := range out.Policies {
		r := &out.Policies[k]
		if r.Name == p.Name && (r.Namespace == "" || r.Namespace == p.Namespace) {
			r.LeftOut = msg
			r.CompiledGeneration = 0
		}
	}
}

func leftOutMessage(spans bool, ns string, namespaces int, share, used, need size) string {
	if !spans {
		return fmt.Sprintf("The namespace's compiled policies do not fit in one ConfigMap (%d bytes and %d rules at most); the policies created before this one take %d bytes and %d rules of it, and this one needs %d bytes and %d rules more: merge rules or move workloads to another namespace.",
			share.bytes, share.rules, used.bytes, used.rules, need.bytes, need.rules)
	}
	return fmt.Sprintf("The central rate-limit service's document is full, and namespace %s's share of it is %d bytes and %d rules (the document's %d bytes and %d rules shared out between the %d namespaces with gateway policies; what a namespace does not use goes to the others); its policies created before this one take %d bytes and %d rules, and this one needs %d bytes and %d rules more: merge rules or remove policies of this namespace.",
		ns, share.bytes, share.rules, MaxDocumentBytes, config.MaxRules, namespaces, used.bytes, used.rules, need.bytes, need.rules)
}

// fairShares shares total out between demands, resource by resource
// (bytes, then rules), max-min fairly: a demand at most an even share of
// what is left gets all it asks; the others split the rest evenly. The
// shares never add up to more than total, and a demand that fits is
// never cut.
func fairShares(demand []size, total size) []size {
	shares := make([]size, len(demand))
	fill := func(get func(size) int, set func(*size, int), total int) {
		order := make([]int, len(demand))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(get(demand[a]), get(demand[b])) })
		left := max(total, 0)
		for k, i := range order {
			even := left / (len(order) - k)
			give := min(get(demand[i]), even)
			set(&shares[i], give)
			left -= give
		}
	}
	fill(func(s size) int { return s.bytes }, func(s *size, v int) { s.bytes = v }, total.bytes)
	fill(func(s size) int { return s.rules }, func(s *size, v int) { s.rules = v }, total.rules)
	return shares
}
