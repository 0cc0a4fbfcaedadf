// Package ruleset compiles a validated sidecar config into what the HTTP
// front evaluates per request: the rule index, each rule's key extractor
// and cost, and the engine's view of each rule. A Set is immutable and safe
// for concurrent use; a config change builds a new Set.
package ruleset

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
)

// Set is a compiled config.
type Set struct {
	// Config is the document the set was compiled from.
	Config *config.Config
	// Matcher indexes Rules: matcher rule i is Rules[i].
	Matcher *match.Matcher
	// Rules are the enforced rules of the policies selecting this pod.
	Rules []Rule
	// Policies is the number of policies in force (the per-request cache
	// size of a descriptor.Request).
	Policies int
	// Ignored names the policies whose podSelector does not select this
	// pod.
	Ignored []string
	// Replaced names, as "<policy>.<rule>", the rules this pod does not
	// enforce because a policy it enforces replaces them (replacedBy).
	Replaced []string
	// Failed are the policies selecting this pod that could not be
	// compiled, each with why. Each policy compiles, and fails, on its
	// own: the others are in force.
	Failed []PolicyError
	// Descriptors holds the descriptor rules (match.descriptors), which
	// the Envoy rate-limit service front evaluates; they are not in Rules.
	Descriptors *Descriptors
	// Concurrency are the concurrency rules of the policies selecting
	// this pod, indexed by ConcurrencyMatcher (nil when there are none);
	// they are not in Rules.
	Concurrency        []ConcurrencyRule
	ConcurrencyMatcher *match.Matcher
	// Shedding is the load shedder's settings and priorities, or nil when
	// no policy selecting this pod has loadShedding.
	Shedding *Shedding
	// Requests indexes Rules by policy, for the request descriptors of
	// the Envoy rate-limit service front.
	Requests *Requests
	// Shares are the policies in force whose limits this pod shares with
	// other replicas while the store is unreachable (see ReplicaShare),
	// each with this pod's place among them, in document order.
	Shares []ReplicaShare
}

// ReplicaShare is a policy in force with more than one replica and a rule
// that, while the store is unreachable, admits on this replica's share of
// its limit alone (a rate rule with failureMode Open and mode Enforce).
// The replicas' shares hold the limit together only if each replica has a
// place of its own: two replicas in one place spend the same tokens, each
// once (see limiter.Share).
type ReplicaShare struct {
	// Namespace and Name identify the policy.
	Namespace, Name string
	// Share is this pod's place: Index among Of replicas.
	Share limiter.Share
	// Placement says how the pod found its place.
	Placement Placement
}

// ID is the policy's namespace/name, or its name when it has no namespace.
func (r *ReplicaShare) ID() string { return policyID(r.Namespace, r.Name) }

// Placement says how a pod found its place among a policy's replicas.
type Placement uint8

const (
	// PlacedListed is the pod's position in the policy's replicaPods: a
	// place of its own.
	PlacedListed Placement = iota
	// PlacedByName is a place from a hash of the pod's name, which the
	// policy's replicaPods does not list. Names hash to places at random:
	// among 10 replicas, two usually share one.
	PlacedByName
	// PlacedUnnamed is the place of a pod without a name: the place of
	// every other replica without one.
	PlacedUnnamed
)

// String implements fmt.Stringer.
func (p Placement) String() string {
	switch p {
	case PlacedListed:
		return "listed"
	case PlacedByName:
		return "by-name"
	case PlacedUnnamed:
		return "unnamed"
	}
	return fmt.Sprintf("Placement(%d)", uint8(p))
}

// PolicyError is a policy that could not be compiled.
type PolicyError struct {
	// Index is the policy's position in the document.
	Index int
	// Namespace and Name identify the policy.
	Namespace, Name string
	// Err says why, with field paths.
	Err error
}

// Error implements error.
func (e *PolicyError) Error() string {
	return fmt.Sprintf("policy %s: %v", e.ID(), e.Err)
}

// ID is the policy's namespace/name, or its name when it has no namespace.
func (e *PolicyError) ID() string { return policyID(e.Namespace, e.Name) }

