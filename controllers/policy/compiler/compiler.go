// Package compiler turns the RateLimitPolicies of one namespace, with the
// pods they select and the CounterStore they use, into the sidecar
// configuration document (sidecar/config.Config) that floodgate-manager
// writes into the namespace's "floodgate-policies" ConfigMap.
//
// Compile is a pure function: it makes no API calls and reads no clock, so
// equal inputs give byte-equal documents with equal revisions. The document
// is ordered (policies by name, rules and key parts as written) and its
// revision is a hash of its content, so an unchanged input never causes a
// write.
//
// The last valid configuration keeps running. When a policy's current
// generation cannot be compiled (it is invalid, or its store is missing or
// not Ready), Compile carries the entry of an earlier generation over from
// the previous document, refreshing only its replica count. When the store
// itself is not usable, the previous document's store section is kept.
package compiler

import (
	"cmp"
	"encoding/json"
	"fmt"
	"path"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/internal/podstatus"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// MountDir is where the sidecar finds the Secret and ConfigMap keys that
// policies and stores reference: key K of Secret S at
// MountDir/secrets/S/K, key K of ConfigMap C at MountDir/configmaps/C/K.
// The compiled document names these paths, and whatever mounts the
// referenced objects into the sidecar must follow the same layout.
const MountDir = "/var/run/floodgate"

// SecretFile returns the path at which the sidecar reads key of the Secret
// named name.
func SecretFile(name, key string) string {
	return path.Join(MountDir, "secrets", name, key)
}

// ConfigMapFile returns the path at which the sidecar reads key of the
// ConfigMap named name.
func ConfigMapFile(name, key string) string {
	return path.Join(MountDir, "configmaps", name, key)
}

// Input is everything Compile reads for one namespace.
type Input struct {
	// Namespace is the namespace being compiled.
	Namespace string
	// Policies are the namespace's RateLimitPolicies. Those being deleted,
	// and those with a targetRef, are ignored.
	Policies []v1alpha1.RateLimitPolicy
	// Pods are the namespace's pods.
	Pods []corev1.Pod
	// Stores holds the CounterStores the policies reference, by name. A
	// name that is absent does not exist.
	Stores map[string]*v1alpha1.CounterStore
	// Previous is the document the ConfigMap holds now, or nil when there
	// is none or it cannot be read.
	Previous *config.Config
	// RateLimitService compiles the document of the central rate-limit
	// service instead of a namespace's: Policies are those with a
	// targetRef, of every namespace, and Pods are the central service's
	// pods, every one of which enforces every policy (see
	// CompileRateLimitService).
	RateLimitService bool
	// NamespaceLabels are the namespace's labels, on which
	// ClusterRateLimitPolicies select namespaces.
	NamespaceLabels map[string]string
	// Targets holds, for the central rate-limit service's document, what
	// was found of each policy's targetRef, by the policy's
	// "<namespace>/<name>" (config.PolicyEntryValue): the Gateways of a found target are those its entry lets ask
	// about it (config.Policy.Gateways). A policy without an entry, or
	// whose target was not found, lets no gateway ask.
	Targets map[string]v1alpha1.TargetStatus
	// ClusterPolicies are the cluster's ClusterRateLimitPolicies; Compile
	// keeps those that select the namespace. Those being deleted are
	// ignored.
	ClusterPolicies []v1alpha1.ClusterRateLimitPolicy
	// Objects says which Secrets and ConfigMaps of the namespace exist,
	// for the policies' JWT key references. Nil means unknown: the
	// references are taken to resolve.
	Objects *Objects
}

// Objects are the Secrets and ConfigMaps of a namespace that the policies
// reference, by name: true when the object exists.
type Objects struct {
	Secrets    map[string]bool
	ConfigMaps map[string]bool
}

// Action says what to do with the namespace's ConfigMap.
type Action int

// The Actions. The zero value is invalid.
const (
	// Apply writes Output.Config.
	Apply Action = iota + 1
	// Delete removes the ConfigMap: no policy has an entry to enforce.
	Delete
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case Apply:
		return "Apply"
	case Delete:
		return "Delete"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// MarshalText implements encoding.TextMarshaler, for golden files.
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// Output is the result of Compile.
type Output struct {
	// Action says what to do with the ConfigMap.
	Action Action
	// Config is the document to write when Action is Apply, with its
	// Revision set.
	Config *config.Config
	// Data is Config serialised, the ConfigMap's config.DataKey value.
	Data string
	// Policies has one result per live input policy, ordered by name.
	Policies []PolicyResult
	// Clusters has one result per live ClusterRateLimitPolicy that
	// selects the namespace, ordered by name.
	Clusters []ClusterResult
}

// ClusterResult is what Compile found about one ClusterRateLimitPolicy in
// the namespace.
type ClusterResult struct {
	// Name is the policy's name.
	Name string `json:"name"`
	// UID is the policy's uid.
	UID string `json:"uid"`
	// Invalid lists the spec's problems; empty when it is accepted.
	Invalid field.ErrorList `json:"invalid,omitempty"`
	// TargetedPods is the number of running pods of the namespace its
	// podSelector matches.
	TargetedPods int32 `json:"targetedPods"`
	// CompiledGeneration is the generation whose entry the document
	// holds, 0 when it holds none: a namespace without RateLimitPolicies
	// gets the cluster policy's entry only while some pod it targets runs
	// floodgate's sidecar.
	CompiledGeneration int64 `json:"compiledGeneration"`
}

// PolicyResult is what Compile found about one policy, the input of its
// status.
type PolicyResult struct {
	// Name is the policy's name.
	Name string `json:"name"`
	// Namespace is the policy's namespace, set when the document spans
	// namespaces (Input.RateLimitService).
	Namespace string `json:"namespace,omitempty"`
	// Generation is the policy's current generation.
	Generation int64 `json:"generation"`
	// Invalid lists the spec's problems; empty when the spec is accepted.
	Invalid field.ErrorList `json:"invalid,omitempty"`
	// Store is the CounterStore the policy references.
	Store string `json:"store"`
	// StoreReason is v1alpha1.ReasonResolvedRefs when the store resolves,
	// or the reason it does not.
	StoreReason string `json:"storeReason"`
	// StoreMessage explains StoreReason.
	StoreMessage string `json:"storeMessage"`
	// RefReason is v1alpha1.ReasonRefNotFound when a Secret or ConfigMap
	// the policy names does not exist, and empty otherwise.
	RefReason string `json:"refReason,omitempty"`
	// RefMessage names the field and the object that RefReason is about.
	RefMessage string `json:"refMessage,omitempty"`
	// TargetedPods is the number of running pods the selector matches.
	TargetedPods int32 `json:"targetedPods"`
	// ReadyPods is how many of those are Ready.
	ReadyPods int32 `json:"readyPods"`
	// CompiledGeneration is the generation whose entry the document
	// holds: Generation when the current spec is compiled, an earlier one
	// when an earlier entry is carried over, 0 when the policy has none.
	CompiledGeneration int64 `json:"compiledGeneration"`
	// ClusterDefaults reports, by rule name, how the policy's rules relate
	// to the ClusterRateLimitPolicy defaults of the same name.
	ClusterDefaults map[string]v1alpha1.ClusterDefaultStatus `json:"clusterDefaults,omitempty"`
	// ClusterRules are the ClusterRateLimitPolicy rules that apply to the
	// policy's pods, or that one of its rules replaces there.
	ClusterRules []v1alpha1.ClusterRuleStatus `json:"clusterRules,omitempty"`
	// LeftOut, when set, says why the document leaves the policy out
	// although it compiled: the document (or, for the central rate-limit
	// service's, the namespace's share of it) is full. CompiledGeneration
	// is then 0.
	LeftOut string `json:"leftOut,omitempty"`
}

// Accepted reports whether the policy's spec is valid.
func (r *PolicyResult) Accepted() bool { return len(r.Invalid) == 0 }

// RefsResolved reports whether every object the policy names resolves: its
// store, and the Secret or ConfigMap of its JWT keys.
func (r *PolicyResult) RefsResolved() bool {
	return r.StoreReason == v1alpha1.ReasonResolvedRefs && r.RefReason == ""
}

// RefsCondition returns the reason and message of the ResolvedRefs
// condition: the store's when it does not resolve, else the JWT
// reference's when it does not, else the store's ResolvedRefs.
func (r *PolicyResult) RefsCondition() (reason, message string) {
	if r.StoreReason == v1alpha1.ReasonResolvedRefs && r.RefReason != "" {
		return r.RefReason, r.RefMessage
	}
	return r.StoreReason, r.StoreMessage
}

// Compile compiles one namespace. Problems with single policies are
// reported in their PolicyResult, never as an error; the error is for a
// document that cannot be serialised.
func Compile(in Input) (Output, error) {
	live := make([]*v1alpha1.RateLimitPolicy, 0, len(in.Policies))
	for i := range in.Policies {
		// A policy with a targetRef is the central rate-limit service's
		// (CompileRateLimitService), not the namespace's sidecars'.
		if p := &in.Policies[i]; p.DeletionTimestamp == nil && p.GatewayEnforced() == in.RateLimitService {
			live = append(live, p)
		}
	}
	var clusters []*v1alpha1.ClusterRateLimitPolicy
	for i := range in.ClusterPolicies {
		if c := &in.ClusterPolicies[i]; c.DeletionTimestamp == nil && selectsNamespace(c, in.NamespaceLabels) {
			clusters = append(clusters, c)
		}
	}
	if len(live) == 0 && len(clusters) == 0 {
		return Output{Action: Delete, Policies: []PolicyResult{}}, nil
	}
	// The earliest policy decides the namespace's store, so adding a
	// policy never moves the store under the ones already running.
	slices.SortFunc(live, func(a, b *v1alpha1.RateLimitPolicy) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	slices.SortFunc(clusters, func(a, b *v1alpha1.ClusterRateLimitPolicy) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})

	results := make([]PolicyResult, len(live))
	for i, p := range live {
		results[i] = PolicyResult{
			Name:       p.Name,
			Namespace:  map[bool]string{true: p.Namespace}[in.RateLimitService],
			Generation: p.Generation,
			Invalid:    p.ValidateSemantics(),
			Store:      p.StoreName(),
		}
	}
	cresults := make([]ClusterResult, len(clusters))
	for i, c := range clusters {
		cresults[i] = ClusterResult{Name: c.Name, UID: string(c.UID), Invalid: c.ValidateSemantics()}
	}
	// The namespace's store: that of its earliest accepted policy; with
	// none, that of its earliest accepted ClusterRateLimitPolicy.
	var nsStore string
	switch {
	case len(live) > 0:
		nsStore = results[0].Store
		for i := range results {
			if results[i].Accepted() {
				nsStore = results[i].Store
				break
			}
		}
	default:
		nsStore = clusters[0].StoreName()
		for i, c := range clusters {
			if len(cresults[i].Invalid) == 0 {
				nsStore = c.StoreName()
				break
			}
		}
	}
	fresh, freshReason, freshMsg := resolveStore(nsStore, in.Stores)

	// The store section: the namespace store when it is usable, else the
	// previous document's, so that sidecars keep running on it.
	var store *config.Store
	switch {
	case fresh != nil:
		store = fresh
	case in.Previous != nil:
		s := in.Previous.Store
		store = &s
	}

	previous := map[string]*config.Policy{}
	if in.Previous != nil {
		for i := range in.Previous.Policies {
			pp := &in.Previous.Policies[i]
			previous[pp.UID] = pp
		}
	}
	carry := func(uid string) (config.Policy, bool) {
		prev, ok := previous[uid]
		if !ok || store == nil {
			return config.Policy{}, false
		}
		// A shallow copy: the entry shares slices with Previous, which
		// neither side modifies.
		entry := *prev
		entry.Replicas = 1
		// A nil selector selects every pod (config.Policy.PodSelector).
		if s, err := selectorOrEverything(entry.PodSelector); err == nil {
			_, ready := countPods(s, in.Pods)
			entry.Replicas = replicas(ready)
		}
		return entry, true
	}

	var entries []config.Policy
	// fresh team policies, by index, for the cluster defaults they replace.
	var freshTeams []int
	for i, p := range live {
		r := &results[i]
		switch {
		case r.Store != nsStore:
			r.StoreReason = v1alpha1.ReasonStoreConflict
			r.StoreMessage = storeConflict(in.RateLimitService, r.Store, nsStore, live[0])
		default:
			r.StoreReason, r.StoreMessage = freshReason, freshMsg
		}
		if sel, selErr := targetSelector(in.RateLimitService, p); selErr == nil {
			r.TargetedPods, r.ReadyPods = countPods(sel, in.Pods)
		}
		r.RefReason, r.RefMessage = resolveRefs(p, in.Objects)

		if r.Accepted() && r.RefsResolved() {
			entry := compilePolicy(p, replicas(r.ReadyPods))
			entry.Gateways = in.gateways(p)
			if err := checkEntry(entry, *store); err != nil {
				r.Invalid = append(r.Invalid, field.InternalError(field.NewPath("spec"), err))
			} else {
				r.CompiledGeneration = p.Generation
				entries = append(entries, entry)
				freshTeams = append(freshTeams, i)
				continue
			}
		}
		if entry, ok := carry(string(p.UID)); ok {
			r.CompiledGeneration = entry.Generation
			// The earlier generation's rules, asked about by the gateways
			// its target has now.
			entry.Gateways = in.gateways(p)
			entries = append(entries, entry)
		}
	}
	teamEntries := slices.Clone(entries)

	for i, c := range clusters {
		cr := &cresults[i]
		sel, err := metav1.LabelSelectorAsSelector(&c.Spec.PodSelector)
		if err != nil {
			continue
		}
		var ready int32
		cr.TargetedPods, ready = countPods(sel, in.Pods)
		if len(live) == 0 && countSidecars(sel, in.Pods) == 0 {
			// No pod here enforces it: no document just for it.
			continue
		}
		uid := ClusterEntryUID(string(c.UID), in.Namespace)
		if len(cr.Invalid) > 0 || fresh == nil {
			if entry, ok := carry(uid); ok {
				cr.CompiledGeneration = entry.Generation
				entries = append(entries, entry)
			}
			continue
		}
		entry := compileCluster(c, in.Namespace, replicas(ready))
		applyReplacements(c, &entry, live, freshTeams, results, in.Pods)
		doc := config.Config{APIVersion: config.APIVersion, Store: *store, Policies: append([]config.Policy{entry}, teamEntries...)}
		if err := doc.Validate(); err != nil {
			cr.Invalid = append(cr.Invalid, field.InternalError(field.NewPath("spec"),
				fmt.Errorf("the compiled policy fails the sidecar's validation: %w", err)))
			continue
		}
		cr.CompiledGeneration = c.Generation
		entries = append(entries, entry)
	}
	entries = pruneReplacedBy(entries)
	slices.SortFunc(results, func(a, b PolicyResult) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Namespace, b.Namespace))
	})
	slices.SortFunc(cresults, func(a, b ClusterResult) int { return cmp.Compare(a.Name, b.Name) })

	// Entries exist only with a store section: fresh ones need a usable
	// store, carried ones the previous document's.
	out := Output{Policies: results, Clusters: cresults}
	if len(entries) == 0 {
		out.Action = Delete
		return out, nil
	}
	if err := out.assemble(entries, *store, in.Pods, live); err != nil {
		return Output{}, err
	}
	return out, nil
}

