package compiler

import (
	"slices"
	"strings"

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
	sel := p.Spec.PodSelector
	if len(sel.MatchLabels) > 0 || len(sel.MatchExpressions) > 0 {
		out.PodSelector = sel.DeepCopy()
		if len(out.PodSelector.MatchLabels) == 0 {
			out.PodSelector.MatchLabels = nil
		}
		if len(out.PodSelector.MatchExpressions) == 0 {
			out.PodSelector.MatchExpressions = nil
		}
	}
	if tp := p.Spec.TrustedProxies; tp != nil {
		out.TrustedProxies = &config.TrustedProxies{Hops: tp.Hops}
		for _, c := range tp.CIDRs {
			out.TrustedProxies.CIDRs = append(out.TrustedProxies.CIDRs, string(c))
		}
	}
	if j := p.Spec.JWT; j != nil {
		out.JWT = &config.JWT{
			Header:           j.Header,
			Issuer:           j.Issuer,
			Audience:         j.Audience,
			UpstreamVerified: j.UpstreamVerified,
		}
		if ref := j.HMACSecretRef; ref != nil {
			out.JWT.HMACSecretFile = SecretFile(ref.Name, ref.Key)
		}
		if ref := j.JWKSConfigMapRef; ref != nil {
			out.JWT.JWKSFile = ConfigMapFile(ref.Name, ref.Key)
		}
	}
	for i := range p.Spec.Rules {
		out.Rules = append(out.Rules, compileRule(&p.Spec.Rules[i]))
	}
	return out
}

func compileRule(r *v1alpha1.Rule) config.Rule {
	out := config.Rule{
		Name:         r.Name,
		Key:          make([]config.KeyPart, 0, len(r.Key)),
		OnMissingKey: or(string(r.OnMissingKey), config.OnMissingKeySkip),
		Limit: config.Limit{
			Requests:  r.Limit.Requests,
			Per:       metav1.Duration{Duration: r.Limit.Per.Duration},
			Burst:     r.Limit.Burst,
			Algorithm: or(string(r.Limit.Algorithm), string(v1alpha1.AlgorithmTokenBucket)),
		},
		Cost:        config.Cost{Default: 1},
		FailureMode: or(string(r.FailureMode), config.FailureOpen),
		Mode:        or(string(r.Mode), config.ModeEnforce),
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
			out.Match.Headers = append(out.Match.Headers, config.HeaderMatch{Name: h.Name, Value: h.Value})
		}
		for _, h := range m.Hosts {
			out.Match.Hosts = append(out.Match.Hosts, strings.ToLower(string(h)))
		}
		// A set, like methods.
		slices.Sort(out.Match.Hosts)
		out.Match.Hosts = slices.Compact(out.Match.Hosts)
	}
	for _, k := range r.Key {
		out.Key = append(out.Key, compileKeyPart(k))
	}
	if c := r.Cost; c != nil {
		out.Cost = config.Cost{FromHeader: c.FromHeader, Default: max(c.Default, 1), Max: c.Max}
	}
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
		out.ClientIP = &struct{}{}
	case k.JWTClaim != "":
		out.JWTClaim = k.JWTClaim
	case k.Path != nil:
		out.Path = &struct{}{}
	case k.Method != nil:
		out.Method = &struct{}{}
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
