package config

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The central rate-limit service and the request descriptor.
//
// A RateLimitPolicy with a targetRef (a Gateway API HTTPRoute or Gateway)
// is enforced by the gateway, which asks floodgate's central rate-limit
// service (floodgate-sidecar with --grpc-listen, the floodgate-ratelimit
// Deployment) about each request with Envoy's rate-limit API. floodgate-
// manager compiles every such policy of the cluster into one document, in
// the ConfigMap RateLimitServiceConfigMapName of the central service's
// namespace, with the same schema as a namespace's document; the central
// service watches it as sidecars watch theirs.
//
// The gateway describes the request in one descriptor, a request
// descriptor, whose first entry is (PolicyEntryKey, "<namespace>/<name>")
// and whose other entries carry the request: AuthorityEntryKey,
// MethodEntryKey and PathEntryKey (Envoy's pseudo-headers, the path with
// its query), RemoteAddressEntryKey (the client address as the gateway
// resolved it: Envoy's remote_address action), and one entry per request
// header the policy reads, keyed by the header's lower-case name. The
// central service rebuilds the request from it and decides it on the
// named policy's rules exactly as a sidecar decides an HTTP request: the
// same path cleaning, matching, key parts, cost and onMissingKey. The
// call's domain is not used; floodgate's generated gateway configuration
// sends GatewayDomain.
const (
	// RateLimitServiceConfigMapName is the ConfigMap, in the central
	// rate-limit service's namespace, that holds the compiled policies
	// that target gateways, under DataKey.
	RateLimitServiceConfigMapName = "floodgate-ratelimit-policies"
	// RateLimitServiceStoreAuthSecret is the copy, in the central
	// service's namespace, of the password of the store its document
	// names, under StoreAuthKey.
	RateLimitServiceStoreAuthSecret = "floodgate-ratelimit-store-auth"
	// GatewayDomain is the rate-limit domain of floodgate's generated
	// gateway configuration.
	GatewayDomain = "floodgate"
	// PolicyEntryKey keys the first entry of a request descriptor; its
	// value is the policy's "<namespace>/<name>".
	PolicyEntryKey = "floodgate.policy"
	// AuthorityEntryKey carries the request's host (:authority, or Host).
	AuthorityEntryKey = ":authority"
	// MethodEntryKey carries the request method.
	MethodEntryKey = ":method"
	// PathEntryKey carries the request path with its query string.
	PathEntryKey = ":path"
	// RemoteAddressEntryKey carries the client address, an IP address.
	RemoteAddressEntryKey = "remote_address"
	// MaxRequestDescriptorHeaders bounds the distinct request headers a
	// policy enforced at a gateway may read: each is an entry of every
	// request descriptor, beside the five fixed ones.
	MaxRequestDescriptorHeaders = 24
)

// PolicyEntryValue is the value of a request descriptor's first entry for
// a policy: "<namespace>/<name>".
func PolicyEntryValue(namespace, name string) string { return namespace + "/" + name }

// RequestHeaders returns the request headers, in canonical form and in
// the order the policy first names them, that policy p's HTTP rules read:
// match.headers, the headers that conditions (the policy's and the rules'
// exempt.when, match.when) and key expressions read by name, header key
// parts in key and keys, cost.fromHeader, and the JWT header when a key
// part or an expression reads claims. A gateway must send each of them in
// the request descriptor for the rules to see what a sidecar would see.
// The error names the first expression that reads request.headers other
// than by a literal name (or does not compile): no list covers it.
func RequestHeaders(p *Policy) ([]string, error) {
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
	claims := func() {
		if p.JWT != nil {
			add(cmpOr(p.JWT.Header, "Authorization"))
		}
	}
	var errs []error
	expr := func(path, src string, kind ExpressionKind) {
		e, err := CompileExpression(src, kind)
		if err == nil && e.AnyHeader {
			err = errors.New("reads request.headers other than by a literal name, so no list of headers covers it")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			return
		}
		for _, h := range e.Headers {
			add(h)
		}
		if e.Claims {
			claims()
		}
	}
	exprs := func(path string, srcs []string, kind ExpressionKind) {
		for i, src := range srcs {
			expr(fmt.Sprintf("%s[%d]", path, i), src, kind)
		}
	}
	if p.Exempt != nil {
		exprs("exempt.when", p.Exempt.When, Condition)
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		if r.Match.Descriptors != nil {
			continue
		}
		rp := fmt.Sprintf("rules[%d]", i)
		for _, h := range r.Match.Headers {
			add(h.Name)
		}
		exprs(rp+".match.when", r.Match.When, Condition)
		parts := func(path string, ks []KeyPart) {
			for j, k := range ks {
				add(k.Header)
				if k.JWTClaim != "" {
					claims()
				}
				if k.Expression != "" {
					expr(fmt.Sprintf("%s[%d].expression", path, j), k.Expression, KeyValue)
				}
			}
		}
		parts(rp+".key", r.Key)
		for j, alt := range r.Keys {
			parts(fmt.Sprintf("%s.keys[%d]", rp, j), alt)
		}
		add(r.Cost.FromHeader)
		if r.Exempt != nil {
			exprs(rp+".exempt.when", r.Exempt.When, Condition)
		}
	}
	return out, errors.Join(errs...)
}