// gateways returns the Gateways that may ask the central rate-limit
// service about policy p: those of its target when found, sorted. It is
// nil for a namespace's document.
func (in *Input) gateways(p *v1alpha1.RateLimitPolicy) []string {
	if !in.RateLimitService {
		return nil
	}
	t, ok := in.Targets[config.PolicyEntryValue(p.Namespace, p.Name)]
	if !ok || !t.Found || len(t.Gateways) == 0 {
		return nil
	}
	out := slices.Clone(t.Gateways)
	slices.Sort(out)
	return slices.Compact(out)
}

// applyReplacements decides, for each default rule of cluster policy c,
// which freshly compiled team policies replace it (entry's rules'
// ReplacedBy), and reports on the cluster rules in the team policies'
// results.
func applyReplacements(c *v1alpha1.ClusterRateLimitPolicy, entry *config.Policy, live []*v1alpha1.RateLimitPolicy, freshTeams []int, results []PolicyResult, pods []corev1.Pod) {
	byName := map[string]*config.Rule{}
	for i := range entry.Rules {
		byName[entry.Rules[i].Name] = &entry.Rules[i]
	}
	for _, ti := range freshTeams {
		team, res := live[ti], &results[ti]
		for _, cr := range clusterRules(c) {
			var own *v1alpha1.Rule
			for j := range team.Spec.Rules {
				if team.Spec.Rules[j].Name == cr.rule.Name {
					own = &team.Spec.Rules[j]
				}
			}
			status := v1alpha1.ClusterRuleStatus{Policy: c.Name, Rule: cr.rule.Name, Kind: cr.kind}
			if own != nil && cr.kind == v1alpha1.ClusterRuleDefault {
				if _, seen := res.ClusterDefaults[own.Name]; !seen {
					st := replacement(c, cr.rule, team, own)
					if res.ClusterDefaults == nil {
						res.ClusterDefaults = map[string]v1alpha1.ClusterDefaultStatus{}
					}
					res.ClusterDefaults[own.Name] = st
					if st.Replaced {
						rule := byName[cr.rule.Name]
						rule.ReplacedBy = append(rule.ReplacedBy, string(team.UID))
						slices.Sort(rule.ReplacedBy)
						status.ReplacedBy = own.Name
					}
				}
			}
			if status.ReplacedBy != "" || overlaps(c, team, pods) {
				res.ClusterRules = append(res.ClusterRules, status)
			}
		}
	}
}

