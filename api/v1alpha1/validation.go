package v1alpha1

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"

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
	// maxKeyParts bounds a key alternative.
	maxKeyParts = config.MaxKeyParts
	// maxKeyAlternatives bounds a rule's keys.
	maxKeyAlternatives = config.MaxKeyAlternatives
	// maxHeaderMatches bounds a rule's match.headers.
	maxHeaderMatches = 16
	// maxPathLength bounds match.path.value, as the sidecar bounds a
	// regular expression.
	maxPathLength = config.MaxRegexLength
	// maxTrustedCIDRs bounds trustedProxies.cidrs.
	maxTrustedCIDRs = 64
	// maxHops bounds trustedProxies.hops.
	maxHops = config.MaxHops
	// maxConditions bounds a when list, maxHosts match.hosts,
	// maxQueryMatches match.query and maxCIDRs a list of client networks,
	// as the sidecar bounds them.
	maxConditions   = config.MaxConditions
	maxHosts        = config.MaxHosts
	maxQueryMatches = config.MaxValueMatches
	maxCIDRs        = config.MaxCIDRs
	// maxClusterRules bounds each rule list of a ClusterRateLimitPolicy.
	maxClusterRules = 32
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
	ctx := &ruleContext{jwt: p.Spec.JWT != nil}
	for i := range p.Spec.Rules {
		r := &p.Spec.Rules[i]
		path := rules.Index(i)
		if seen[r.Name] {
			errs = append(errs, field.Duplicate(path.Child("name"), r.Name))
		}
		seen[r.Name] = true
		errs = append(errs, validateRule(r, path, ctx)...)
		for _, alt := range r.KeyAlternatives() {
			for _, k := range alt {
				if k.JWTClaim != "" {
					usesJWT = true
				}
			}
		}
	}
	if p.Spec.Exempt != nil {
		errs = append(errs, validateExempt(p.Spec.Exempt, spec.Child("exempt"), ctx)...)
	}

	if tp := p.Spec.TrustedProxies; tp != nil {
		errs = append(errs, validateTrustedProxies(tp, spec.Child("trustedProxies"))...)
	}
	if ls := p.Spec.LoadShedding; ls != nil {
		errs = append(errs, validateLoadShedding(ls, spec.Child("loadShedding"))...)
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

// ruleContext is what a rule's validation needs of its policy.
type ruleContext struct {
	// jwt is set when the policy verifies tokens, so expressions may read
	// auth.claims.
	jwt bool
	// noJWT, when set, is why the policy can never verify tokens (a
	// ClusterRateLimitPolicy has no namespace for the keys).
	noJWT string
}

func validateRule(r *Rule, path *field.Path, ctx *ruleContext) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(r.Name) {
		errs = append(errs, field.Invalid(path.Child("name"), r.Name, msg))
	}
	if r.Match != nil {
		errs = append(errs, validateMatch(r.Match, path.Child("match"), ctx)...)
	}
	if r.Exempt != nil {
		errs = append(errs, validateExempt(r.Exempt, path.Child("exempt"), ctx)...)
	}

	keyPath := path.Child("key")
	if n := len(r.Key); n > maxKeyParts {
		errs = append(errs, field.TooMany(keyPath, n, maxKeyParts))
	}
	for i, k := range r.Key {
		errs = append(errs, validateKeyPart(k, keyPath.Index(i), ctx)...)
	}
	keysPath := path.Child("keys")
	if r.Keys != nil && len(r.Key) > 0 {
		errs = append(errs, field.Invalid(keysPath, field.OmitValueType{}, "set key or keys, not both: key is one alternative, keys a list of them"))
	}
	switch n := len(r.Keys); {
	case r.Keys != nil && n == 0:
		errs = append(errs, field.Required(keysPath, "at least one alternative; omit keys for a rule without a key"))
	case n > maxKeyAlternatives:
		errs = append(errs, field.TooMany(keysPath, n, maxKeyAlternatives))
	}
	for a, alt := range r.Keys {
		altPath := keysPath.Index(a)
		if n := len(alt); n > maxKeyParts {
			errs = append(errs, field.TooMany(altPath, n, maxKeyParts))
		}
		if len(alt) == 0 && a < len(r.Keys)-1 {
			errs = append(errs, field.Invalid(altPath, field.OmitValueType{},
				"an empty alternative keys every request, so the alternatives after it would never be used: it may only be the last"))
		}
		for i, k := range alt {
			errs = append(errs, validateKeyPart(k, altPath.Index(i), ctx)...)
		}
	}

	errs = append(errs, enumValue(path.Child("onMissingKey"), string(r.OnMissingKey),
		OnMissingKeyShared, OnMissingKeyReject, OnMissingKeySkip)...)
	errs = append(errs, enumValue(path.Child("failureMode"), string(r.FailureMode),
		FailureModeOpen, FailureModeClosed)...)
	errs = append(errs, enumValue(path.Child("mode"), string(r.Mode), ModeEnforce, ModeShadow)...)
	errs = append(errs, enumValue(path.Child("responseHeaders"), string(r.ResponseHeaders),
		ResponseHeadersFull, ResponseHeadersRetryAfter, ResponseHeadersNone)...)
	if r.ResponseHeaders != "" && r.Limit == (Limit{}) {
		errs = append(errs, field.Invalid(path.Child("responseHeaders"), r.ResponseHeaders,
			"responseHeaders applies to rate limits only: it says which of a rate rule's numbers its answers carry"))
	}

	errs = append(errs, validateRuleKind(r, path)...)
	if r.Limit != (Limit{}) {
		errs = append(errs, validateLimit(r.Limit, path.Child("limit"))...)
		if r.Cost != nil {
			errs = append(errs, validateCost(r.Cost, r.Limit.Capacity()/int64(max(1, r.Limit.Split)), path.Child("cost"))...)
		}
		if r.Limit.Delays() && r.Mode == ModeShadow {
			errs = append(errs, field.Invalid(path.Child("mode"), r.Mode,
				"a Shadow rule never holds a request, so it cannot use onExceed: Delay; try the limit in Shadow with onExceed unset (Deny), then switch to Enforce with Delay"))
		}
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

func validateMatch(m *RuleMatch, path *field.Path, ctx *ruleContext) field.ErrorList {
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
		hp := path.Child("headers").Index(i)
		if !headerName.MatchString(h.Name) {
			errs = append(errs, field.Invalid(hp.Child("name"), h.Name, "must be an HTTP header name"))
		}
		errs = append(errs, validateValueMatch(hp, h.Value, h.Regex, h.Absent, h.Invert, "header")...)
	}
	if n := len(m.Query); n > maxQueryMatches {
		errs = append(errs, field.TooMany(path.Child("query"), n, maxQueryMatches))
	}
	for i, q := range m.Query {
		qp := path.Child("query").Index(i)
		if q.Name == "" {
			errs = append(errs, field.Required(qp.Child("name"), "a parameter name is required"))
		}
		errs = append(errs, validateValueMatch(qp, q.Value, q.Regex, q.Absent, q.Invert, "parameter")...)
	}
	if n := len(m.Hosts); n > maxHosts {
		errs = append(errs, field.TooMany(path.Child("hosts"), n, maxHosts))
	}
	seenHosts := map[Hostname]bool{}
	for i, h := range m.Hosts {
		hp := path.Child("hosts").Index(i)
		if seenHosts[h] {
			errs = append(errs, field.Duplicate(hp, h))
		}
		seenHosts[h] = true
		if len(h) > config.MaxHostLength || !hostname.MatchString(string(h)) {
			errs = append(errs, field.Invalid(hp, h,
				"must be a lower-case DNS name such as api.example.com, or a wildcard such as *.example.com"))
		}
	}
	errs = append(errs, validateCIDRs(m.SourceCIDRs, path.Child("sourceCIDRs"))...)
	errs = append(errs, validateConditions(m.When, path.Child("when"), ctx)...)
	return errs
}

// hostname mirrors the schema pattern of Hostname.
var hostname = regexp.MustCompile(`^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// validateValueMatch checks a header or query match: what is the header
// or parameter.
func validateValueMatch(path *field.Path, value, regex string, absent, invert bool, what string) field.ErrorList {
	var errs field.ErrorList
	set := 0
	for _, ok := range []bool{value != "", regex != "", absent} {
		if ok {
			set++
		}
	}
	if set > 1 {
		errs = append(errs, field.Invalid(path, field.OmitValueType{}, "set at most one of value, regex and absent"))
	}
	if absent && invert {
		errs = append(errs, field.Invalid(path.Child("invert"), invert,
			fmt.Sprintf("invert cannot go with absent; to require the %s, leave both unset", what)))
	}
	if regex != "" {
		if len(regex) > maxPathLength {
			errs = append(errs, field.TooLong(path.Child("regex"), regex, maxPathLength))
		} else if _, err := regexp.Compile(regex); err != nil {
			errs = append(errs, field.Invalid(path.Child("regex"), regex,
				fmt.Sprintf("not a valid RE2 regular expression: %v", err)))
		}
	}
	return errs
}

// validateCIDRs checks a list of client networks.
func validateCIDRs(cidrs []CIDR, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if n := len(cidrs); n > maxCIDRs {
		errs = append(errs, field.TooMany(path, n, maxCIDRs))
	}
	seen := map[CIDR]bool{}
	for i, c := range cidrs {
		p := path.Index(i)
		if seen[c] {
			errs = append(errs, field.Duplicate(p, c))
		}
		seen[c] = true
		prefix, err := netip.ParsePrefix(string(c))
		if err != nil || prefix.Masked() != prefix {
			errs = append(errs, field.Invalid(p, c, "must be a CIDR with no host bits set, such as 10.0.0.0/8 or fd00::/8"))
		}
	}
	return errs
}

// validateConditions compiles a when list.
func validateConditions(when []Expression, path *field.Path, ctx *ruleContext) field.ErrorList {
	var errs field.ErrorList
	if n := len(when); n > maxConditions {
		errs = append(errs, field.TooMany(path, n, maxConditions))
	}
	for i, w := range when {
		errs = append(errs, validateExpression(w, config.Condition, path.Index(i), ctx)...)
	}
	return errs
}

// validateExpression compiles one CEL expression in the sidecar's
// environment and checks its cost, as the sidecar will.
func validateExpression(e Expression, kind config.ExpressionKind, path *field.Path, ctx *ruleContext) field.ErrorList {
	compiled, err := config.CompileExpression(string(e), kind)
	if err != nil {
		return field.ErrorList{field.Invalid(path, e, err.Error())}
	}
	if compiled.Claims && !ctx.jwt {
		msg := "reads auth.claims, so the policy's jwt section must be set, to verify tokens before their claims count"
		if ctx.noJWT != "" {
			msg = "reads auth.claims, which " + ctx.noJWT
		}
		return field.ErrorList{field.Invalid(path, e, msg)}
	}
	return nil
}

// validateExempt checks an exempt section.
func validateExempt(x *Exempt, path *field.Path, ctx *ruleContext) field.ErrorList {
	var errs field.ErrorList
	if len(x.SourceCIDRs) == 0 && len(x.When) == 0 {
		errs = append(errs, field.Required(path, "set sourceCIDRs, when, or both"))
	}
	errs = append(errs, validateCIDRs(x.SourceCIDRs, path.Child("sourceCIDRs"))...)
	errs = append(errs, validateConditions(x.When, path.Child("when"), ctx)...)
	return errs
}

func validateKeyPart(k KeyPart, path *field.Path, ctx *ruleContext) field.ErrorList {
	set := 0
	for _, ok := range []bool{k.Header != "", k.Query != "", k.ClientIP != nil, k.JWTClaim != "", k.Path != nil, k.Method != nil, k.Expression != ""} {
		if ok {
			set++
		}
	}
	var errs field.ErrorList
	if set != 1 {
		errs = append(errs, field.Invalid(path, set,
			"exactly one of header, query, clientIP, jwtClaim, path, method or expression must be set in each key part"))
	}
	if k.Header != "" && !headerName.MatchString(k.Header) {
		errs = append(errs, field.Invalid(path.Child("header"), k.Header, "must be an HTTP header name"))
	}
	if k.JWTClaim != "" && ctx.noJWT != "" {
		errs = append(errs, field.Invalid(path.Child("jwtClaim"), k.JWTClaim, ctx.noJWT))
	}
	if k.Expression != "" {
		errs = append(errs, validateExpression(k.Expression, config.KeyValue, path.Child("expression"), ctx)...)
	}
	if ip := k.ClientIP; ip != nil {
		if ip.IPv4PrefixLength < 0 || ip.IPv4PrefixLength > 32 {
			errs = append(errs, field.Invalid(path.Child("clientIP", "ipv4PrefixLength"), ip.IPv4PrefixLength, "must be between 1 and 32"))
		}
		if ip.IPv6PrefixLength < 0 || ip.IPv6PrefixLength > 128 {
			errs = append(errs, field.Invalid(path.Child("clientIP", "ipv6PrefixLength"), ip.IPv6PrefixLength, "must be between 1 and 128"))
		}
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
	cl := config.Limit{Requests: l.Requests, Per: l.Per, Burst: l.Burst, Algorithm: string(l.Algorithm), Lease: string(l.Lease), Split: l.Split,
		OnExceed: string(l.OnExceed), MaxDelay: l.MaxDelay, DelayAfter: l.DelayAfter}
	lim, problems := cl.Check()
	if len(problems) == 0 {
		problems = cl.CheckSpread(lim)
	}
	var errs field.ErrorList
	for _, p := range problems {
		switch p.Path {
		case "algorithm":
			if l.Delays() && slices.Contains(algorithms, l.Algorithm) {
				errs = append(errs, field.NotSupported(path.Child("algorithm"), l.Algorithm, []Algorithm{AlgorithmTokenBucket, AlgorithmGCRA}))
			} else {
				errs = append(errs, field.NotSupported(path.Child("algorithm"), l.Algorithm, algorithms))
			}
		case "requests":
			errs = append(errs, field.Invalid(path.Child("requests"), l.Requests, p.Msg))
		case "per":
			errs = append(errs, field.Invalid(path.Child("per"), l.Per.Duration.String(), p.Msg))
		case "burst":
			errs = append(errs, field.Invalid(path.Child("burst"), l.Burst, p.Msg))
		case "lease":
			if l.Delays() && l.Lease == LeaseAuto {
				errs = append(errs, field.Invalid(path.Child("lease"), l.Lease, p.Msg))
			} else {
				errs = append(errs, field.NotSupported(path.Child("lease"), l.Lease, []LeaseMode{LeaseAuto, LeaseOff}))
			}
		case "split":
			errs = append(errs, field.Invalid(path.Child("split"), l.Split, p.Msg))
		case "onExceed":
			errs = append(errs, field.NotSupported(path.Child("onExceed"), l.OnExceed, []OnExceed{OnExceedDeny, OnExceedDelay}))
		case "maxDelay":
			errs = append(errs, field.Invalid(path.Child("maxDelay"), l.MaxDelay.Duration.String(), p.Msg))
		case "delayAfter":
			errs = append(errs, field.Invalid(path.Child("delayAfter"), l.DelayAfter, p.Msg))
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
			"cost.default must not exceed the rule's capacity (limit.burst, or limit.requests when burst is unset, divided by limit.split when set; limit.delayAfter, or 1, under onExceed: Delay), or every request would be denied"))
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
				"cost.max must not exceed the rule's capacity (limit.burst, or limit.requests when burst is unset, divided by limit.split when set; limit.delayAfter, or 1, under onExceed: Delay)"))
		}
		if c.Default > c.Max {
			errs = append(errs, field.Invalid(path.Child("default"), c.Default, "default must not exceed max"))
		}
	}
	return errs
}

func validateTrustedProxies(tp *TrustedProxies, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(tp.CIDRs) == 0 {
		errs = append(errs, field.Required(path.Child("cidrs"),
			"cidrs is required: X-Forwarded-For is believed only from peers inside them; without them any client could name any address (hops alone is not enough)"))
	}
	if tp.Header != "" {
		if !headerName.MatchString(tp.Header) {
			errs = append(errs, field.Invalid(path.Child("header"), tp.Header, "must be an HTTP header name"))
		}
		if tp.Hops != 0 {
			errs = append(errs, field.Invalid(path.Child("header"), tp.Header, "header holds one address: it excludes hops"))
		}
	}
	// validateCIDRs bounds the list at maxCIDRs, which is maxTrustedCIDRs.
	errs = append(errs, validateCIDRs(tp.CIDRs, path.Child("cidrs"))...)
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
	errs = append(errs, enumValue(path.Child("onInvalidToken"), string(j.OnInvalidToken),
		OnInvalidTokenReject, OnInvalidTokenNextAlternative)...)
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

// ValidateSemantics reports every problem with the cluster policy's spec
// at once, each with its field path, as RateLimitPolicy.ValidateSemantics
// does: the rules are held to the same checks, and what a cluster policy
// cannot have (a jwt key, auth.claims) is refused.
func (p *ClusterRateLimitPolicy) ValidateSemantics() field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if n := len(p.Name); n > MaxClusterPolicyNameLength {
		errs = append(errs, field.TooLong(field.NewPath("metadata", "name"), p.Name, MaxClusterPolicyNameLength))
	}
	opts := metav1validation.LabelSelectorValidationOptions{}
	errs = append(errs, metav1validation.ValidateLabelSelector(&p.Spec.NamespaceSelector, opts, spec.Child("namespaceSelector"))...)
	errs = append(errs, metav1validation.ValidateLabelSelector(&p.Spec.PodSelector, opts, spec.Child("podSelector"))...)
	if ref := p.Spec.StoreRef; ref != nil {
		for _, msg := range validation.IsDNS1123Label(ref.Name) {
			errs = append(errs, field.Invalid(spec.Child("storeRef", "name"), ref.Name, msg))
		}
	}
	ctx := &ruleContext{noJWT: "a ClusterRateLimitPolicy cannot use: it has no namespace to hold the keys that verify tokens"}
	if tp := p.Spec.TrustedProxies; tp != nil {
		errs = append(errs, validateTrustedProxies(tp, spec.Child("trustedProxies"))...)
	}
	if p.Spec.Exempt != nil {
		errs = append(errs, validateExempt(p.Spec.Exempt, spec.Child("exempt"), ctx)...)
	}
	total := 0
	seen := map[string]string{}
	for _, list := range []struct {
		name  string
		rules *ClusterRules
	}{{"defaults", p.Spec.Defaults}, {"overrides", p.Spec.Overrides}} {
		if list.rules == nil {
			continue
		}
		path := spec.Child(list.name, "rules")
		switch n := len(list.rules.Rules); {
		case n == 0:
			errs = append(errs, field.Required(path, "at least one rule is required"))
		case n > maxClusterRules:
			errs = append(errs, field.TooMany(path, n, maxClusterRules))
		}
		total += len(list.rules.Rules)
		for i := range list.rules.Rules {
			r := &list.rules.Rules[i]
			rp := path.Index(i)
			if other, dup := seen[r.Name]; dup {
				errs = append(errs, field.Duplicate(rp.Child("name"), r.Name+" (also in "+other+")"))
			}
			seen[r.Name] = list.name
			errs = append(errs, validateRule(r, rp, ctx)...)
		}
	}
	if total == 0 {
		errs = append(errs, field.Required(spec, "set defaults, overrides, or both"))
	}
	return errs
}
