// Package policies turns kubectl floodgate's input into the one sidecar
// config that explain and simulate work on: RateLimitPolicies and
// ClusterRateLimitPolicies, validated as admission would and compiled by
// floodgate's own policy compiler, or a sidecar or envoyproxy/ratelimit
// config loaded as the sidecar loads it.
package policies

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/admit"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/load"
	"github.com/floodgate-dev/floodgate/controllers/policy/compiler"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
)

// Options say how to compile.
type Options struct {
	// Namespace is the namespace of RateLimitPolicies that name none.
	Namespace string
	// Replicas, when positive, replaces every policy's replica count, which
	// sets the fail-open share (limit / replicas). Compiled
	// RateLimitPolicies otherwise count 1.
	Replicas int32
	// MountDir, when set, replaces the directory under which the compiled
	// config expects Secret and ConfigMap keys (compiler.MountDir), so
	// that JWT keys can be read from a local copy.
	MountDir string
	// PodLabels, when set, are the labels of the one pod the policies are
	// compiled for (see standInPods).
	PodLabels labels.Set
}

// Set is the compiled config and where it came from.
type Set struct {
	// Config is what the sidecars enforce: the policies with a
	// podSelector, the ClusterRateLimitPolicies, or the config given. It
	// is nil when every RateLimitPolicy of the input has a targetRef.
	Config *config.Config
	// Gateway is the central rate-limit service's document of the
	// input's RateLimitPolicies with a targetRef, compiled as the manager
	// compiles it; nil when there are none.
	Gateway *config.Config
	// Targets are the targets of the RateLimitPolicies with a targetRef,
	// by policy name.
	Targets map[string]Target
	// From describes the input: "RateLimitPolicy" or a config format.
	From string
	// Sources are the files it was read from.
	Sources []string
	// Format and Mapping describe an envoyproxy/ratelimit input.
	Format  rlsimport.Format
	Mapping *rlsimport.Mapping
	// Notes say how the RateLimitPolicies' rules relate to the cluster
	// defaults of their names: replaced because they tighten them, or
	// not, and why.
	Notes []string
}

// Target is a policy's targetRef and, when the input carries the policy's
// status (as read from the cluster, kubectl get -o yaml), what the manager
// reported of it.
type Target struct {
	Ref v1alpha1.TargetReference
	// Status is the policy's status.target; nil when the input has none.
	Status *v1alpha1.TargetStatus
}

// FromRateLimitPolicies is Set.From for compiled RateLimitPolicies.
const FromRateLimitPolicies = "RateLimitPolicy"

// Compile builds the Set of docs. The documents must hold either
// RateLimitPolicies (of one namespace; CounterStores and other objects are
// ignored) or exactly one sidecar or envoyproxy/ratelimit config.
func Compile(docs []load.Doc, v *admit.Validator, o Options) (*Set, error) {
	var rlps, crlps, configs []load.Doc
	for _, d := range docs {
		switch {
		case d.Format != load.Manifest:
			configs = append(configs, d)
		case d.GVK.GroupKind() == v1alpha1.GroupVersion.WithKind("RateLimitPolicy").GroupKind():
			rlps = append(rlps, d)
		case d.GVK.GroupKind() == v1alpha1.GroupVersion.WithKind("ClusterRateLimitPolicy").GroupKind():
			crlps = append(crlps, d)
		}
	}
	var set *Set
	var err error
	switch {
	case len(rlps)+len(crlps) > 0 && len(configs) > 0, len(configs) > 1:
		return nil, fmt.Errorf("give either (Cluster)RateLimitPolicies or one sidecar or envoyproxy/ratelimit config, not both or several; got %d RateLimitPolicies, %d ClusterRateLimitPolicies and %d configs", len(rlps), len(crlps), len(configs))
	case len(configs) == 1:
		set, err = loadConfig(configs[0])
	case len(rlps)+len(crlps) > 0:
		set, err = compileRateLimitPolicies(rlps, crlps, v, o)
	default:
		return nil, errors.New("no RateLimitPolicy, ClusterRateLimitPolicy, sidecar config or envoyproxy/ratelimit config in the input")
	}
	if err != nil {
		return nil, err
	}
	for _, c := range []*config.Config{set.Config, set.Gateway} {
		if c == nil {
			continue
		}
		for i := range c.Policies {
			p := &c.Policies[i]
			if o.Replicas > 0 {
				p.Replicas = o.Replicas
			}
			if o.MountDir != "" && p.JWT != nil {
				p.JWT.HMACSecretFile = remount(p.JWT.HMACSecretFile, o.MountDir)
				p.JWT.JWKSFile = remount(p.JWT.JWKSFile, o.MountDir)
			}
		}
	}
	return set, nil
}

