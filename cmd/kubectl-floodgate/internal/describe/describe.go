// Package describe says in words what each rule of a sidecar config
// limits: which requests, counted per what, how many per how long, what a
// request costs, and what happens when the store is unreachable, for
// example
//
//	each X-API-Key: 5 requests per 10 s, burst 5, TokenBucket; fails open
//	to 1 request per 10 s per replica on 5 replicas
//
// The numbers come from the sidecar's own code: the limit as the sidecar
// parses it (config.Limit.Limiter) and the fail-open share as the engine
// derives it (engine.NewRule).
package describe

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
)

// Policy is one policy's rules in words.
type Policy struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	// Replicas is the replica count the fail-open share is computed for.
	Replicas int32 `json:"replicas"`
	// Selects says which pods enforce the policy, or, for a policy with a
	// targetRef, which gateways.
	Selects string `json:"selects"`
	// Target is the targetRef of a policy that a gateway enforces.
	Target *Target `json:"target,omitempty"`
	Rules  []Rule  `json:"rules"`
}

// Target is a policy's targetRef and what the manager reported of it.
type Target struct {
	// Ref is the target, as Kind/name or Kind/name/sectionName.
	Ref string `json:"ref"`
	// Status is the policy's status.target when the input carries it (a
	// policy read from the cluster): whether the target was found, its
	// Gateways and hostnames, the keys of the generated gateway config,
	// and the gateway objects the manager applied.
	Status *v1alpha1.TargetStatus `json:"status,omitempty"`
}

// Gateway describes every rule of c, the central rate-limit service's
// document, whose policies gateways enforce: targets holds each one's
// target, by policy name.
func Gateway(c *config.Config, targets map[string]Target) ([]Policy, error) {
	ps, err := Config(c)
	if err != nil {
		return nil, err
	}
	// The central service answers OVER_LIMIT where a sidecar answers 400
	// or 503, and the gateway turns that into its 429.
	gatewayWords := strings.NewReplacer(failClosed, failClosedAtGateway, answered400, deniedAtGateway)
	for i := range ps {
		for j := range ps[i].Rules {
			r := &ps[i].Rules[j]
			r.Summary, r.Failure = gatewayWords.Replace(r.Summary), gatewayWords.Replace(r.Failure)
			r.Cost, r.MissingKey = gatewayWords.Replace(r.Cost), gatewayWords.Replace(r.MissingKey)
		}
		t, ok := targets[ps[i].Name]
		if !ok {
			continue
		}
		ps[i].Target = &t
		ps[i].Selects = "the gateways of " + t.Ref + " (targetRef), asking the central rate-limit service"
	}
	return ps, nil
}

// What a sidecar answers, and what a gateway answers instead.
const (
	failClosed          = "fails closed: 503 while the store is unreachable"
	failClosedAtGateway = "fails closed: denied (OVER_LIMIT, the gateway answers 429) while the store is unreachable"
	answered400         = "answered 400"
	deniedAtGateway     = "denied (OVER_LIMIT, the gateway answers 429)"
)

// Rule is one rule in words, with its numbers.
type Rule struct {
	Name string `json:"name"`
	// Summary is the one-sentence account: counter, limit, failure mode.
	Summary string `json:"summary"`
	// Applies says which requests the rule applies to.
	Applies string `json:"applies"`
	// Counter says what a counter is kept per.
	Counter string `json:"counter"`
	// Limit is the rule's limit; nil for an unlimited descriptor rule.
	Limit *Limit `json:"limit,omitempty"`
	// Cost says what a request spends.
	Cost string `json:"cost,omitempty"`
	// MissingKey says what happens to a request without the key parts.
	MissingKey string `json:"missingKey,omitempty"`
	// Exempt says which requests the rule matches but never limits (its
	// exempt section and its policy's).
	Exempt string `json:"exempt,omitempty"`
	// ReplacedBy names the policies whose pods do not enforce the rule,
	// because a rule of theirs replaces it (a cluster default that a
	// team's policy tightens).
	ReplacedBy []string `json:"replacedBy,omitempty"`
	// Failure says what happens when the store is unreachable.
	Failure string `json:"failure"`
	// Fallback is the local limit of each replica when the store is
	// unreachable and the rule fails open.
	Fallback *Limit `json:"fallback,omitempty"`
	// Shadow rules are counted and reported but never deny.
	Shadow bool `json:"shadow,omitempty"`
	// Concurrency is a concurrency rule's cap on requests in flight.
	Concurrency *Concurrency `json:"concurrency,omitempty"`
	// Priority is the load-shedding class of the requests the rule
	// matches, when it sets one.
	Priority string `json:"priority,omitempty"`
	// ResponseHeaders is RetryAfter or None when the rule keeps its
	// numbers out of its answers; empty for Full.
	ResponseHeaders string `json:"responseHeaders,omitempty"`
}

