package v1alpha1

import (
	"fmt"
	"net/netip"
	"regexp"

	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// The bounds of a RateLimitPolicy. Those the sidecar has too come from its
// packages, so that the API accepts what a sidecar loads; the CRD's markers
// must hold them as literals, and TestCRDMarkersHoldTheBounds fails when a
// marker and its constant disagree.
const (
	// maxRules bounds spec.rules.
	maxRules = 64
	// maxKeyParts bounds a rule's key.
	maxKeyParts = config.MaxKeyParts
	// maxHeaderMatches bounds a rule's match.headers.
	maxHeaderMatches = 16
	// maxPathLength bounds match.path.value, as the sidecar bounds a
	// regular expression.
	maxPathLength = config.MaxRegexLength
	// maxTrustedCIDRs bounds trustedProxies.cidrs.
	maxTrustedCIDRs = 64
	// maxHops bounds trustedProxies.hops.
	maxHops = config.MaxHops
)

// literalPath is what an Exact or Prefix path value may hold. It mirrors the
// CEL rule on PathMatch.
var literalPath = regexp.MustCompile(`^/[-A-Za-z0-9/._~!$&()+,;=:@%]*$`)

// headerName is an HTTP header field name (an RFC 9110 token). It mirrors
// the schema pattern on header fields.
var headerName = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_|~-]+$")

// ValidateSemantics reports every problem with the policy's spec at once,
// each with its field path. It covers the checks the CRD schema and CEL
// rules cannot make (a regular expression that does not compile, a label
// selector with a bad operator or value) and repeats the others, so that
// an object stored before a schema change, or built in Go, is held to the
// same rules. It is pure and safe for concurrent use; the policy
// controller calls it before compiling, and a validating webhook can call
// it at admission.
func (p *RateLimitPolicy) ValidateSemantics() field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList

	errs = append(errs, metav1validation.ValidateLabelSelector(&p.Spec.PodSelector,
		metav1validation.LabelSelectorValidationOptions{}, spec.Child("podSelector"))...)

	if ref := p.Spec.StoreRef; ref != nil {
		for _, msg := range validation.IsDNS1123Label(ref.Name) {
			errs = append(errs, field.Invalid(spec.Child("storeRef", "name"), ref.Name, msg))
		}
	}

	rules := spec.Child("rules")
	switch n := len(p.Spec.Rules); {
	case n == 0:
		errs = append(errs, field.Required(rules, "at least one rule is required"))
	case n > maxRules:
		errs = append(errs, field.TooMany(rules, n, maxRules))
	}
	seen := make(map[string]bool, len(p.Spec.Rules))
	usesJWT := false
	for i := range p.Spec.Rules {
		r := &p.Spec.Rules[i]
		path := rules.Index(i)
		if seen[r.Name] {
			errs = append(errs, field.Duplicate(path.Child("name"), r.Name))
		}
		seen[r.Name] = true
		errs = append(errs, validateRule(r, path)...)
		for _, k := range r.Key {
			if k.JWTClaim != "" {
				usesJWT = true
			}
		}
	}

	if tp := p.Spec.TrustedProxies; tp != nil {
		errs = append(errs, validateTrustedProxies(tp, spec.Child("trustedProxies"))...)
	}
	errs = append(errs, p.validateTarget(spec)...)
	if p.Spec.JWT != nil {
		errs = append(errs, validateJWT(p.Spec.JWT, spec.Child("jwt"))...)
	} else if usesJWT {
		errs = append(errs, field.Required(spec.Child("jwt"),
			"jwt must be set when a rule keys on a jwtClaim, so that tokens are verified before their claims count"))
	}
	return errs
}

func validateRule(r *Rule, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(r.Name) {
		errs = append(errs, field.Invalid(path.Child("name"), r.Name, msg))
	}
	if r.Match != nil {
		errs = append(errs, validateMatch(r.Match, path.Child("match"))...)
	}

	keyPath := path.Child("key")
	switch n := len(r.Key); {
	case n == 0:
		errs = append(errs, field.Required(keyPath, "at least one key part is required"))
	case n > maxKeyParts:
		errs = append(errs, field.TooMany(keyPath, n, maxKeyParts))
	}
	for i, k := range r.Key {
		errs = append(errs, validateKeyPart(k, keyPath.Index(i))...)
	}

	errs = append(errs, enumValue(path.Child("onMissingKey"), string(r.OnMissingKey),
		OnMissingKeySkip, OnMissingKeyShared, OnMissingKeyReject)...)
	errs = append(errs, enumValue(path.Child("failureMode"), string(r.FailureMode),
		FailureModeOpen, FailureModeClosed)...)
	errs = append(errs, enumValue(path.Child("mode"), string(r.Mode), ModeEnforce, ModeShadow)...)

	errs = append(errs, validateLimit(r.Limit, path.Child("limit"))...)
	if r.Cost != nil {
		errs = append(errs, validateCost(r.Cost, r.Limit.Capacity(), path.Child("cost"))...)
	}
	return errs
}