// pruneReplacedBy drops, from every rule's ReplacedBy, the uids of
// policies the document does not hold (a carried entry may name a policy
// since removed). It copies what it changes: entries may share slices
// with the previous document.
func pruneReplacedBy(entries []config.Policy) []config.Policy {
	uids := map[string]bool{}
	for i := range entries {
		uids[entries[i].UID] = true
	}
	for i := range entries {
		e := &entries[i]
		for j := range e.Rules {
			rb := e.Rules[j].ReplacedBy
			if len(rb) == 0 || !slices.ContainsFunc(rb, func(u string) bool { return !uids[u] }) {
				continue
			}
			rules := slices.Clone(e.Rules)
			rules[j].ReplacedBy = slices.DeleteFunc(slices.Clone(rb), func(u string) bool { return !uids[u] })
			if len(rules[j].ReplacedBy) == 0 {
				rules[j].ReplacedBy = nil
			}
			e.Rules = rules
		}
	}
	return entries
}

// Marshal sets c.Revision to the hash of c's content and returns the
// document. The same content always gives the same bytes and revision:
// struct fields marshal in declaration order and map keys sorted.
func Marshal(c *config.Config) (string, error) {
	c.Revision = ""
	unrevised, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("marshal sidecar config: %w", err)
	}
	c.Revision = config.Digest(unrevised)
	doc, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return "", fmt.Errorf("marshal sidecar config: %w", err)
	}
	return string(doc) + "\n", nil
}

