package compiler

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// compilePolicy translates one accepted policy. Every defaulted field is
// written out, so the document says exactly what the sidecars enforce even
// when the input skipped the API server's defaulting.
func compilePolicy(p *v1alpha1.RateLimitPolicy, replicas int32) config.Policy {
	out := config.Policy{
		Name:       p.Name,
		Namespace:  p.Namespace,
		UID:        string(p.UID),
		Generation: p.Generation,
		Replicas:   replicas,
		Rules:      make([]config.Rule, 0, len(p.Spec.Rules)),
	}
	out.PodSelector = compileSelector(p.Spec.PodSelector)
	out.TrustedProxies = compileTrustedProxies(p.Spec.TrustedProxies)
	if j := p.Spec.JWT; j != nil {
		out.JWT = &config.JWT{
			Header:           j.Header,
			Issuer:           j.Issuer,
			Audience:         j.Audience,
			UpstreamVerified: j.UpstreamVerified,
			OnInvalidToken:   or(string(j.OnInvalidToken), config.OnInvalidTokenReject),
		}
		if ref := j.HMACSecretRef; ref != nil {
			out.JWT.HMACSecretFile = SecretFile(ref.Name, ref.Key)
		}
		if ref := j.JWKSConfigMapRef; ref != nil {
			out.JWT.JWKSFile = ConfigMapFile(ref.Name, ref.Key)
		}
	}
	out.Exempt = compileExempt(p.Spec.Exempt)
	for i := range p.Spec.Rules {
		out.Rules = append(out.Rules, compileRule(&p.Spec.Rules[i]))
	}
	out.LoadShedding = compileLoadShedding(p.Spec.LoadShedding)
	return out
}

// compileSelector is a selector as the compiled document holds it: nil
// for the empty selector, which selects every pod.
func compileSelector(sel metav1.LabelSelector) *metav1.LabelSelector {
	if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
		return nil
	}
	out := sel.DeepCopy()
	if len(out.MatchLabels) == 0 {
		out.MatchLabels = nil
	}
	if len(out.MatchExpressions) == 0 {
		out.MatchExpressions = nil
	}
	return out
}

func compileTrustedProxies(tp *v1alpha1.TrustedProxies) *config.TrustedProxies {
	if tp == nil {
		return nil
	}
	out := &config.TrustedProxies{Hops: tp.Hops, Header: tp.Header}
	for _, c := range tp.CIDRs {
		out.CIDRs = append(out.CIDRs, string(c))
	}
	return out
}

func compileExempt(x *v1alpha1.Exempt) *config.Exempt {
	if x == nil {
		return nil
	}
	return &config.Exempt{SourceCIDRs: cidrs(x.SourceCIDRs), When: expressions(x.When)}
}

func cidrs(in []v1alpha1.CIDR) []string {
	if len(in) == 0 {
		return nil
	}
	out := make([]string, 0, len(in))
	for _, c := range in {
		out = append(out, string(c))
	}
	return out
}

func expressions(in []v1alpha1.Expression) []string {
	if len(in) == 0 {
		return nil
	}
	out := make([]string, 0, len(in))
	for _, e := range in {
		out = append(out, string(e))
	}
	return out
}

func compileRule(r *v1alpha1.Rule) config.Rule {
	out := config.Rule{
		Name:         r.Name,
		Key:          make([]config.KeyPart, 0, len(r.Key)),
		OnMissingKey: or(string(r.OnMissingKey), config.OnMissingKeyShared),
		Limit: config.Limit{
			Requests:  r.Limit.Requests,
			Per:       metav1.Duration{Duration: r.Limit.Per.Duration},
			Burst:     r.Limit.Burst,
			Algorithm: or(string(r.Limit.Algorithm), string(v1alpha1.AlgorithmTokenBucket)),
			Lease:     string(r.Limit.Lease),
			Split:     r.Limit.Split,
		},
		Cost:        config.Cost{Default: 1},
		FailureMode: or(string(r.FailureMode), config.FailureOpen),
		Mode:        or(string(r.Mode), config.ModeEnforce),
	}
	if r.ResponseHeaders != v1alpha1.ResponseHeadersFull {
		// Full is the default: unset and Full make one document.
		out.ResponseHeaders = string(r.ResponseHeaders)
	}
	if m := r.Match; m != nil {
		if m.Path != nil {
			out.Match.Path = &config.PathMatch{
				Type:  or(string(m.Path.Type), config.PathPrefix),
				Value: m.Path.Value,
			}
		}
		for _, meth := range m.Methods {
			out.Match.Methods = append(out.Match.Methods, string(meth))
		}
		// Methods are a set: their order carries no meaning, so sort
		// it away from the document.
		slices.Sort(out.Match.Methods)
		for _, h := range m.Headers {
			out.Match.Headers = append(out.Match.Headers, config.HeaderMatch{
				Name: h.Name, Value: h.Value, Regex: h.Regex, Absent: h.Absent, Invert: h.Invert})
		}
		for _, q := range m.Query {
			out.Match.Query = append(out.Match.Query, config.QueryMatch{
				Name: q.Name, Value: q.Value, Regex: q.Regex, Absent: q.Absent, Invert: q.Invert})
		}
		// Hosts and networks are sets too.
		for _, h := range m.Hosts {
			out.Match.Hosts = append(out.Match.Hosts, string(h))
		}
		slices.Sort(out.Match.Hosts)
		out.Match.SourceCIDRs = cidrs(m.SourceCIDRs)
		slices.Sort(out.Match.SourceCIDRs)
		out.Match.When = expressions(m.When)
	}
	out.Exempt = compileExempt(r.Exempt)
	for _, k := range r.Key {
		out.Key = append(out.Key, compileKeyPart(k))
	}
	for _, alt := range r.Keys {
		parts := make([]config.KeyPart, 0, len(alt))
		for _, k := range alt {
			parts = append(parts, compileKeyPart(k))
		}
		out.Keys = append(out.Keys, parts)
	}
	if c := r.Cost; c != nil {
		out.Cost = config.Cost{FromHeader: c.FromHeader, Default: max(c.Default, 1), Max: c.Max}
	}
	if r.Limit.Delays() {
		// A Delay rule is metered with GCRA, whatever of TokenBucket and
		// GCRA it names; a Deny rule writes none of the Delay fields, so
		// its document is what it was before they existed.
		out.Limit.Algorithm = string(v1alpha1.AlgorithmGCRA)
		out.Limit.OnExceed = config.OnExceedDelay
		out.Limit.MaxDelay = metav1.Duration{Duration: r.Limit.MaxDelay.Duration}
		out.Limit.DelayAfter = max(r.Limit.DelayAfter, 1)
	}
	compileKind(r, &out)
	return out
}

func compileKeyPart(k v1alpha1.KeyPart) config.KeyPart {
	var out config.KeyPart
	switch {
	case k.Header != "":
		out.Header = k.Header
	case k.Query != "":
		out.Query = k.Query
	case k.ClientIP != nil:
		out.ClientIP = &config.ClientIPKey{IPv4PrefixLength: k.ClientIP.IPv4PrefixLength, IPv6PrefixLength: k.ClientIP.IPv6PrefixLength}
	case k.JWTClaim != "":
		out.JWTClaim = k.JWTClaim
	case k.Path != nil:
		out.Path = &struct{}{}
	case k.Method != nil:
		out.Method = &struct{}{}
	case k.Expression != "":
		out.Expression = string(k.Expression)
	}
	return out
}

// or returns v, or def when v is empty.
func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
