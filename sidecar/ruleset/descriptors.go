package ruleset

import (
	"fmt"
	"strings"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
)

// Descriptors indexes the descriptor rules of a set (rules with
// match.descriptors) by domain, as a tree of descriptor entries per domain.
// It is immutable once built and safe for concurrent use.
//
// A request descriptor is matched the way envoyproxy/ratelimit matches it:
// its entries are walked from the domain's root, each step taking the
// child with the entry's key and an equal value, else the first child (in
// config order) with the entry's key and a wildcard value that prefixes the
// entry's value, else the child with the entry's key and no value. The walk
// never backtracks. The rules of the node where it ends after the last
// entry apply; a descriptor whose walk stops early matches nothing.
type Descriptors struct {
	domains map[string]*DescriptorNode
	rules   []*DescriptorRule
}

// DescriptorNode is one node of a domain's tree: the rules whose entries
// end here, and the children one entry further.
type DescriptorNode struct {
	// Rules are the rules whose entries spell the path to this node, in
	// config order. Every one of them applies to a descriptor ending here.
	Rules []*DescriptorRule

	exact map[entryKey]*DescriptorNode
	wild  []wildChild
	any   map[string]*DescriptorNode
}

type entryKey struct{ key, value string }

type wildChild struct {
	key, prefix string
	node        *DescriptorNode
}

// DescriptorRule is one compiled descriptor rule.
type DescriptorRule struct {
	// Engine is the rule as the engine decides it; nil for an unlimited
	// rule and for a rule that denies every call (Block).
	Engine *engine.Rule
	// Policy and Name identify the rule; PolicyName is "<policy>.<rule>".
	Policy, Name, PolicyName string
	// Domain is the rule's descriptor domain.
	Domain string
	// Prefix starts every counter key of the rule: "<policy-uid>:<rule>:".
	Prefix string
	// Limit is the rule's limit. For a Block rule Requests is 0 and only
	// Period is meaningful.
	Limit limiter.Limit
	// Unlimited rules match and answer OK without counting.
	Unlimited bool
	// Block rules deny every call they match (requests 0).
	Block bool
	// Shadow rules are counted and reported but never deny.
	Shadow bool
	// Fields says which response fields and which numbers of the
	// descriptor status the rule's answers carry (its responseHeaders);
	// Engine.Quiet agrees with it.
	Fields ratelimitheaders.Mode
	// Replaces are the rules this rule replaces when both match one call.
	Replaces []*DescriptorRule
	// Metrics are the rule's counters, for the decisions taken without the
	// engine (unlimited and Block rules).
	Metrics *metrics.Rule
}

// Domain returns the root of a domain's tree, or nil when no rule has that
// domain.
func (d *Descriptors) Domain(domain string) *DescriptorNode {
	if d == nil {
		return nil
	}
	return d.domains[domain]
}

// Rules returns every descriptor rule, in config order.
func (d *Descriptors) Rules() []*DescriptorRule {
	if d == nil {
		return nil
	}
	return d.rules
}

// Domains returns the number of domains.
func (d *Descriptors) Domains() int {
	if d == nil {
		return 0
	}
	return len(d.domains)
}

// Next takes one step of the walk: the child matching the entry (key,
// value), or nil when there is none. n may be nil.
func (n *DescriptorNode) Next(key, value string) *DescriptorNode {
	if n == nil {
		return nil
	}
	if c := n.exact[entryKey{key, value}]; c != nil {
		return c
	}
	for i := range n.wild {
		w := &n.wild[i]
		if w.key == key && strings.HasPrefix(value, w.prefix) {
			return w.node
		}
	}
	return n.any[key]
}

// child returns the child for a config entry, creating it.
func (n *DescriptorNode) child(e config.DescriptorEntry) *DescriptorNode {
	switch {
	case e.Value == "":
		if c := n.any[e.Key]; c != nil {
			return c
		}
		if n.any == nil {
			n.any = map[string]*DescriptorNode{}
		}
		c := &DescriptorNode{}
		n.any[e.Key] = c
		return c
	case strings.HasSuffix(e.Value, "*"):
		prefix := strings.TrimSuffix(e.Value, "*")
		for _, w := range n.wild {
			if w.key == e.Key && w.prefix == prefix {
				return w.node
			}
		}
		c := &DescriptorNode{}
		n.wild = append(n.wild, wildChild{key: e.Key, prefix: prefix, node: c})
		return c
	default:
		k := entryKey{e.Key, e.Value}
		if c := n.exact[k]; c != nil {
			return c
		}
		if n.exact == nil {
			n.exact = map[entryKey]*DescriptorNode{}
		}
		c := &DescriptorNode{}
		n.exact[k] = c
		return c
	}
}