func policyID(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// Pod is the pod a set is compiled for.
type Pod struct {
	// Labels are matched against each policy's podSelector.
	Labels labels.Set
	// Name finds the pod's replica index in a policy's ReplicaPods, which
	// staggers the fail-open shares (see config.Policy.ReplicaPods). A pod
	// that is not listed, or has no name, takes an index from a hash of
	// its name; Set.Shares says which policies it took one for.
	Name string
}

// Rule is one compiled rule.
type Rule struct {
	Engine  *engine.Rule
	Extract *descriptor.Extractor
	Cost    Cost
	// Exempt leaves some of the requests the rule matches alone; nil
	// exempts none.
	Exempt *match.Exemption
	// Exempted counts the requests Exempt left alone.
	Exempted prometheus.Counter
	// PolicyName is the name the RateLimit and RateLimit-Policy fields
	// give the rule: "<policy>.<rule>".
	PolicyName string
	// Namespace is the policy's namespace.
	Namespace string
	// Fields says which response fields the answers the rule binds
	// carry (its responseHeaders); Engine.Quiet agrees with it.
	Fields ratelimitheaders.Mode
}

// Cost computes a request's cost under a rule.
type Cost struct {
	header  string
	def     int64
	maximum int64
}

// CostError is a request whose cost header is malformed or too high.
type CostError struct {
	Header, Value string
	Max           int64
}

// Error implements error.
func (e *CostError) Error() string {
	return fmt.Sprintf("header %s: cost must be an integer between 1 and %d, got %q", e.Header, e.Max, e.Value)
}

// Of returns the cost of a request with headers h. A header-supplied cost
// must be at least 1: a cost of 0 would be a free pass around the limit for
// whoever can set the header.
func (c Cost) Of(h http.Header) (int64, error) { return c.of(h[c.header]) }

// of is Of given the values of the cost header.
func (c Cost) of(vs []string) (int64, error) {
	if c.header != "" {
		if len(vs) > 0 {
			n, err := strconv.ParseInt(vs[0], 10, 64)
			if err != nil || n < 1 || n > c.maximum || len(vs) > 1 {
				return 0, &CostError{Header: c.header, Value: vs[0], Max: c.maximum}
			}
			return n, nil
		}
	}
	return c.def, nil
}

// Compile builds the Set for a pod with the given labels; see CompileFor.
func Compile(c *config.Config, podLabels labels.Set, m *metrics.Metrics) (*Set, error) {
	return CompileFor(c, Pod{Labels: podLabels}, m)
}

// CompileFor builds the Set for a pod. The config must have passed
// Validate. Each policy compiles on its own: one that fails (an unreadable
// key file, a selector that does not parse) is left out and reported in
// Set.Failed, with field paths, and the others are in force. The error is
// for what no policy can be blamed for.
func CompileFor(c *config.Config, pod Pod, m *metrics.Metrics) (*Set, error) {
	s := &Set{Config: c}
	var matches []match.Rule
	descs := newDescriptorBuilder()
	var adm admissionBuilder
	reqs := newRequests()
	// The policies this pod enforces, by uid, for replacedBy.
	selected := map[string]bool{}
	for i := range c.Policies {
		p := &c.Policies[i]
		if p.PodSelector == nil {
			selected[p.UID] = true
			continue
		}
		if sel, err := metav1.LabelSelectorAsSelector(p.PodSelector); err == nil && sel.Matches(pod.Labels) {
			selected[p.UID] = true
		}
	}
	for i := range c.Policies {
		p := &c.Policies[i]
		if p.PodSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
			if err != nil {
				s.Failed = append(s.Failed, PolicyError{Index: i, Namespace: p.Namespace, Name: p.Name, Err: fmt.Errorf("podSelector: %w", err)})
				continue
			}
			if !sel.Matches(pod.Labels) {
				s.Ignored = append(s.Ignored, p.Name)
				continue
			}
		}
		var padm admissionBuilder
		share, placed := replicaShare(c, p, pod.Name)
		rules, ms, pm, replaced, err := compilePolicy(s.Policies, i, p, share, selected, descs, &padm, m)
		if err != nil {
			s.Failed = append(s.Failed, PolicyError{Index: i, Namespace: p.Namespace, Name: p.Name, Err: err})
			continue
		}
		if share.Of > 1 && failsOpenOnShare(rules, descs.byPolicy[i]) {
			s.Shares = append(s.Shares, ReplicaShare{Namespace: p.Namespace, Name: p.Name, Share: share, Placement: placed})
		}
		s.Policies++
		reqs.add(p, pm, len(s.Rules), len(rules))
		s.Rules = append(s.Rules, rules...)
		s.Replaced = append(s.Replaced, replaced...)
		matches = append(matches, ms...)
		adm.merge(&padm)
	}
	var err error
	if s.Descriptors, err = descs.finish(); err != nil {
		return nil, err
	}
	if s.Matcher, err = match.New(matches); err != nil {
		return nil, err
	}
	if err := adm.finish(s); err != nil {
		return nil, err
	}
	s.Requests = reqs.finish(s.Rules)
	return s, nil
}