// Concurrency is a concurrency rule's numbers.
type Concurrency struct {
	// Max is the shared cap on a key's requests in flight.
	Max int64 `json:"max"`
	// LeaseTTL is how long a crashed sidecar's slot stays taken, as a Go
	// duration ("10s").
	LeaseTTL string `json:"leaseTTL"`
	// Fallback is each replica's cap while the store is unreachable and
	// the rule fails open.
	Fallback int64 `json:"fallback,omitempty"`
}

// Limit is a limit's numbers.
type Limit struct {
	Requests int64 `json:"requests"`
	// Per is the period, as a Go duration ("1m0s").
	Per       string `json:"per"`
	Burst     int64  `json:"burst,omitempty"`
	Algorithm string `json:"algorithm"`
	// MaxDelay, for a rule with onExceed: Delay, is how long a request
	// over the limit may wait for its slot, as a Go duration; Burst is
	// then how many an idle key passes at once (delayAfter).
	MaxDelay string `json:"maxDelay,omitempty"`
	// SharedBy, on a fail-open fallback, is the number of replicas that
	// deal the limit's tokens out among themselves (each spends every
	// SharedBy-th one): Requests and Burst are then each replica's share,
	// when it is a whole number, and else the fleet's.
	SharedBy int32 `json:"sharedBy,omitempty"`
}

// Config describes every rule of every policy of c, whatever pods they
// select.
func Config(c *config.Config) ([]Policy, error) {
	m := metrics.NewMetrics(prometheus.NewRegistry())
	names := make(map[string]string, len(c.Policies))
	for i := range c.Policies {
		names[c.Policies[i].UID] = c.Policies[i].Name
	}
	out := make([]Policy, 0, len(c.Policies))
	for i := range c.Policies {
		p := &c.Policies[i]
		dp := Policy{Name: p.Name, Namespace: p.Namespace, Replicas: max(p.Replicas, 1), Selects: selects(p)}
		for j := range p.Rules {
			r, err := rule(p, &p.Rules[j], m)
			if err != nil {
				return nil, fmt.Errorf("policy %s, rule %s: %w", p.Name, p.Rules[j].Name, err)
			}
			for k, uid := range r.ReplacedBy {
				if n, ok := names[uid]; ok {
					r.ReplacedBy[k] = n
				}
			}
			dp.Rules = append(dp.Rules, r)
		}
		out = append(out, dp)
	}
	return out, nil
}

func selects(p *config.Policy) string {
	s := p.PodSelector
	if s == nil || (len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0) {
		return "every pod of the namespace"
	}
	var parts []string
	for _, k := range sortedKeys(s.MatchLabels) {
		parts = append(parts, k+"="+s.MatchLabels[k])
	}
	for _, e := range s.MatchExpressions {
		parts = append(parts, fmt.Sprintf("%s %s %s", e.Key, strings.ToLower(string(e.Operator)), strings.Join(e.Values, ",")))
	}
	return "pods with " + strings.Join(parts, ", ")
}

func rule(p *config.Policy, r *config.Rule, m *metrics.Metrics) (Rule, error) {
	out := Rule{Name: r.Name, Shadow: r.Mode == config.ModeShadow, Priority: r.Priority}
	if r.ResponseHeaders != "" && r.ResponseHeaders != config.ResponseHeadersFull {
		out.ResponseHeaders = r.ResponseHeaders
	}
	if d := r.Match.Descriptors; d != nil {
		return descriptorRule(p, r, out, m)
	}
	out.Applies = rlsimport.Applies(&r.Match)
	if !r.IsRate() {
		return unrated(p, r, out, m)
	}
	out.Counter = rlsimport.Counter(r.KeyAlternatives())
	lim, err := limited(&out, p, r, m)
	if err != nil {
		return Rule{}, err
	}
	out.Cost = cost(r.Cost, lim.Capacity())
	out.MissingKey = missingKey(r)
	out.Exempt = exempt(p.Exempt, r.Exempt)
	out.ReplacedBy = slices.Clone(r.ReplacedBy)
	return out, nil
}

