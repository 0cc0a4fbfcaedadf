// Package ruleset compiles a validated sidecar config into what the HTTP
// front evaluates per request: the rule index, each rule's key extractor
// and cost, and the engine's view of each rule. A Set is immutable and safe
// for concurrent use; a config change builds a new Set.
package ruleset

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
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
	// Descriptors holds the descriptor rules (match.descriptors), which
	// the Envoy rate-limit service front evaluates; they are not in Rules.
	Descriptors *Descriptors
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

// Compile builds the Set for a pod with the given labels. The config must
// have passed Validate; Compile still reports, joined and with field paths,
// what only compiling can find (unreadable key files, for example).
func Compile(c *config.Config, podLabels labels.Set, m *metrics.Metrics) (*Set, error) {
	s := &Set{Config: c}
	var matches []match.Rule
	var errs []error
	descs := newDescriptorBuilder()
	// The policies this pod enforces, by uid, for replacedBy.
	selected := map[string]bool{}
	for i := range c.Policies {
		p := &c.Policies[i]
		if p.PodSelector == nil {
			selected[p.UID] = true
			continue
		}
		if sel, err := metav1.LabelSelectorAsSelector(p.PodSelector); err == nil && sel.Matches(podLabels) {
			selected[p.UID] = true
		}
	}
	for i := range c.Policies {
		p := &c.Policies[i]
		path := fmt.Sprintf("policies[%d]", i)
		if p.PodSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.podSelector: %w", path, err))
				continue
			}
			if !sel.Matches(podLabels) {
				s.Ignored = append(s.Ignored, p.Name)
				continue
			}
		}
		pol, err := descriptor.NewPolicy(s.Policies, p)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		s.Policies++
		for j := range p.Rules {
			r := &p.Rules[j]
			rp := fmt.Sprintf("%s.rules[%d]", path, j)
			if r.Match.Descriptors != nil {
				if err := descs.add(i, p, r, m); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", rp, err))
				}
				continue
			}
			if replaced(r, selected) {
				s.Replaced = append(s.Replaced, p.Name+"."+r.Name)
				continue
			}
			lim, err := r.Limit.Limiter()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.limit: %w", rp, err))
				continue
			}
			er, err := engine.NewRule(p.Name, r.Name, lim, p.Replicas, r.FailureMode == config.FailureClosed, r.Mode == config.ModeShadow, m)
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
				cost.maximum = lim.Capacity()
			}
			if r.Cost.FromHeader != "" {
				cost.header = http.CanonicalHeaderKey(r.Cost.FromHeader)
			}
			exempt, err := match.NewExemption(pol, p.Exempt, r.Exempt)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", rp, err))
				continue
			}
			rule := Rule{Engine: er, Extract: ex, Cost: cost, Exempt: exempt, PolicyName: p.Name + "." + r.Name, Namespace: p.Namespace}
			if exempt != nil {
				rule.Exempted = m.ExemptTotal.WithLabelValues(p.Name, r.Name)
			}
			s.Rules = append(s.Rules, rule)
			matches = append(matches, match.Rule{Match: r.Match, Policy: pol})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var err error
	if s.Descriptors, err = descs.finish(); err != nil {
		return nil, err
	}
	if s.Matcher, err = match.New(matches); err != nil {
		return nil, err
	}
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
func (s *Set) Evaluate(sc *Scratch) error {
	sc.idx = s.Matcher.Match(&sc.Request, sc.idx[:0])
	sc.Hits, sc.Rules = sc.Hits[:0], sc.Rules[:0]
	for _, i := range sc.idx {
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