// Conditions counts the CEL conditions of the set's matches and
// exemptions: how many run as Go and how many there are in all (see
// package expr).
func (s *Set) Conditions() (native, total int) {
	progs := s.Matcher.Programs()
	for i := range s.Rules {
		progs = append(progs, s.Rules[i].Exempt.Programs()...)
	}
	for _, p := range progs {
		n, t := p.Native()
		native, total = native+n, total+t
	}
	return native, total
}

// replaced reports whether one of the policies that replace r is enforced
// on this pod.
func replaced(r *config.Rule, selected map[string]bool) bool {
	for _, uid := range r.ReplacedBy {
		if selected[uid] {
			return true
		}
	}
	return false
}

// Scratch is the per-request state of Evaluate. Reuse it across requests
// (a sync.Pool of them); it is not safe for concurrent use.
type Scratch struct {
	// Request is the request being evaluated; Evaluate's caller resets it.
	Request descriptor.Request
	// Hits are the hits to decide, and Rules the index in Set.Rules of the
	// rule of each hit.
	Hits  []engine.Hit
	Rules []int

	idx []int
}

// RejectError is a request that a rule answers 400: a key part it must
// have is missing (a *descriptor.MissingError), or its cost header is bad
// (a *CostError).
type RejectError struct {
	// Rule is the rule that rejects.
	Rule *Rule
	// Err says why.
	Err error
}

// Error implements error.
func (e *RejectError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *RejectError) Unwrap() error { return e.Err }

// Evaluate matches sc.Request against the set and fills sc.Hits and
// sc.Rules with the hits to decide: every matching rule that does not
// exempt the request and has a key for it. A rule that rejects the request
// stops the evaluation with a *RejectError, and nothing is spent.
func (s *Set) Evaluate(sc *Scratch) error { return s.evaluate(s.Matcher, 0, sc) }

// EvaluatePolicy is Evaluate on the rules of one policy only, those of a
// request descriptor (see Requests): the same matching, exemptions, keys
// and costs. sc.Rules holds indices into s.Rules.
func (s *Set) EvaluatePolicy(p *RequestPolicy, sc *Scratch) error {
	return s.evaluate(p.matcher, p.first, sc)
}

// evaluate is Evaluate through matcher m, whose rule i is
// s.Rules[first+i].
func (s *Set) evaluate(m *match.Matcher, first int, sc *Scratch) error {
	sc.idx = m.Match(&sc.Request, sc.idx[:0])
	// The last request's hits go, so that a Scratch kept between requests
	// never holds the rules of a set a config change has replaced.
	clear(sc.Hits)
	sc.Hits, sc.Rules = sc.Hits[:0], sc.Rules[:0]
	for _, i := range sc.idx {
		i += first
		rule := &s.Rules[i]
		if rule.Exempt.Holds(&sc.Request) {
			rule.Exempted.Inc()
			continue
		}
		key, ok, err := rule.Extract.Key(&sc.Request)
		if err != nil {
			return &RejectError{Rule: rule, Err: err}
		}
		if !ok {
			continue
		}
		var vs []string
		if rule.Cost.header != "" {
			vs = sc.Request.HeaderValues(rule.Cost.header)
		}
		cost, err := rule.Cost.of(vs)
		if err != nil {
			return &RejectError{Rule: rule, Err: err}
		}
		sc.Hits = append(sc.Hits, engine.Hit{Rule: rule.Engine, Key: key, Cost: cost})
		sc.Rules = append(sc.Rules, i)
	}
	return nil
}