// storeConflict says why a policy's store is not the one its document
// holds, that of first, the earliest-created policy.
func storeConflict(service bool, store, docStore string, first *v1alpha1.RateLimitPolicy) string {
	if service {
		return fmt.Sprintf("CounterStore %q is not the central rate-limit service's store %q, which policy %s/%s, created first, uses; the service holds one store connection for every policy with a targetRef",
			store, docStore, first.Namespace, first.Name)
	}
	return fmt.Sprintf("CounterStore %q is not the namespace's store %q, which policy %q, created first, uses; the sidecars of a namespace share one store",
		store, docStore, first.Name)
}

// targetSelector selects the pods that enforce p: those of its
// podSelector, or, in the central rate-limit service's document, every
// pod given (the service's own).
func targetSelector(service bool, p *v1alpha1.RateLimitPolicy) (labels.Selector, error) {
	if service {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
}

// selectorOrEverything converts a compiled policy's selector, nil meaning
// every pod.
func selectorOrEverything(sel *metav1.LabelSelector) (labels.Selector, error) {
	if sel == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(sel)
}

// replicas is the local share divisor: the ready pods, at least 1.
func replicas(ready int32) int32 { return max(ready, 1) }

// placeReplicas lists, in c, the ready pods each policy targets, so that
// every sidecar knows its place among the replicas that share a limit while
// the store is unreachable: c.Pods holds the names, sorted, and each
// policy's ReplicaPods the indexes of its ready pods, with Replicas their
// number. Over config.MaxPods pods, the lists are left out and the
// sidecars place themselves by a hash of their names.
func placeReplicas(c *config.Config, pods []corev1.Pod) {
	ready := map[int][]string{}
	var all []string
	for i := range c.Policies {
		p := &c.Policies[i]
		sel := labels.Everything()
		if p.PodSelector != nil {
			s, err := metav1.LabelSelectorAsSelector(p.PodSelector)
			if err != nil {
				continue
			}
			sel = s
		}
		for j := range pods {
			pod := &pods[j]
			if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed ||
				!podstatus.Ready(pod) || !sel.Matches(labels.Set(pod.Labels)) {
				continue
			}
			ready[i] = append(ready[i], pod.Name)
			all = append(all, pod.Name)
		}
	}
	slices.Sort(all)
	all = slices.Compact(all)
	if len(all) == 0 || len(all) > config.MaxPods {
		return
	}
	c.Pods = all
	for i, names := range ready {
		p := &c.Policies[i]
		slices.Sort(names)
		p.ReplicaPods = make([]int32, 0, len(names))
		for _, n := range names {
			idx, _ := slices.BinarySearch(all, n)
			p.ReplicaPods = append(p.ReplicaPods, int32(idx))
		}
		p.Replicas = int32(len(names))
	}
}

// resolveRefs checks that the Secret or ConfigMap holding p's JWT keys
// exists, when objs says which do. It returns v1alpha1.ReasonRefNotFound
// and a message naming the field, or "" when the references resolve.
func resolveRefs(p *v1alpha1.RateLimitPolicy, objs *Objects) (reason, message string) {
	j := p.Spec.JWT
	if j == nil || objs == nil {
		return "", ""
	}
	if ref := j.HMACSecretRef; ref != nil && !objs.Secrets[ref.Name] {
		return v1alpha1.ReasonRefNotFound, fmt.Sprintf("spec.jwt.hmacSecretRef: Secret %q not found in namespace %s; tokens cannot be verified, so the policy is not enforced until it exists", ref.Name, p.Namespace)
	}
	if ref := j.JWKSConfigMapRef; ref != nil && !objs.ConfigMaps[ref.Name] {
		return v1alpha1.ReasonRefNotFound, fmt.Sprintf("spec.jwt.jwksConfigMapRef: ConfigMap %q not found in namespace %s; tokens cannot be verified, so the policy is not enforced until it exists", ref.Name, p.Namespace)
	}
	return "", ""
}

// countPods counts the running pods sel matches, and how many are Ready.
// Pods being deleted or finished do not count.
func countPods(sel labels.Selector, pods []corev1.Pod) (targeted, ready int32) {
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		targeted++
		if podstatus.Ready(pod) {
			ready++
		}
	}
	return targeted, ready
}