// reportedTarget reads status.target from a policy document as given,
// before admission drops the status; nil when it has none.
func reportedTarget(doc []byte) *v1alpha1.TargetStatus {
	var p struct {
		Status struct {
			Target *v1alpha1.TargetStatus `json:"target"`
		} `json:"status"`
	}
	if err := json.Unmarshal(doc, &p); err != nil {
		return nil
	}
	return p.Status.Target
}

func remount(path, dir string) string {
	if rest, ok := strings.CutPrefix(path, compiler.MountDir); ok {
		return strings.TrimSuffix(dir, "/") + rest
	}
	return path
}

func loadConfig(d load.Doc) (*Set, error) {
	c, f, m, err := rlsimport.LoadAny(d.Data, rlsimport.Options{})
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid %s:\n%w", d.Source, d.Format, err)
	}
	return &Set{Config: c, From: f.String(), Sources: []string{d.Source}, Format: f, Mapping: m}, nil
}

// simulationEpoch orders the policies by their place in the input, as
// creation times order them in a cluster.
var simulationEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// compileRateLimitPolicies compiles one namespace's RateLimitPolicies with
// the ClusterRateLimitPolicies, each of which is taken to select the
// namespace (offline, its labels are unknown).
func compileRateLimitPolicies(docs, clusterDocs []load.Doc, v *admit.Validator, o Options) (*Set, error) {
	set := &Set{From: FromRateLimitPolicies}
	policies := make([]v1alpha1.RateLimitPolicy, 0, len(docs))
	ns := ""
	for i, d := range docs {
		u, err := v.Create(d.JSON, o.Namespace)
		if err != nil {
			return nil, fmt.Errorf("%s: RateLimitPolicy %q would be rejected: %w", d.Where(), d.Name, err)
		}
		var p v1alpha1.RateLimitPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", d.Where(), err)
		}
		if ns != "" && p.Namespace != ns {
			return nil, fmt.Errorf("%s: RateLimitPolicy %q is in namespace %q, the others in %q: a namespace's policies compile together, give one namespace's", d.Where(), p.Name, p.Namespace, ns)
		}
		ns = p.Namespace
		// The identity a cluster would give, made up and stable; the store
		// is irrelevant offline, so no store can conflict.
		p.UID = types.UID("offline-" + p.Name)
		p.Generation = 1
		p.CreationTimestamp = metav1.NewTime(simulationEpoch.Add(time.Duration(i) * time.Second))
		p.Spec.StoreRef = nil
		if t := p.Spec.TargetRef; t != nil {
			if set.Targets == nil {
				set.Targets = map[string]Target{}
			}
			set.Targets[p.Name] = Target{Ref: *t, Status: reportedTarget(d.JSON)}
		}
		policies = append(policies, p)
		set.Sources = appendOnce(set.Sources, d.Source)
	}
	clusters := make([]v1alpha1.ClusterRateLimitPolicy, 0, len(clusterDocs))
	for _, d := range clusterDocs {
		u, err := v.Create(d.JSON, "")
		if err != nil {
			return nil, fmt.Errorf("%s: ClusterRateLimitPolicy %q would be rejected: %w", d.Where(), d.Name, err)
		}
		var c v1alpha1.ClusterRateLimitPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c); err != nil {
			return nil, fmt.Errorf("%s: %w", d.Where(), err)
		}
		c.UID = types.UID("offline-cluster-" + c.Name)
		c.Generation = 1
		c.Spec.NamespaceSelector = metav1.LabelSelector{}
		c.Spec.StoreRef = nil
		clusters = append(clusters, c)
		set.Sources = appendOnce(set.Sources, d.Source)
	}
	if ns == "" {
		ns = o.Namespace
	}
	out, err := compiler.Compile(compiler.Input{
		Namespace:       ns,
		Policies:        policies,
		Pods:            standInPods(ns, o.PodLabels, clusters),
		Stores:          map[string]*v1alpha1.CounterStore{v1alpha1.DefaultCounterStoreName: standInStore()},
		ClusterPolicies: clusters,
	})
	if err != nil {
		return nil, err
	}
	// The policies with a targetRef, compiled as the manager compiles the
	// central rate-limit service's document (the compiler leaves them out
	// of a namespace's).
	gw := compiler.Output{}
	if len(set.Targets) > 0 {
		gw, err = compiler.Compile(compiler.Input{
			Policies:         policies,
			Pods:             standInPods(ns, labels.Set{}, nil),
			Stores:           map[string]*v1alpha1.CounterStore{v1alpha1.DefaultCounterStoreName: standInStore()},
			RateLimitService: true,
		})
		if err != nil {
			return nil, err
		}
	}
	var errs []error
	for _, r := range append(slices.Clone(out.Policies), gw.Policies...) {
		if len(r.Invalid) > 0 {
			errs = append(errs, fmt.Errorf("RateLimitPolicy %q does not compile: %w", r.Name,
				apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("RateLimitPolicy").GroupKind(), r.Name, r.Invalid)))
		}
		for _, rule := range slices.Sorted(maps.Keys(r.ClusterDefaults)) {
			cd := r.ClusterDefaults[rule]
			set.Notes = append(set.Notes, fmt.Sprintf("RateLimitPolicy %s, rule %s: %s", r.Name, rule, cd.Message))
		}
	}
	for _, r := range out.Clusters {
		if len(r.Invalid) > 0 {
			errs = append(errs, fmt.Errorf("ClusterRateLimitPolicy %q does not compile: %w", r.Name,
				apierrors.NewInvalid(v1alpha1.GroupVersion.WithKind("ClusterRateLimitPolicy").GroupKind(), r.Name, r.Invalid)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if out.Config == nil && gw.Config == nil {
		return nil, errors.New("the policies compiled to no config (a ClusterRateLimitPolicy alone applies only to the pods it selects)")
	}
	for _, c := range []*config.Config{out.Config, gw.Config} {
		if c != nil {
			c.Store = config.Store{Type: config.StoreMemory}
		}
	}
	set.Config, set.Gateway = out.Config, gw.Config
	return set, nil
}

func appendOnce(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// standInPods are the pods the policies are compiled for, running the
// sidecar and not Ready (so that every policy keeps a replica count of 1):
// one with podLabels when they are given, otherwise one per
// ClusterRateLimitPolicy with its matchLabels. A cluster policy's entry
// goes into a namespace without RateLimitPolicies only while a pod it
// selects runs the sidecar; whether a team's rule replaces a default does
// not depend on the pods (the sidecar decides that per pod).
func standInPods(ns string, podLabels labels.Set, clusters []v1alpha1.ClusterRateLimitPolicy) []corev1.Pod {
	pod := func(l map[string]string) corev1.Pod {
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "offline-pod", Namespace: ns, Labels: l},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: config.ContainerName}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	if podLabels != nil {
		return []corev1.Pod{pod(podLabels)}
	}
	pods := make([]corev1.Pod, 0, len(clusters))
	for i := range clusters {
		pods = append(pods, pod(maps.Clone(clusters[i].Spec.PodSelector.MatchLabels)))
	}
	return pods
}

// standInStore is a Ready CounterStore: offline, the policies are decided
// in memory.
func standInStore() *v1alpha1.CounterStore {
	return &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.DefaultCounterStoreName},
		Status: v1alpha1.CounterStoreStatus{
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Offline"}},
			Endpoints:  []string{"offline.invalid:6379"},
		},
	}
}
