package ruleset

import (
	"slices"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/match"
)

// Requests indexes a set's HTTP rules by policy, for request descriptors:
// the Envoy rate-limit calls in which a gateway describes one HTTP request
// and names the policy to decide it on (see config.PolicyEntryKey). It is
// immutable once built and safe for concurrent use.
type Requests struct {
	policies map[string]*RequestPolicy
	// reported describes each rule of the set (reported[i] is Set.Rules[i])
	// as the Envoy front reports a rule in a descriptor status and the
	// response fields.
	reported []*DescriptorRule
}

// RequestPolicy is one policy's HTTP rules, matched on their own (see
// Set.EvaluatePolicy): its matcher's rule i is Set.Rules[first+i].
type RequestPolicy struct {
	matcher *match.Matcher
	first   int
	// gateways is the policy's config.Policy.Gateways, sorted.
	gateways []string
}

// Allows reports whether the Gateway gateway, a config.GatewayRef, may
// ask about the policy (config.Policy.Gateways).
func (p *RequestPolicy) Allows(gateway string) bool {
	_, ok := slices.BinarySearch(p.gateways, gateway)
	return ok
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

// Reported describes Set.Rules[i] as the Envoy front reports a rule: its
// engine rule, names, limit and mode.
func (r *Requests) Reported(i int) *DescriptorRule { return r.reported[i] }

// Len returns the number of policies.
func (r *Requests) Len() int {
	if r == nil {
		return 0
	}
	return len(r.policies)
}

// newRequests starts an empty index; CompileFor adds each policy in force.
func newRequests() *Requests { return &Requests{policies: map[string]*RequestPolicy{}} }

// add indexes policy p, whose HTTP rules are the n set
// rules from first on, matched by m. A second policy of the same name
// (which a valid document does not hold) is left out.
func (r *Requests) add(p *config.Policy, m *match.Matcher, first, n int) {
	id := config.PolicyEntryValue(p.Namespace, p.Name)
	if _, dup := r.policies[id]; dup || n == 0 {
		return
	}
	gws := slices.Clone(p.Gateways)
	slices.Sort(gws)
	r.policies[id] = &RequestPolicy{matcher: m, first: first, gateways: gws}
}

// finish describes the set's rules for the Envoy front.
func (r *Requests) finish(rules []Rule) *Requests {
	r.reported = make([]*DescriptorRule, len(rules))
	for i := range rules {
		er := rules[i].Engine
		r.reported[i] = &DescriptorRule{
			Engine: er, Policy: er.Policy, Name: er.Name, PolicyName: rules[i].PolicyName,
			Limit: er.Limit, Shadow: er.Shadow,
		}
	}
	return r
}
