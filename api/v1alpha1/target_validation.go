package v1alpha1

import (
	"fmt"
	"net/http"

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
	if t.Kind != KindHTTPRoute && t.Kind != KindGateway {
		errs = append(errs, field.NotSupported(path.Child("kind"), t.Kind, []string{KindHTTPRoute, KindGateway}))
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
	}
	if n := len(requestHeaders(&p.Spec)); n > config.MaxRequestDescriptorHeaders {
		errs = append(errs, field.Invalid(spec.Child("rules"), n, fmt.Sprintf(
			"a policy with a targetRef may read at most %d distinct request headers (in match.headers, key, cost.fromHeader and jwt.header), which the gateway sends with each request; this one reads %d",
			config.MaxRequestDescriptorHeaders, n)))
	}
	return errs
}

// requestHeaders returns the distinct request headers, canonical, that the
// policy's rules read.
func requestHeaders(s *RateLimitPolicySpec) []string {
	seen := map[string]bool{}
	var out []string
	add := func(name string) {
		if name == "" {
			return
		}
		c := http.CanonicalHeaderKey(name)
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	for i := range s.Rules {
		r := &s.Rules[i]
		if r.Match != nil {
			for _, h := range r.Match.Headers {
				add(h.Name)
			}
		}
		for _, k := range r.Key {
			add(k.Header)
			if k.JWTClaim != "" && s.JWT != nil {
				add(s.JWT.Header)
				if s.JWT.Header == "" {
					add("Authorization")
				}
			}
		}
		if r.Cost != nil {
			add(r.Cost.FromHeader)
		}
	}
	return out
}