// unrated describes a rule that limits no rate: a concurrency cap, or
// only a priority, in the words floodgate-sidecar --check-config uses too
// (rlsimport.DescribeUnrated).
func unrated(p *config.Policy, r *config.Rule, out Rule, m *metrics.Metrics) (Rule, error) {
	u, err := rlsimport.DescribeUnrated(p, r, m)
	if err != nil {
		return Rule{}, err
	}
	out.Failure = u.Failure
	er := u.Concurrency
	if er == nil {
		out.Summary = u.Limit
		return out, nil
	}
	out.Counter = rlsimport.Counter(r.KeyAlternatives())
	out.Concurrency = &Concurrency{Max: er.Max, LeaseTTL: er.LeaseTTL.String()}
	if !er.FailClosed {
		out.Concurrency.Fallback = er.Fallback
	}
	out.Summary = out.Counter + ": " + u.Limit
	out.MissingKey = missingKey(r)
	return out, nil
}

// limited fills the limit, the failure mode and the summary of a counted
// rule, from the limit as the sidecar parses it and the fallback the
// engine derives.
func limited(out *Rule, p *config.Policy, r *config.Rule, m *metrics.Metrics) (limiter.Limit, error) {
	lim, err := r.Limit.Limiter()
	if err != nil {
		return limiter.Limit{}, err
	}
	er, err := engine.NewRule(p.Name, r.Name, lim, p.Replicas, r.FailureMode == config.FailureClosed, out.Shadow, m)
	if err != nil {
		return limiter.Limit{}, err
	}
	out.Limit = limitOf(er.Limit)
	out.Failure, out.Fallback = failure(er, p.Replicas)
	out.Summary = summary(out.Counter, er.Limit, out.Failure, out.Shadow)
	switch out.ResponseHeaders {
	case config.ResponseHeadersRetryAfter:
		out.Summary += "; answers show Retry-After only"
	case config.ResponseHeadersNone:
		out.Summary += "; answers show no rate-limit fields"
	}
	return lim, nil
}

func descriptorRule(p *config.Policy, r *config.Rule, out Rule, m *metrics.Metrics) (Rule, error) {
	d := r.Match.Descriptors
	var parts []string
	counted := false
	for _, e := range d.Entries {
		switch {
		case e.Value == "":
			parts = append(parts, e.Key+"=any")
			counted = true
		case strings.HasSuffix(e.Value, "*"):
			parts = append(parts, e.Key+"="+e.Value)
			counted = true
		default:
			parts = append(parts, e.Key+"="+e.Value)
		}
	}
	out.Applies = fmt.Sprintf("Envoy rate-limit calls in domain %q with descriptor %s", d.Domain, strings.Join(parts, ", "))
	if len(d.Replaces) > 0 {
		out.Applies += "; replaces " + strings.Join(d.Replaces, ", ")
	}
	out.Counter = "the descriptor"
	if counted {
		out.Counter = "each distinct descriptor value"
	}
	out.Cost = "the call's hits_addend"
	switch {
	case r.Limit.Unlimited:
		out.Failure = "never counted"
		out.Summary = out.Counter + ": unlimited (matches and answers OK without counting)"
		return out, nil
	case r.Limit.Requests == 0:
		out.Failure = "denies without the store"
		out.Summary = out.Counter + ": every call denied (requests_per_unit 0)"
		return out, nil
	}
	if _, err := limited(&out, p, r, m); err != nil {
		return Rule{}, err
	}
	return out, nil
}

func summary(counter string, l limiter.Limit, failure string, shadow bool) string {
	s := counter + ": " + limitWords(l) + "; " + failure
	if shadow {
		s += "; shadow: counted and reported, never denies"
	}
	return s
}

// limitWords is "5 requests per 10 s, burst 5, TokenBucket".
func limitWords(l limiter.Limit) string {
	s := requests(l.Requests) + " per " + rlsimport.Period(l.Period)
	switch {
	case l.MaxDelay > 0:
		s += ", " + strconv.FormatInt(l.Capacity(), 10) + " at once, then delayed up to " + l.MaxDelay.String()
	case l.Algorithm == limiter.TokenBucket || l.Algorithm == limiter.GCRA:
		s += ", burst " + strconv.FormatInt(l.Capacity(), 10)
	}
	return s + ", " + l.Algorithm.String()
}

