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
	// TargetedPods is the number of running pods the selector matches.
	TargetedPods int32 `json:"targetedPods"`
	// ReadyPods is how many of those are Ready.
	ReadyPods int32 `json:"readyPods"`
	// CompiledGeneration is the generation whose entry the document
	// holds: Generation when the current spec is compiled, an earlier one
	// when an earlier entry is carried over, 0 when the policy has none.
	CompiledGeneration int64 `json:"compiledGeneration"`
}

// Accepted reports whether the policy's spec is valid.
func (r *PolicyResult) Accepted() bool { return len(r.Invalid) == 0 }

// RefsResolved reports whether the policy's store resolves.
func (r *PolicyResult) RefsResolved() bool { return r.StoreReason == v1alpha1.ReasonResolvedRefs }

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
	if len(live) == 0 {
		return Output{Action: Delete, Policies: []PolicyResult{}}, nil
	}
	// The earliest policy decides the namespace's store, so adding a
	// policy never moves the store under the ones already running.
	slices.SortFunc(live, func(a, b *v1alpha1.RateLimitPolicy) int {
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
	nsStore := results[0].Store
	for i := range results {
		if results[i].Accepted() {
			nsStore = results[i].Store
			break
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

	var entries []config.Policy
	for i, p := range live {
		r := &results[i]
		switch {
		case r.Store != nsStore:
			r.StoreReason = v1alpha1.ReasonStoreConflict
			r.StoreMessage = fmt.Sprintf("CounterStore %q is not the namespace's store %q, which policy %q, created first, uses; the sidecars of a namespace share one store",
				r.Store, nsStore, results[0].Name)
			if in.RateLimitService {
				r.StoreMessage = fmt.Sprintf("CounterStore %q is not the central rate-limit service's store %q, which policy %s/%s, created first, uses; the service holds one store connection for every policy with a targetRef",
					r.Store, nsStore, live[0].Namespace, live[0].Name)
			}
		default:
			r.StoreReason, r.StoreMessage = freshReason, freshMsg
		}
		sel, selErr := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if in.RateLimitService {
			sel = labels.Everything()
		}
		if selErr == nil {
			r.TargetedPods, r.ReadyPods = countPods(sel, in.Pods)
		}

		if r.Accepted() && r.RefsResolved() {
			entry := compilePolicy(p, replicas(r.ReadyPods))
			if err := checkEntry(entry, *store); err != nil {
				r.Invalid = append(r.Invalid, field.InternalError(field.NewPath("spec"), err))
			} else {
				r.CompiledGeneration = p.Generation
				entries = append(entries, entry)
				continue
			}
		}
		if prev, ok := previous[string(p.UID)]; ok && store != nil {
			// A shallow copy: the entry shares slices with Previous, which
			// neither side modifies.
			entry := *prev
			entry.Replicas = 1
			// A nil selector selects every pod (config.Policy.PodSelector).
			if s, err := selectorOrEverything(entry.PodSelector); err == nil {
				_, ready := countPods(s, in.Pods)
				entry.Replicas = replicas(ready)
			}
			r.CompiledGeneration = entry.Generation
			entries = append(entries, entry)
		}
	}
	slices.SortFunc(results, func(a, b PolicyResult) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Namespace, b.Namespace))
	})

	// Entries exist only with a store section: fresh ones need a usable
	// store, carried ones the previous document's.
	out := Output{Policies: results}
	switch {
	case len(entries) == 0:
		out.Action = Delete
	default:
		slices.SortFunc(entries, func(a, b config.Policy) int {
			return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Namespace, b.Namespace))
		})
		out.Action = Apply
		out.Config = &config.Config{APIVersion: config.APIVersion, Store: *store, Policies: entries}
		data, err := Marshal(out.Config)
		if err != nil {
			return Output{}, err
		}
		out.Data = data
	}
	return out, nil
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
		if ref := ext.TLS.CASecretRef; ref != nil {
			s.TLS.CAFile = SecretFile(ref.Name, ref.Key)
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