// HeaderEntryKey is the request descriptor entry key of a request header:
// its lower-case name, as HTTP/2 and Envoy spell it.
func HeaderEntryKey(header string) string { return strings.ToLower(header) }

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// RateLimitServicePodLabel is set to "true" on the pods of the central
// rate-limit service (the chart's floodgate-ratelimit Deployment).
// floodgate-manager reads the policy-loaded condition of these pods for
// the Programmed condition of policies with a targetRef, and counts the
// ready ones for a fail-open rule's local share.
const RateLimitServicePodLabel = "floodgate.dev/ratelimit-service"

// Gateway identities.
//
// When the central rate-limit service authenticates its callers
// (floodgate-sidecar --grpc-client-ca-file), each gateway presents a
// client certificate whose URI SAN is GatewayIdentity of the Gateway
// (floodgate-manager issues them, see docs/gateways.md), and a request
// descriptor is honoured only from a gateway its policy lists in
// Policy.Gateways.
const (
	// GatewayIdentityPrefix starts every gateway identity:
	// spiffe://floodgate.dev/ns/<namespace>/gateway/<name>.
	GatewayIdentityPrefix = "spiffe://" + GatewayTrustDomain + "/ns/"
	// GatewayTrustDomain is the SPIFFE trust domain of the identities.
	GatewayTrustDomain = "floodgate.dev"
)

// GatewayRef names a Gateway in Policy.Gateways: "<namespace>/<name>".
func GatewayRef(namespace, name string) string { return namespace + "/" + name }

// ParseGatewayRef splits a GatewayRef and checks its parts: a namespace
// is a DNS label, a name a DNS subdomain, as Kubernetes has them.
func ParseGatewayRef(ref string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(ref, "/")
	if !ok {
		return "", "", fmt.Errorf("must be <namespace>/<name>, got %q", ref)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", "", fmt.Errorf("namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("name %q: %s", name, strings.Join(errs, "; "))
	}
	return namespace, name, nil
}

// GatewayIdentity is the URI that a gateway's client certificate names it
// by: spiffe://floodgate.dev/ns/<namespace>/gateway/<name>.
func GatewayIdentity(namespace, name string) string {
	return GatewayIdentityPrefix + namespace + "/gateway/" + name
}

// GatewayOf returns the GatewayRef that a certificate's URI SANs name, or
// false when none is a gateway identity, or several name different ones.
func GatewayOf(uris []*url.URL) (string, bool) {
	ref := ""
	for _, u := range uris {
		if u == nil || u.Scheme != "spiffe" || u.Host != GatewayTrustDomain || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			continue
		}
		rest, ok := strings.CutPrefix(u.Path, "/ns/")
		if !ok {
			continue
		}
		ns, name, ok := strings.Cut(rest, "/gateway/")
		if !ok {
			continue
		}
		r := GatewayRef(ns, name)
		if _, _, err := ParseGatewayRef(r); err != nil {
			continue
		}
		if ref != "" && ref != r {
			return "", false
		}
		ref = r
	}
	return ref, ref != ""
}

// validateGateways checks a policy's Gateways at path.
func validateGateways(path string, gws []string, errs *errList) {
	if len(gws) > MaxGateways {
		errs.add(path, "at most %d gateways, got %d", MaxGateways, len(gws))
	}
	for i, g := range gws {
		p := fmt.Sprintf("%s[%d]", path, i)
		if _, _, err := ParseGatewayRef(g); err != nil {
			errs.add(p, "%v", err)
		} else if i > 0 && g <= gws[i-1] {
			errs.add(p, "gateways must be sorted and unique: %q follows %q", g, gws[i-1])
		}
	}
}