func limitOf(l limiter.Limit) *Limit {
	out := &Limit{Requests: l.Requests, Per: l.Period.String(), Algorithm: l.Algorithm.String()}
	switch l.Algorithm {
	case limiter.TokenBucket, limiter.GCRA:
		out.Burst = l.Capacity()
	}
	if l.MaxDelay > 0 {
		out.MaxDelay = l.MaxDelay.String()
	}
	return out
}

func failure(er *engine.Rule, replicas int32) (string, *Limit) {
	if er.FailClosed {
		return failClosed, nil
	}
	n := int64(max(replicas, 1))
	l := er.Limit
	l.MaxDelay = 0 // the fallback never delays
	fb := limitOf(l)
	if n == 1 {
		s := fmt.Sprintf("fails open to %s per %s per replica on 1 replica", requests(l.Requests), rlsimport.Period(l.Period))
		if fb.Burst > 0 && fb.Burst != fb.Requests {
			s += fmt.Sprintf(" (burst %d)", fb.Burst)
		}
		return s, fb
	}
	fb.SharedBy = int32(n)
	capacity := l.Capacity()
	if l.Requests%n == 0 {
		// Each replica's share is a whole number of requests per period.
		fb.Requests /= n
		s := fmt.Sprintf("fails open to %s per %s per replica on %d replicas", requests(l.Requests/n), rlsimport.Period(l.Period), n)
		if b := capacity / n; fb.Burst > 0 {
			fb.Burst = max(b, 1)
			if fb.Burst != fb.Requests {
				s += fmt.Sprintf(" (burst %d)", fb.Burst)
			}
		}
		return s, fb
	}
	return fmt.Sprintf("fails open to every %s of the limit's tokens per replica on %d replicas: %s per %s across them",
		ordinal(n), n, requests(l.Requests), rlsimport.Period(l.Period)), fb
}

// ordinal is "2nd", "3rd", "10th".
func ordinal(n int64) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return strconv.FormatInt(n, 10) + suffix
}

func requests(n int64) string {
	return strconv.FormatInt(n, 10) + " " + plural(n, "request", "requests")
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// exempt words the exemptions of a rule and its policy, or "": a request
// from one of the networks, or one for which every condition of a section
// holds, is exempt.
func exempt(sections ...*config.Exempt) string {
	var alternatives []string
	for _, x := range sections {
		if x == nil {
			continue
		}
		if len(x.SourceCIDRs) > 0 {
			alternatives = append(alternatives, "requests from "+strings.Join(x.SourceCIDRs, " or "))
		}
		if len(x.When) > 0 {
			alternatives = append(alternatives, "requests when "+strings.Join(x.When, " and "))
		}
	}
	if len(alternatives) == 0 {
		return ""
	}
	return strings.Join(alternatives, ", or ") + ": never limited, counted as exempt"
}

func cost(c config.Cost, capacity int64) string {
	def := max(c.Default, 1)
	if c.FromHeader == "" {
		return fmt.Sprintf("%d per request", def)
	}
	maximum := c.Max
	if maximum == 0 {
		maximum = capacity
	}
	return fmt.Sprintf("the %s header's value (1 to %d; other values are %s), %d without it", c.FromHeader, maximum, answered400, def)
}

func missingKey(r *config.Rule) string {
	// The client IP, the path and the method are always there: an
	// alternative of those alone (or none) keys every request.
	var names []string
	for _, alt := range r.KeyAlternatives() {
		var parts []string
		for _, k := range alt {
			if k.Header != "" || k.Query != "" || k.JWTClaim != "" || k.Expression != "" {
				parts = append(parts, rlsimport.KeyPart(k))
			}
		}
		if len(parts) == 0 {
			return ""
		}
		names = append(names, strings.Join(parts, " and "))
	}
	without := "requests without " + strings.Join(names, " or ")
	switch r.OnMissingKey {
	case config.OnMissingKeyReject:
		return without + " are " + answered400
	case config.OnMissingKeySkip:
		return without + " are not limited by this rule"
	}
	return without + " share one counter"
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
