package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// validateTarget reports what a policy with a targetRef cannot hold: a
// gateway sends the central rate-limit service the request's method, path,
// host, client address (as the gateway resolved it) and the headers the
// policy reads, so everything the policy needs must come from those.
func (p *RateLimitPolicy) validateTarget(spec *field.Path) field.ErrorList {
	t := p.Spec.TargetRef
	if t == nil {
		return nil
	}
	path := spec.Child("targetRef")
	var errs field.ErrorList
	sel := p.Spec.PodSelector
	if len(sel.MatchLabels) > 0 || len(sel.MatchExpressions) > 0 {
		errs = append(errs, field.Forbidden(spec.Child("podSelector"),
			"set exactly one of podSelector and targetRef: a policy with a targetRef is enforced by its gateway, not by pods"))
	}
	if t.Group != GatewayAPIGroup {
		errs = append(errs, field.NotSupported(path.Child("group"), t.Group, []string{GatewayAPIGroup}))
	}
	if t.Kind != KindHTTPRoute && t.Kind != KindGRPCRoute && t.Kind != KindGateway {
		errs = append(errs, field.NotSupported(path.Child("kind"), t.Kind, []string{KindHTTPRoute, KindGRPCRoute, KindGateway}))
	}
	for _, msg := range validation.IsDNS1123Subdomain(t.Name) {
		errs = append(errs, field.Invalid(path.Child("name"), t.Name, msg))
	}
	if t.SectionName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(t.SectionName) {
			errs = append(errs, field.Invalid(path.Child("sectionName"), t.SectionName, msg))
		}
	}
	if p.Spec.TrustedProxies != nil {
		errs = append(errs, field.Forbidden(spec.Child("trustedProxies"),
			"not used with targetRef: the gateway resolves the client address (X-Forwarded-For and its trusted hops) and sends it; configure the trusted hops on the gateway"))
	}
	if j := p.Spec.JWT; j != nil && !j.UpstreamVerified {
		errs = append(errs, field.Forbidden(spec.Child("jwt"),
			"with targetRef, only upstreamVerified: true is supported: the gateway verifies tokens (for example Istio's RequestAuthentication or Envoy Gateway's SecurityPolicy) and the central rate-limit service reads their claims"))
	}
	if p.Spec.LoadShedding != nil {
		errs = append(errs, field.Forbidden(spec.Child("loadShedding"),
			"not used with targetRef: the load shedder measures the app behind a sidecar; a gateway's central rate-limit service sees no responses"))
	}
	for i := range p.Spec.Rules {
		r := &p.Spec.Rules[i]
		rp := spec.Child("rules").Index(i)
		if r.Concurrency != nil {
			errs = append(errs, field.Forbidden(rp.Child("concurrency"),
				"not used with targetRef: a concurrency slot is given back when the response ends, which the central rate-limit service never sees; enforce it with the sidecar (podSelector)"))
		}
		if r.Priority != "" {
			errs = append(errs, field.Forbidden(rp.Child("priority"),
				"not used with targetRef: priorities are the sidecar's load shedder's classes"))
		}
		if r.Limit.Delays() {
			errs = append(errs, field.Forbidden(rp.Child("limit", "onExceed"),
				"onExceed: Delay cannot go with targetRef: the central rate-limit service answers the gateway allow or deny and cannot hold a request; enforce a Delay rule with sidecars (podSelector)"))
		}
	}
	headers, err := config.RequestHeaders(headerReads(&p.Spec))
	if err != nil {
		// The only error a valid spec can give: an expression that reads
		// request.headers other than by name.
		errs = append(errs, field.Forbidden(spec, fmt.Sprintf(
			"with targetRef, conditions and key expressions may read request.headers only by a literal name, such as request.headers['x-tier'], because the gateway sends the headers a policy names and no others: %v", err)))
	}
	if n := len(headers); n > config.MaxRequestDescriptorHeaders {
		errs = append(errs, field.Invalid(spec.Child("rules"), n, fmt.Sprintf(
			"a policy with a targetRef may read at most %d distinct request headers (in match.headers, conditions, key, keys, key expressions, cost.fromHeader and jwt.header), which the gateway sends with each request; this one reads %d",
			config.MaxRequestDescriptorHeaders, n)))
	}
	return errs
}

// headerReads is the part of the spec that says which request headers its
// rules read, in the sidecar's form, for config.RequestHeaders: the one
// list of what a gateway must send.
func headerReads(s *RateLimitPolicySpec) *config.Policy {
	whens := func(es []Expression) []string {
		out := make([]string, len(es))
		for i, e := range es {
			out[i] = string(e)
		}
		return out
	}
	exempt := func(e *Exempt) *config.Exempt {
		if e == nil {
			return nil
		}
		return &config.Exempt{When: whens(e.When)}
	}
	parts := func(ks []KeyPart) []config.KeyPart {
		out := make([]config.KeyPart, len(ks))
		for i, k := range ks {
			out[i] = config.KeyPart{Header: k.Header, JWTClaim: k.JWTClaim, Expression: string(k.Expression)}
		}
		return out
	}
	p := &config.Policy{Exempt: exempt(s.Exempt)}
	if s.JWT != nil {
		p.JWT = &config.JWT{Header: s.JWT.Header}
	}
	for i := range s.Rules {
		r := &s.Rules[i]
		cr := config.Rule{Name: r.Name, Key: parts(r.Key), Exempt: exempt(r.Exempt)}
		for _, alt := range r.Keys {
			cr.Keys = append(cr.Keys, parts(alt))
		}
		if m := r.Match; m != nil {
			for _, h := range m.Headers {
				cr.Match.Headers = append(cr.Match.Headers, config.HeaderMatch{Name: h.Name})
			}
			cr.Match.When = whens(m.When)
		}
		if r.Cost != nil {
			cr.Cost.FromHeader = r.Cost.FromHeader
		}
		p.Rules = append(p.Rules, cr)
	}
	return p
}