// resolveStore returns the store section for the CounterStore named name,
// or nil with the reason it cannot be used.
func resolveStore(name string, stores map[string]*v1alpha1.CounterStore) (*config.Store, string, string) {
	cs, ok := stores[name]
	if !ok || cs == nil {
		return nil, v1alpha1.ReasonStoreNotFound, fmt.Sprintf("CounterStore %q not found", name)
	}
	if !meta.IsStatusConditionTrue(cs.Status.Conditions, v1alpha1.ConditionReady) {
		msg := fmt.Sprintf("CounterStore %q is not Ready", name)
		if c := meta.FindStatusCondition(cs.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Message != "" {
			msg += ": " + c.Message
		}
		return nil, v1alpha1.ReasonStoreNotReady, msg
	}
	if len(cs.Status.Endpoints) == 0 {
		return nil, v1alpha1.ReasonStoreNotReady, fmt.Sprintf("CounterStore %q publishes no endpoints", name)
	}
	s := &config.Store{
		Name:           cs.Name,
		Type:           config.StoreRedis,
		Addresses:      slices.Sorted(slices.Values(cs.Status.Endpoints)),
		AuthSecretName: cs.Status.AuthSecretName,
	}
	if ext := cs.Spec.External; ext != nil && ext.TLS != nil {
		s.TLS = &config.TLS{ServerName: ext.TLS.ServerName, InsecureSkipVerify: ext.TLS.InsecureSkipVerify}
		if ext.TLS.CASecretRef != nil {
			// The manager copies the bundle into the sidecars' credentials
			// Secret (sidecaraccess), which every sidecar mounts.
			s.TLS.CAFile = config.StoreCAFile
		}
	}
	if err := (&config.Config{APIVersion: config.APIVersion, Store: *s}).Validate(); err != nil {
		return nil, v1alpha1.ReasonStoreNotReady, fmt.Sprintf("CounterStore %q publishes an unusable store: %v", name, err)
	}
	return s, v1alpha1.ReasonResolvedRefs, fmt.Sprintf("CounterStore %q is Ready", name)
}

// checkEntry runs the sidecar's own validation on one compiled policy, so
// that the document written is never one the sidecars reject.
func checkEntry(p config.Policy, store config.Store) error {
	c := config.Config{APIVersion: config.APIVersion, Store: store, Policies: []config.Policy{p}}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("the compiled policy fails the sidecar's validation: %w", err)
	}
	return nil
}
