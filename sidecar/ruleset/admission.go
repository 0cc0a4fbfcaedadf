package ruleset

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/shedder"
)

// ConcurrencyRule is one compiled concurrency rule.
type ConcurrencyRule struct {
	Engine  *engine.ConcurrencyRule
	Extract *descriptor.Extractor
	// Exempt leaves some of the requests the rule matches alone: they
	// take no slot. nil exempts nothing.
	Exempt *match.Exemption
	// Exempted counts the requests Exempt left alone.
	Exempted prometheus.Counter
	// PolicyName is "<policy>.<rule>".
	PolicyName string
	// Namespace is the policy's namespace.
	Namespace string
}

// Shedding is the load shedder's part of a Set: its settings and the rules
// that assign priorities.
type Shedding struct {
	// Config is the shedder's configuration.
	Config shedder.Config
	// Policy names the policy whose loadShedding is in force.
	Policy string
	// Classes indexes the rules that set a priority, in config order
	// (policies in document order, rules as written); class i has
	// priority Priorities[i].
	Classes    *match.Matcher
	Priorities []shedder.Priority
}

// Classify returns the priority of request r: the first rule in order
// that matches it and sets a priority decides, and a request no such rule
// matches is Default. idx is scratch space, returned for reuse.
func (s *Shedding) Classify(r *descriptor.Request, idx []int) (shedder.Priority, []int) {
	if s.Classes == nil {
		return shedder.Default, idx
	}
	idx = s.Classes.Match(r, idx[:0])
	if len(idx) == 0 {
		return shedder.Default, idx
	}
	return s.Priorities[idx[0]], idx
}

// admissionBuilder gathers the concurrency rules, the priorities and the
// shedder's settings while Compile walks the policies that select the pod:
// one builder per policy, merged into the set's when the policy compiles.
type admissionBuilder struct {
	rules   []ConcurrencyRule
	matches []match.Rule
	classes []match.Rule
	prios   []shedder.Priority
	shed    *Shedding
}

// policy records a selected policy's loadShedding; the first policy that
// has one sets the shedder.
func (b *admissionBuilder) policy(p *config.Policy) {
	ls := p.LoadShedding
	if ls == nil || b.shed != nil {
		return
	}
	critical, deflt := ls.Reserved.Shares()
	lo, hi := ls.Limits()
	b.shed = &Shedding{Policy: p.Name, Config: shedder.Config{
		Shadow: ls.Mode == config.ModeShadow, CriticalReserve: int(critical), DefaultReserve: int(deflt),
		MinLimit: int(lo), MaxLimit: int(hi),
	}}
}

// merge appends what o gathered to b; b's loadShedding, when it has one,
// stays in force.
func (b *admissionBuilder) merge(o *admissionBuilder) {
	b.rules = append(b.rules, o.rules...)
	b.matches = append(b.matches, o.matches...)
	b.classes = append(b.classes, o.classes...)
	b.prios = append(b.prios, o.prios...)
	if b.shed == nil {
		b.shed = o.shed
	}
}

// priority records the priority a rule of policy pol sets, if any.
func (b *admissionBuilder) priority(r *config.Rule, pol *descriptor.Policy) error {
	if r.Priority == "" {
		return nil
	}
	prio, err := shedder.ParsePriority(r.Priority)
	if err != nil {
		return fmt.Errorf("priority: %w", err)
	}
	b.classes = append(b.classes, match.Rule{Match: r.Match, Policy: pol})
	b.prios = append(b.prios, prio)
	return nil
}

// concurrency compiles a concurrency rule of policy p, whose key parts pol
// reads.
func (b *admissionBuilder) concurrency(pol *descriptor.Policy, p *config.Policy, r *config.Rule, m *metrics.Metrics) error {
	c := r.Concurrency
	er, err := engine.NewConcurrencyRule(p.Name, r.Name, c.Max, c.TTL(), p.Replicas,
		r.FailureMode == config.FailureClosed, r.Mode == config.ModeShadow, m)
	if err != nil {
		return fmt.Errorf("concurrency: %w", err)
	}
	ex, err := descriptor.NewExtractor(pol, p, r)
	if err != nil {
		return err
	}
	exempt, err := match.NewExemption(pol, p.Exempt, r.Exempt)
	if err != nil {
		return err
	}
	cr := ConcurrencyRule{Engine: er, Extract: ex, Exempt: exempt, PolicyName: p.Name + "." + r.Name, Namespace: p.Namespace}
	if exempt != nil {
		cr.Exempted = m.ExemptTotal.WithLabelValues(p.Name, r.Name)
	}
	b.rules = append(b.rules, cr)
	b.matches = append(b.matches, match.Rule{Match: r.Match, Policy: pol})
	return nil
}

// finish indexes what was gathered into s. Priorities count only when a
// policy that selects the pod turns the shedder on.
func (b *admissionBuilder) finish(s *Set) error {
	s.Concurrency = b.rules
	if len(b.rules) > 0 {
		mm, err := match.New(b.matches)
		if err != nil {
			return err
		}
		s.ConcurrencyMatcher = mm
	}
	if b.shed != nil {
		if len(b.classes) > 0 {
			cm, err := match.New(b.classes)
			if err != nil {
				return err
			}
			b.shed.Classes, b.shed.Priorities = cm, b.prios
		}
		s.Shedding = b.shed
	}
	return nil
}