// compilePolicy compiles the rules of policy p (document index pi), which
// is the index-th policy in force, with this pod's share of its limits.
// Its descriptor rules go to descs only when the whole policy compiles.
//
// A rule that a policy enforced on this pod replaces (replacedBy, the uids
// in selected) is not compiled into the set; its "<policy>.<rule>" name is
// returned in replacedRules. The policy's concurrency rules, priorities and
// load shedding go to adm, which the caller keeps only when the policy
// compiles.
func compilePolicy(index, pi int, p *config.Policy, share limiter.Share, selected map[string]bool, descs *descriptorBuilder, adm *admissionBuilder, m *metrics.Metrics) (rules []Rule, matches []match.Rule, pm *match.Matcher, replacedRules []string, err error) {
	pol, err := descriptor.NewPolicy(index, p)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	adm.policy(p)
	var errs []error
	var descRules []*config.Rule
	for j := range p.Rules {
		r := &p.Rules[j]
		rp := fmt.Sprintf("rules[%d]", j)
		if r.Match.Descriptors != nil {
			descRules = append(descRules, r)
			continue
		}
		if replaced(r, selected) {
			replacedRules = append(replacedRules, p.Name+"."+r.Name)
			continue
		}
		if err := adm.priority(r, pol); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rp, err))
		}
		if r.Concurrency != nil {
			if err := adm.concurrency(pol, p, r, m); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", rp, err))
			}
			continue
		}
		if !r.IsRate() {
			continue // only a priority
		}
		lim, err := r.Limit.Limiter()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.limit: %w", rp, err))
			continue
		}
		fields := ratelimitheaders.ParseMode(r.ResponseHeaders)
		er, err := engine.NewSharedRule(p.Name, r.Name, lim, share, r.FailureMode == config.FailureClosed, r.Mode == config.ModeShadow, m)
		if err == nil {
			er.Quiet = fields.Quiet()
			err = er.Spread(r.Limit.Leases(lim.Algorithm), r.Limit.Parts(), m)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.limit: %w", rp, err))
			continue
		}
		ex, err := descriptor.NewExtractor(pol, p, r)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rp, err))
			continue
		}
		cost := Cost{def: r.Cost.Default, maximum: r.Cost.Max}
		if cost.def == 0 {
			cost.def = 1
		}
		if cost.maximum == 0 {
			cost.maximum = r.Limit.PartCapacity(lim)
		}
		if r.Cost.FromHeader != "" {
			cost.header = http.CanonicalHeaderKey(r.Cost.FromHeader)
		}
		exempt, err := match.NewExemption(pol, p.Exempt, r.Exempt)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rp, err))
			continue
		}
		rule := Rule{Engine: er, Extract: ex, Cost: cost, Exempt: exempt, PolicyName: p.Name + "." + r.Name, Namespace: p.Namespace, Fields: fields}
		if exempt != nil {
			rule.Exempted = m.ExemptTotal.WithLabelValues(p.Name, r.Name)
		}
		rules = append(rules, rule)
		matches = append(matches, match.Rule{Match: r.Match, Policy: pol})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, nil, nil, err
	}
	// The policy's own matcher: it proves the matches index (the set's
	// matcher cannot fail on them then), and decides the policy's request
	// descriptors (Requests).
	if pm, err = match.New(matches); err != nil {
		return nil, nil, nil, nil, err
	}
	prepared := make([]*DescriptorRule, len(descRules))
	for k, r := range descRules {
		if prepared[k], err = prepare(p, r, share, m); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("rule %s: %w", r.Name, err)
		}
	}
	for k, r := range descRules {
		descs.insert(pi, r, prepared[k])
	}
	return rules, matches, pm, replacedRules, nil
}

// replicaShare is pod's place among the replicas of p: its position in
// p.ReplicaPods, or, when the pod is not listed, an index from a hash of
// its name, and how it was found. With one replica the place is the whole
// limit, PlacedListed.
func replicaShare(c *config.Config, p *config.Policy, pod string) (limiter.Share, Placement) {
	of := max(p.Replicas, 1)
	if of < 2 {
		return limiter.Share{Of: 1}, PlacedListed
	}
	placed := PlacedUnnamed
	if pod != "" {
		placed = PlacedByName
		for i, idx := range p.ReplicaPods {
			if int(idx) < len(c.Pods) && c.Pods[idx] == pod {
				return limiter.Share{Of: of, Index: int32(i)}, PlacedListed
			}
		}
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(pod))
	return limiter.Share{Of: of, Index: int32(h.Sum32() % uint32(of))}, placed
}

// failsOpenOnShare reports whether one of a policy's rules in force (its
// HTTP rules, and its descriptor rules by name) admits on this replica's
// share of its limit alone while the store is unreachable: a rate rule
// that fails open and may deny. Concurrency rules hold Max / replicas
// slots wherever the replica stands, and a shadow rule denies nothing, so
// neither depends on the replica's place.
func failsOpenOnShare(rules []Rule, descs map[string]*DescriptorRule) bool {
	onShare := func(er *engine.Rule) bool {
		return er != nil && er.Fallback.Shared() && !er.FailClosed && !er.Shadow
	}
	for i := range rules {
		if onShare(rules[i].Engine) {
			return true
		}
	}
	for _, dr := range descs {
		if onShare(dr.Engine) {
			return true
		}
	}
	return false
}