// enumValue checks that v is empty (the default applies) or one of allowed.
func enumValue[T ~string](path *field.Path, v string, allowed ...T) field.ErrorList {
	if v == "" {
		return nil
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		if string(a) == v {
			return nil
		}
		names[i] = string(a)
	}
	return field.ErrorList{field.NotSupported(path, v, names)}
}

func validateMatch(m *RuleMatch, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if pm := m.Path; pm != nil {
		valuePath := path.Child("path", "value")
		switch {
		case pm.Value == "":
			errs = append(errs, field.Required(valuePath, "a path or pattern is required"))
		case len(pm.Value) > maxPathLength:
			errs = append(errs, field.TooLong(valuePath, pm.Value, maxPathLength))
		}
		switch pm.Type {
		case PathMatchRegularExpression:
			if _, err := regexp.Compile(pm.Value); err != nil {
				errs = append(errs, field.Invalid(valuePath, pm.Value,
					fmt.Sprintf("not a valid RE2 regular expression: %v", err)))
			}
		case "", PathMatchExact, PathMatchPrefix:
			if pm.Value != "" && !literalPath.MatchString(pm.Value) {
				errs = append(errs, field.Invalid(valuePath, pm.Value,
					"must be a literal absolute path (a leading / and no pattern characters such as * ^ | [ ] { } ?) when type is Exact or Prefix; use type RegularExpression for a pattern"))
			}
		default:
			errs = append(errs, field.NotSupported(path.Child("path", "type"), pm.Type,
				[]PathMatchType{PathMatchExact, PathMatchPrefix, PathMatchRegularExpression}))
		}
	}
	methods := []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}
	seen := map[HTTPMethod]bool{}
	for i, meth := range m.Methods {
		if seen[meth] {
			errs = append(errs, field.Duplicate(path.Child("methods").Index(i), meth))
		}
		seen[meth] = true
		errs = append(errs, enumValue(path.Child("methods").Index(i), string(meth), methods...)...)
	}
	if n := len(m.Headers); n > maxHeaderMatches {
		errs = append(errs, field.TooMany(path.Child("headers"), n, maxHeaderMatches))
	}
	for i, h := range m.Headers {
		if !headerName.MatchString(h.Name) {
			errs = append(errs, field.Invalid(path.Child("headers").Index(i).Child("name"), h.Name,
				"must be an HTTP header name"))
		}
	}
	return errs
}

func validateKeyPart(k KeyPart, path *field.Path) field.ErrorList {
	set := 0
	for _, ok := range []bool{k.Header != "", k.Query != "", k.ClientIP != nil, k.JWTClaim != "", k.Path != nil, k.Method != nil} {
		if ok {
			set++
		}
	}
	var errs field.ErrorList
	if set != 1 {
		errs = append(errs, field.Invalid(path, set,
			"exactly one of header, query, clientIP, jwtClaim, path or method must be set in each key part"))
	}
	if k.Header != "" && !headerName.MatchString(k.Header) {
		errs = append(errs, field.Invalid(path.Child("header"), k.Header, "must be an HTTP header name"))
	}
	return errs
}

// algorithms are the Algorithm values, for NotSupported errors.
var algorithms = []Algorithm{AlgorithmTokenBucket, AlgorithmGCRA, AlgorithmSlidingWindow, AlgorithmFixedWindow, AlgorithmSlidingLog}

