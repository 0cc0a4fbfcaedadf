package ruleset

import (
	"fmt"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/match"
)

// Requests indexes a set's HTTP rules by policy, for request descriptors:
// the Envoy rate-limit calls in which a gateway describes one HTTP request
// and names the policy to decide it on (see config.PolicyEntryKey). It is
// immutable once built and safe for concurrent use.
type Requests struct {
	policies map[string]*RequestPolicy
}

// RequestPolicy is one policy's HTTP rules, matched on their own.
type RequestPolicy struct {
	// Matcher indexes the policy's rules: matcher rule i is set rule
	// Rules[i].
	Matcher *match.Matcher
	// Rules are indices into Set.Rules.
	Rules []int
	// Reported describes each of Rules (Reported[i] is Rules[i]) as the
	// Envoy front reports a rule in a descriptor status and the response
	// fields: its engine rule, names, limit and mode.
	Reported []*DescriptorRule
}

// Policy returns the rules of the policy a request descriptor names,
// "<namespace>/<name>" (config.PolicyEntryValue), or nil when no policy in
// force has that name. r may be nil.
func (r *Requests) Policy(id string) *RequestPolicy {
	if r == nil {
		return nil
	}
	return r.policies[id]
}

// Len returns the number of policies.
func (r *Requests) Len() int {
	if r == nil {
		return 0
	}
	return len(r.policies)
}

// newRequests groups rules, whose matches are ms (ms[i] is rules[i]'s), by
// policy.
func newRequests(rules []Rule, ms []config.Match) (*Requests, error) {
	out := &Requests{policies: map[string]*RequestPolicy{}}
	matches := map[string][]config.Match{}
	var order []string
	for i := range rules {
		id := config.PolicyEntryValue(rules[i].Namespace, rules[i].Engine.Policy)
		p := out.policies[id]
		if p == nil {
			p = &RequestPolicy{}
			out.policies[id] = p
			order = append(order, id)
		}
		p.Rules = append(p.Rules, i)
		er := rules[i].Engine
		p.Reported = append(p.Reported, &DescriptorRule{
			Engine: er, Policy: er.Policy, Name: er.Name, PolicyName: rules[i].PolicyName,
			Limit: er.Limit, Shadow: er.Shadow,
		})
		matches[id] = append(matches[id], ms[i])
	}
	for _, id := range order {
		m, err := match.New(matches[id])
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", id, err)
		}
		out.policies[id].Matcher = m
	}
	return out, nil
}
