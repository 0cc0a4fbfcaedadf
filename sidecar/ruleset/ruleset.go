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
	// Descriptors holds the descriptor rules (match.descriptors), which
	// the Envoy rate-limit service front evaluates; they are not in Rules.
	Descriptors *Descriptors
	// Requests indexes Rules by policy, for the request descriptors of
	// the Envoy rate-limit service front.
	Requests *Requests
}

// Rule is one compiled rule.
type Rule struct {
	Engine  *engine.Rule
	Extract *descriptor.Extractor
	Cost    Cost
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
func (c Cost) Of(h http.Header) (int64, error) {
	if c.header != "" {
		if vs := h[c.header]; len(vs) > 0 {
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
	var matches []config.Match
	var errs []error
	descs := newDescriptorBuilder()
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
			s.Rules = append(s.Rules, Rule{Engine: er, Extract: ex, Cost: cost, PolicyName: p.Name + "." + r.Name, Namespace: p.Namespace})
			matches = append(matches, r.Match)
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
	if s.Requests, err = newRequests(s.Rules, matches); err != nil {
		return nil, err
	}
	return s, nil
}