// validateLimit runs the sidecar's own limit check (config.Limit.Check,
// which is limiter.Limit.Validate) on l, so that the API accepts exactly
// the limits a sidecar loads: bounds, SlidingLog's size, whole
// microseconds, and buckets that refill in time.
func validateLimit(l Limit, path *field.Path) field.ErrorList {
	_, problems := config.Limit{Requests: l.Requests, Per: l.Per, Burst: l.Burst, Algorithm: string(l.Algorithm)}.Check()
	var errs field.ErrorList
	for _, p := range problems {
		switch p.Path {
		case "algorithm":
			errs = append(errs, field.NotSupported(path.Child("algorithm"), l.Algorithm, algorithms))
		case "requests":
			errs = append(errs, field.Invalid(path.Child("requests"), l.Requests, p.Msg))
		case "per":
			errs = append(errs, field.Invalid(path.Child("per"), l.Per.Duration.String(), p.Msg))
		case "burst":
			errs = append(errs, field.Invalid(path.Child("burst"), l.Burst, p.Msg))
		default:
			errs = append(errs, field.Invalid(path, field.OmitValueType{}, p.Msg))
		}
	}
	return errs
}

func validateCost(c *Cost, capacity int64, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.FromHeader != "" && !headerName.MatchString(c.FromHeader) {
		errs = append(errs, field.Invalid(path.Child("fromHeader"), c.FromHeader, "must be an HTTP header name"))
	}
	if c.Default < 0 {
		errs = append(errs, field.Invalid(path.Child("default"), c.Default, "must be at least 1"))
	} else if c.Default > capacity {
		errs = append(errs, field.Invalid(path.Child("default"), c.Default,
			"cost.default must not exceed the rule's capacity (limit.burst, or limit.requests when burst is unset), or every request would be denied"))
	}
	if c.Max < 0 {
		errs = append(errs, field.Invalid(path.Child("max"), c.Max, "must be at least 1"))
	}
	if c.Max > 0 {
		if c.FromHeader == "" {
			errs = append(errs, field.Invalid(path.Child("max"), c.Max, "max bounds a header-supplied cost, so it needs fromHeader"))
		}
		if c.Max > capacity {
			errs = append(errs, field.Invalid(path.Child("max"), c.Max,
				"cost.max must not exceed the rule's capacity (limit.burst, or limit.requests when burst is unset)"))
		}
		if c.Default > c.Max {
			errs = append(errs, field.Invalid(path.Child("default"), c.Default, "default must not exceed max"))
		}
	}
	return errs
}

func validateTrustedProxies(tp *TrustedProxies, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(tp.CIDRs) == 0 && tp.Hops == 0 {
		errs = append(errs, field.Required(path, "set cidrs, hops, or both"))
	}
	if n := len(tp.CIDRs); n > maxTrustedCIDRs {
		errs = append(errs, field.TooMany(path.Child("cidrs"), n, maxTrustedCIDRs))
	}
	seen := map[CIDR]bool{}
	for i, c := range tp.CIDRs {
		p := path.Child("cidrs").Index(i)
		if seen[c] {
			errs = append(errs, field.Duplicate(p, c))
		}
		seen[c] = true
		prefix, err := netip.ParsePrefix(string(c))
		if err != nil || prefix.Masked() != prefix {
			errs = append(errs, field.Invalid(p, c, "must be a CIDR with no host bits set, such as 10.0.0.0/8 or fd00::/8"))
		}
	}
	if tp.Hops < 0 || tp.Hops > maxHops {
		errs = append(errs, field.Invalid(path.Child("hops"), tp.Hops, fmt.Sprintf("must be between 0 and %d", maxHops)))
	}
	return errs
}

func validateJWT(j *JWT, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	set := 0
	for _, ok := range []bool{j.HMACSecretRef != nil, j.JWKSConfigMapRef != nil, j.UpstreamVerified} {
		if ok {
			set++
		}
	}
	if set != 1 {
		errs = append(errs, field.Invalid(path, set,
			"set exactly one of hmacSecretRef, jwksConfigMapRef, or upstreamVerified: true"))
	}
	if j.Header != "" && !headerName.MatchString(j.Header) {
		errs = append(errs, field.Invalid(path.Child("header"), j.Header, "must be an HTTP header name"))
	}
	refs := []struct {
		name string
		ref  *KeyReference
	}{{"hmacSecretRef", j.HMACSecretRef}, {"jwksConfigMapRef", j.JWKSConfigMapRef}}
	for _, r := range refs {
		name, ref := r.name, r.ref
		if ref == nil {
			continue
		}
		for _, msg := range validation.IsDNS1123Subdomain(ref.Name) {
			errs = append(errs, field.Invalid(path.Child(name, "name"), ref.Name, msg))
		}
		for _, msg := range validation.IsConfigMapKey(ref.Key) {
			errs = append(errs, field.Invalid(path.Child(name, "key"), ref.Key, msg))
		}
	}
	return errs
}