// descriptorBuilder accumulates descriptor rules during Compile.
type descriptorBuilder struct {
	d        *Descriptors
	byPolicy map[int]map[string]*DescriptorRule // policy index -> rule name -> rule
	pending  []pendingReplace
}

type pendingReplace struct {
	rule   *DescriptorRule
	policy int
	names  []string
}

func newDescriptorBuilder() *descriptorBuilder {
	return &descriptorBuilder{d: &Descriptors{domains: map[string]*DescriptorNode{}}, byPolicy: map[int]map[string]*DescriptorRule{}}
}

// add compiles descriptor rule r of policy p (index pi).
// prepare compiles descriptor rule r of policy p without adding it: add
// it with insert once every rule of the policy has compiled.
func prepare(p *config.Policy, r *config.Rule, share limiter.Share, m *metrics.Metrics) (*DescriptorRule, error) {
	dm := r.Match.Descriptors
	dr := &DescriptorRule{
		Policy: p.Name, Name: r.Name, PolicyName: p.Name + "." + r.Name, Domain: dm.Domain,
		Prefix: p.UID + ":" + r.Name + ":", Shadow: r.Mode == config.ModeShadow,
		Unlimited: r.Limit.Unlimited, Metrics: m.ForRule(p.Name, r.Name),
		Fields: ratelimitheaders.ParseMode(r.ResponseHeaders),
	}
	switch {
	case r.Limit.Unlimited:
	case r.Limit.Requests == 0:
		l := r.Limit
		l.Requests = 1
		lim, err := l.Limiter()
		if err != nil {
			return nil, fmt.Errorf("limit: %w", err)
		}
		lim.Requests = 0
		dr.Limit, dr.Block = lim, true
	default:
		lim, err := r.Limit.Limiter()
		if err != nil {
			return nil, fmt.Errorf("limit: %w", err)
		}
		er, err := engine.NewSharedRule(p.Name, r.Name, lim, share, r.FailureMode == config.FailureClosed, dr.Shadow, m)
		if err != nil {
			return nil, fmt.Errorf("limit: %w", err)
		}
		er.Quiet = dr.Fields.Quiet()
		if err := er.Spread(r.Limit.Leases(lim.Algorithm), r.Limit.Parts(), m); err != nil {
			return nil, fmt.Errorf("limit: %w", err)
		}
		dr.Limit, dr.Engine = lim, er
	}
	return dr, nil
}

// insert adds a prepared descriptor rule of the policy with index pi.
func (b *descriptorBuilder) insert(pi int, r *config.Rule, dr *DescriptorRule) {
	dm := r.Match.Descriptors
	root := b.d.domains[dm.Domain]
	if root == nil {
		root = &DescriptorNode{}
		b.d.domains[dm.Domain] = root
	}
	n := root
	for _, e := range dm.Entries {
		n = n.child(e)
	}
	n.Rules = append(n.Rules, dr)
	b.d.rules = append(b.d.rules, dr)
	if b.byPolicy[pi] == nil {
		b.byPolicy[pi] = map[string]*DescriptorRule{}
	}
	b.byPolicy[pi][r.Name] = dr
	if len(dm.Replaces) > 0 {
		b.pending = append(b.pending, pendingReplace{rule: dr, policy: pi, names: dm.Replaces})
	}
}

// finish resolves replaces, which may name rules later in the policy.
func (b *descriptorBuilder) finish() (*Descriptors, error) {
	for _, pr := range b.pending {
		for _, name := range pr.names {
			t := b.byPolicy[pr.policy][name]
			if t == nil || t == pr.rule || t.Domain != pr.rule.Domain {
				return nil, fmt.Errorf("rule %s: replaces %q: no other descriptor rule of domain %q with that name in the policy", pr.rule.PolicyName, name, pr.rule.Domain)
			}
			pr.rule.Replaces = append(pr.rule.Replaces, t)
		}
	}
	return b.d, nil
}
