package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/internal/message"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// Bounds that keep a compiled document cheap to evaluate.
const (
	// MaxNameLength bounds policy and rule names.
	MaxNameLength = 63
	// MaxUIDLength bounds a policy UID.
	MaxUIDLength = 64
	// MaxRegexLength bounds a RegularExpression path match.
	MaxRegexLength = 1024
	// MaxKeyParts bounds the descriptor parts of one key alternative.
	MaxKeyParts = 8
	// MaxKeyAlternatives bounds a rule's key alternatives (Keys).
	MaxKeyAlternatives = 8
	// MaxRulesPerPolicy bounds the rules of one policy.
	MaxRulesPerPolicy = 1000
	// MaxRules bounds the rules of a whole document, and so the rules a
	// sidecar enforces: compiling, matching and reloading stay cheap
	// below it (a reload of MaxRules rules takes well under a second).
	MaxRules = 10000
	// MaxPods bounds Config.Pods, and so a policy's ReplicaPods.
	MaxPods = 10000
	// MaxPodNameLength bounds a name in Config.Pods (a DNS subdomain).
	MaxPodNameLength = 253
	// MaxHops bounds TrustedProxies.Hops.
	MaxHops = 32
	// MaxDescriptorEntries bounds the entries of a descriptor match.
	MaxDescriptorEntries = 16
	// MaxDomainLength bounds a descriptor match's domain.
	MaxDomainLength = 256
	// MaxDescriptorKeyLength and MaxDescriptorValueLength bound the key
	// and the value of a descriptor match entry.
	MaxDescriptorKeyLength   = 256
	MaxDescriptorValueLength = 1024
	// MaxConditions bounds a when list (match.when, exempt.when).
	MaxConditions = 8
	// MaxHosts bounds match.hosts.
	MaxHosts = 16
	// MaxHostLength bounds a host name, as DNS does.
	MaxHostLength = 253
	// MaxValueMatches bounds match.headers and match.query.
	MaxValueMatches = 16
	// MaxMatchNameLength bounds a header or query parameter name in a
	// match, and MaxMatchValueLength its value.
	MaxMatchNameLength  = 256
	MaxMatchValueLength = 4096
	// MaxCIDRs bounds a list of source networks.
	MaxCIDRs = 64
	// MaxGateways bounds a policy's Gateways: an HTTPRoute has at most
	// 32 parentRefs.
	MaxGateways = 32
)

// hostPattern is what a match.hosts entry may be: a lower-case DNS name,
// or one whose first label is the wildcard "*". It is the Gateway API's
// Hostname pattern.
var hostPattern = regexp.MustCompile(`^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// FieldError is one problem in a document, with the path of the field at
// fault, such as "policies[0].rules[2].limit.per".
type FieldError struct {
	Path string
	Msg  string
}

// Error implements error.
func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// errList collects FieldErrors.
type errList []error

func (l *errList) add(path, format string, args ...any) {
	*l = append(*l, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// addLimit adds the problems Limit.Check found in the limit at path.
func (l *errList) addLimit(path string, problems []*FieldError) {
	for _, p := range problems {
		if p.Path != "" {
			l.add(path+"."+p.Path, "%s", p.Msg)
		} else {
			l.add(path, "%s", p.Msg)
		}
	}
}

// Validate reports every problem with c at once. Each error in the result is
// a *FieldError (see errors.As and the Unwrap() []error of errors.Join).
func (c *Config) Validate() error {
	var errs errList
	if c.APIVersion != APIVersion {
		errs.add("apiVersion", "must be %q, got %q", APIVersion, c.APIVersion)
	}
	c.Store.validate("store", &errs)
	if len(c.Pods) > MaxPods {
		errs.add("pods", "at most %d pods, got %d", MaxPods, len(c.Pods))
	}
	for i, name := range c.Pods {
		if name == "" || len(name) > MaxPodNameLength || !printable(name) {
			errs.add(fmt.Sprintf("pods[%d]", i), "must be a pod name of 1-%d characters, got %q", MaxPodNameLength, name)
		} else if i > 0 && name <= c.Pods[i-1] {
			errs.add(fmt.Sprintf("pods[%d]", i), "pods must be sorted and unique: %q follows %q", name, c.Pods[i-1])
		}
	}
	rules := 0
	for i := range c.Policies {
		rules += len(c.Policies[i].Rules)
	}
	if rules > MaxRules {
		errs.add("policies", "at most %d rules in all, got %d; split the policies over namespaces or merge rules", MaxRules, rules)
	}
	uids := map[string]int{}
	names := map[string]int{}
	for i := range c.Policies {
		p := &c.Policies[i]
		path := fmt.Sprintf("policies[%d]", i)
		p.validate(path, len(c.Pods), &errs)
		if p.UID != "" {
			if j, dup := uids[p.UID]; dup {
				errs.add(path+".uid", "duplicates policies[%d].uid %q", j, p.UID)
			} else {
				uids[p.UID] = i
			}
		}
		if p.Name != "" {
			id := p.Namespace + "/" + p.Name
			if j, dup := names[id]; dup {
				errs.add(path+".name", "duplicates policies[%d] (%s)", j, id)
			} else {
				names[id] = i
			}
		}
	}
	for i := range c.Policies {
		p := &c.Policies[i]
		for j := range p.Rules {
			for k, uid := range p.Rules[j].ReplacedBy {
				kp := fmt.Sprintf("policies[%d].rules[%d].replacedBy[%d]", i, j, k)
				switch o, ok := uids[uid]; {
				case !ok:
					errs.add(kp, "no policy of this document has uid %q", uid)
				case o == i:
					errs.add(kp, "a policy cannot replace its own rule")
				}
			}
		}
	}
	return errors.Join(errs...)
}

func (s *Store) validate(path string, errs *errList) {
	switch s.Type {
	case "", StoreMemory:
		if len(s.Addresses) > 0 {
			errs.add(path+".addresses", "only a redis store takes addresses")
		}
	case StoreRedis:
		if len(s.Addresses) == 0 {
			errs.add(path+".addresses", "a redis store needs at least one address")
		}
	default:
		errs.add(path+".type", "must be %q or %q, got %q", StoreMemory, StoreRedis, s.Type)
	}
	for i, a := range s.Addresses {
		if err := ValidateAddress(a); err != nil {
			errs.add(fmt.Sprintf("%s.addresses[%d]", path, i), "%v", err)
		}
	}
	if s.TLS != nil && s.Type != StoreRedis {
		errs.add(path+".tls", "only a redis store takes tls")
	}
}

// ValidateAddress checks a host:port store address.
func ValidateAddress(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("must be host:port: %w", err)
	}
	if host == "" {
		return errors.New("host must not be empty")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port must be 1-65535, got %q", port)
	}
	return nil
}

func (p *Policy) validate(path string, pods int, errs *errList) {
	if !validName(p.Name) {
		errs.add(path+".name", "must be 1-%d letters, digits, '-', '_' or '.', got %q", MaxNameLength, p.Name)
	}
	if p.UID == "" || len(p.UID) > MaxUIDLength || !nameChars(p.UID) {
		errs.add(path+".uid", "must be 1-%d letters, digits, '-', '_' or '.', got %q", MaxUIDLength, p.UID)
	}
	p.validateReplicas(path, pods, errs)
	if p.PodSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(p.PodSelector); err != nil {
			errs.add(path+".podSelector", "%v", err)
		}
	}
	p.TrustedProxies.validate(path+".trustedProxies", errs)
	p.JWT.validate(path+".jwt", errs)
	if p.Exempt != nil {
		p.Exempt.validate(path+".exempt", p, errs)
	}
	if len(p.Rules) == 0 {
		errs.add(path+".rules", "a policy needs at least one rule")
	}
	if len(p.Rules) > MaxRulesPerPolicy {
		errs.add(path+".rules", "at most %d rules per policy, got %d", MaxRulesPerPolicy, len(p.Rules))
	}
	if p.LoadShedding != nil {
		p.LoadShedding.validate(path+".loadShedding", errs)
	}
	validateGateways(path+".gateways", p.Gateways, errs)
	seen := map[string]int{}
	for i := range p.Rules {
		r := &p.Rules[i]
		rp := fmt.Sprintf("%s.rules[%d]", path, i)
		r.validate(rp, p, errs)
		if j, dup := seen[r.Name]; dup && r.Name != "" {
			errs.add(rp+".name", "duplicates %s.rules[%d].name %q", path, j, r.Name)
		} else {
			seen[r.Name] = i
		}
	}
	for i := range p.Rules {
		d := p.Rules[i].Match.Descriptors
		if d == nil {
			continue
		}
		for k, name := range d.Replaces {
			kp := fmt.Sprintf("%s.rules[%d].match.descriptors.replaces[%d]", path, i, k)
			j, ok := seen[name]
			switch {
			case !ok:
				errs.add(kp, "no rule named %q in this policy", name)
			case j == i:
				errs.add(kp, "a rule cannot replace itself")
			case p.Rules[j].Match.Descriptors == nil || p.Rules[j].Match.Descriptors.Domain != d.Domain:
				errs.add(kp, "rule %q is not a descriptor rule of domain %q", name, d.Domain)
			}
		}
	}
}

// validateReplicas checks the policy's place among the replicas.
func (p *Policy) validateReplicas(path string, pods int, errs *errList) {
	if p.Replicas < 0 {
		errs.add(path+".replicas", "must not be negative, got %d", p.Replicas)
	}
	if len(p.ReplicaPods) > 0 && int(p.Replicas) != len(p.ReplicaPods) {
		errs.add(path+".replicas", "must equal the length of replicaPods, %d, got %d", len(p.ReplicaPods), p.Replicas)
	}
	for i, idx := range p.ReplicaPods {
		switch {
		case idx < 0 || int(idx) >= pods:
			errs.add(fmt.Sprintf("%s.replicaPods[%d]", path, i), "must index pods (0-%d), got %d", pods-1, idx)
		case i > 0 && idx <= p.ReplicaPods[i-1]:
			errs.add(fmt.Sprintf("%s.replicaPods[%d]", path, i), "must be increasing: %d follows %d", idx, p.ReplicaPods[i-1])
		}
	}
}

// validate checks trusted proxies at path; nil is valid.
func (tp *TrustedProxies) validate(path string, errs *errList) {
	if tp == nil {
		return
	}
	for i, c := range tp.CIDRs {
		if _, err := netip.ParsePrefix(c); err != nil {
			errs.add(fmt.Sprintf("%s.cidrs[%d]", path, i), "%v", err)
		}
	}
	if tp.Hops < 0 || tp.Hops > MaxHops {
		errs.add(path+".hops", "must be between 0 and %d, got %d", MaxHops, tp.Hops)
	}
	if len(tp.CIDRs) == 0 {
		// hops alone would believe X-Forwarded-For from any peer, so
		// any client could name any address.
		errs.add(path+".cidrs", "required: X-Forwarded-For is believed only from peers inside these ranges; omit trustedProxies to use the socket peer")
	}
	if tp.Header != "" {
		if !validToken(tp.Header) {
			errs.add(path+".header", "not a valid header name: %q", tp.Header)
		}
		if tp.Hops != 0 {
			errs.add(path+".header", "a header holds one address: it excludes hops")
		}
	}
}

// validate checks the JWT settings at path; nil is valid.
func (j *JWT) validate(path string, errs *errList) {
	if j == nil {
		return
	}
	if j.Header != "" && !validToken(j.Header) {
		errs.add(path+".header", "not a valid header name: %q", j.Header)
	}
	if j.UpstreamVerified && (j.HMACSecretFile != "" || j.JWKSFile != "") {
		errs.add(path, "upstreamVerified excludes hmacSecretFile and jwksFile")
	}
	if !j.UpstreamVerified && j.HMACSecretFile == "" && j.JWKSFile == "" {
		errs.add(path, "set hmacSecretFile, jwksFile, or upstreamVerified: claims are only read from verified tokens")
	}
	switch j.OnInvalidToken {
	case "", OnInvalidTokenReject, OnInvalidTokenNextAlternative:
	default:
		errs.add(path+".onInvalidToken", "must be %s or %s, got %q", OnInvalidTokenReject, OnInvalidTokenNextAlternative, j.OnInvalidToken)
	}
}

func (d *DescriptorMatch) validate(path string, errs *errList) {
	if d.Domain == "" || len(d.Domain) > MaxDomainLength || !printable(d.Domain) {
		errs.add(path+".domain", "must be 1-%d printable characters, got %q", MaxDomainLength, d.Domain)
	}
	if len(d.Entries) == 0 || len(d.Entries) > MaxDescriptorEntries {
		errs.add(path+".entries", "must have 1-%d entries, got %d", MaxDescriptorEntries, len(d.Entries))
	}
	for i, e := range d.Entries {
		ep := fmt.Sprintf("%s.entries[%d]", path, i)
		if e.Key == "" || len(e.Key) > MaxDescriptorKeyLength || !printable(e.Key) {
			errs.add(ep+".key", "must be 1-%d printable characters, got %q", MaxDescriptorKeyLength, e.Key)
		}
		if len(e.Value) > MaxDescriptorValueLength || !printable(e.Value) {
			errs.add(ep+".value", "must be at most %d printable characters", MaxDescriptorValueLength)
		}
	}
	for i, name := range d.Replaces {
		if !validName(name) {
			errs.add(fmt.Sprintf("%s.replaces[%d]", path, i), "must be a rule name, got %q", name)
		}
	}
}

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

func (r *Rule) validate(path string, p *Policy, errs *errList) {
	if !validName(r.Name) {
		errs.add(path+".name", "must be 1-%d letters, digits, '-', '_' or '.', got %q", MaxNameLength, r.Name)
	}
	r.Match.validate(path+".match", p, errs)
	if r.Match.Descriptors != nil {
		r.refuseAdmissionFields(path, errs)
		r.validateDescriptorRule(path, errs)
		return
	}
	if r.Limit.Unlimited {
		errs.add(path+".limit.unlimited", "only a descriptor rule (match.descriptors) can be unlimited")
	}
	rate := r.validateKind(path, errs)
	switch {
	case len(r.Keys) > 0 && len(r.Key) > 0:
		errs.add(path+".keys", "set key or keys, not both")
	case len(r.Keys) > MaxKeyAlternatives:
		errs.add(path+".keys", "at most %d alternatives, got %d", MaxKeyAlternatives, len(r.Keys))
	}
	if len(r.Keys) == 0 {
		validateKey(r.Key, path+".key", p, errs)
	}
	for i, alt := range r.Keys {
		validateKey(alt, fmt.Sprintf("%s.keys[%d]", path, i), p, errs)
		if len(alt) == 0 && i < len(r.Keys)-1 {
			errs.add(fmt.Sprintf("%s.keys[%d]", path, i), "an empty alternative keys every request, so the alternatives after it would never be used: it may only be the last")
		}
	}
	switch r.OnMissingKey {
	case "", OnMissingKeySkip, OnMissingKeyShared, OnMissingKeyReject:
	default:
		errs.add(path+".onMissingKey", "must be %s, %s or %s, got %q", OnMissingKeyShared, OnMissingKeyReject, OnMissingKeySkip, r.OnMissingKey)
	}
	if rate {
		r.validateRate(path, errs)
	}
	if r.Exempt != nil {
		r.Exempt.validate(path+".exempt", p, errs)
	}
	for i, uid := range r.ReplacedBy {
		if uid == "" || len(uid) > MaxUIDLength || !nameChars(uid) {
			errs.add(fmt.Sprintf("%s.replacedBy[%d]", path, i), "must be a policy uid, got %q", uid)
		}
	}
	r.validateModes(path, errs)
}

// validateRate checks the limit and cost of a rate rule.
func (r *Rule) validateRate(path string, errs *errList) {
	lim, problems := r.Limit.Check()
	errs.addLimit(path+".limit", problems)
	if len(problems) == 0 {
		errs.addLimit(path+".limit", r.Limit.CheckSpread(lim))
	}
	c := r.Cost
	if c.FromHeader != "" && !validToken(c.FromHeader) {
		errs.add(path+".cost.fromHeader", "not a valid header name: %q", c.FromHeader)
	}
	if c.Default < 0 {
		errs.add(path+".cost.default", "must not be negative, got %d", c.Default)
	}
	if c.Max < 0 {
		errs.add(path+".cost.max", "must not be negative, got %d", c.Max)
	}
	if len(problems) == 0 {
		capacity := r.Limit.PartCapacity(lim)
		if c.Default > capacity {
			errs.add(path+".cost.default", "%d exceeds the rule's capacity %d%s, so every request would be denied", c.Default, capacity, r.Limit.splitNote())
		}
		if c.Max > capacity {
			errs.add(path+".cost.max", "%d exceeds the rule's capacity %d%s", c.Max, capacity, r.Limit.splitNote())
		}
	}
	if c.Max > 0 && c.Default > c.Max {
		errs.add(path+".cost.default", "%d exceeds cost.max %d", c.Default, c.Max)
	}
	if r.Limit.Delays() && r.Mode == ModeShadow {
		errs.add(path+".mode", "a Shadow rule never holds a request, so it cannot use onExceed: Delay; try the limit in Shadow with onExceed unset (Deny), then switch to Enforce with Delay")
	}
}

// validate checks an exempt section of a policy or rule.
func (x *Exempt) validate(path string, p *Policy, errs *errList) {
	if len(x.SourceCIDRs) == 0 && len(x.When) == 0 {
		errs.add(path, "set sourceCIDRs, when, or both")
	}
	validateCIDRs(path+".sourceCIDRs", x.SourceCIDRs, errs)
	validateConditions(path+".when", x.When, p, errs)
}

// validateCIDRs checks a list of networks.
func validateCIDRs(path string, cidrs []string, errs *errList) {
	if len(cidrs) > MaxCIDRs {
		errs.add(path, "at most %d networks, got %d", MaxCIDRs, len(cidrs))
	}
	for i, c := range cidrs {
		prefix, err := netip.ParsePrefix(c)
		switch {
		case err != nil:
			errs.add(fmt.Sprintf("%s[%d]", path, i), "must be a CIDR such as 10.0.0.0/8 or fd00::/8, got %q", c)
		case prefix.Masked() != prefix:
			errs.add(fmt.Sprintf("%s[%d]", path, i), "must have no host bits set: %q is %s", c, prefix.Masked())
		}
	}
}

// validateConditions checks a when list.
func validateConditions(path string, when []string, p *Policy, errs *errList) {
	if len(when) > MaxConditions {
		errs.add(path, "at most %d conditions, got %d", MaxConditions, len(when))
	}
	for i, w := range when {
		validateExpression(fmt.Sprintf("%s[%d]", path, i), w, Condition, p, errs)
	}
}

// validateExpression compiles one CEL expression of policy p.
func validateExpression(path, expr string, kind ExpressionKind, p *Policy, errs *errList) {
	e, err := CompileExpression(expr, kind)
	if err != nil {
		errs.add(path, "%v", err)
		return
	}
	if e.Claims && p.JWT == nil {
		errs.add(path, "reads auth.claims, but the policy has no jwt section to verify tokens with")
	}
}

// validateValueMatch checks a header or query match.
func validateValueMatch(path, value, regex string, absent, invert bool, errs *errList) {
	set := 0
	for _, ok := range []bool{value != "", regex != "", absent} {
		if ok {
			set++
		}
	}
	if set > 1 {
		errs.add(path, "set at most one of value, regex and absent")
	}
	if absent && invert {
		errs.add(path+".invert", "cannot go with absent; to require the header or parameter, leave both unset")
	}
	if len(value) > MaxMatchValueLength {
		errs.add(path+".value", "at most %d characters, got %d", MaxMatchValueLength, len(value))
	}
	if regex != "" {
		if len(regex) > MaxRegexLength {
			errs.add(path+".regex", "at most %d characters, got %d", MaxRegexLength, len(regex))
		} else if _, err := regexp.Compile(regex); err != nil {
			errs.add(path+".regex", "not a valid RE2 regular expression: %v", err)
		}
	}
}

// validateKey checks one key alternative.
func validateKey(parts []KeyPart, path string, p *Policy, errs *errList) {
	if len(parts) > MaxKeyParts {
		errs.add(path, "at most %d parts, got %d", MaxKeyParts, len(parts))
	}
	for i, k := range parts {
		kp := fmt.Sprintf("%s[%d]", path, i)
		set := 0
		if k.Header != "" {
			set++
			if !validToken(k.Header) {
				errs.add(kp+".header", "not a valid header name: %q", k.Header)
			}
		}
		if k.Query != "" {
			set++
		}
		if ip := k.ClientIP; ip != nil {
			set++
			if ip.IPv4PrefixLength < 0 || ip.IPv4PrefixLength > 32 {
				errs.add(kp+".clientIP.ipv4PrefixLength", "must be between 1 and 32, got %d", ip.IPv4PrefixLength)
			}
			if ip.IPv6PrefixLength < 0 || ip.IPv6PrefixLength > 128 {
				errs.add(kp+".clientIP.ipv6PrefixLength", "must be between 1 and 128, got %d", ip.IPv6PrefixLength)
			}
		}
		if k.JWTClaim != "" {
			set++
			if p.JWT == nil {
				errs.add(kp+".jwtClaim", "the policy has no jwt section to verify tokens with")
			}
		}
		if k.Path != nil {
			set++
		}
		if k.Method != nil {
			set++
		}
		if k.Expression != "" {
			set++
			validateExpression(kp+".expression", k.Expression, KeyValue, p, errs)
		}
		if set != 1 {
			errs.add(kp, "set exactly one of header, query, clientIP, jwtClaim, path, method, expression; %d are set", set)
		}
	}
}

// validateDescriptorRule checks a rule with match.descriptors.
func (r *Rule) validateDescriptorRule(path string, errs *errList) {
	m := &r.Match
	if m.Path != nil || len(m.Methods) > 0 || len(m.Headers) > 0 || len(m.Hosts) > 0 || len(m.Query) > 0 ||
		len(m.SourceCIDRs) > 0 || len(m.When) > 0 {
		errs.add(path+".match", "a descriptor rule matches Envoy rate-limit descriptors only: path, methods, headers, hosts, query, sourceCIDRs and when must be empty")
	}
	if r.Exempt != nil {
		errs.add(path+".exempt", "a descriptor rule sees no request head to exempt by; match the descriptor entries instead")
	}
	if len(r.ReplacedBy) > 0 {
		errs.add(path+".replacedBy", "only an HTTP rule can be replaced")
	}
	m.Descriptors.validate(path+".match.descriptors", errs)
	if len(r.Key) > 0 || len(r.Keys) > 0 {
		errs.add(path+".key", "a descriptor rule is keyed by the descriptor's values: key and keys must be empty")
	}
	if r.OnMissingKey != "" {
		errs.add(path+".onMissingKey", "not used by a descriptor rule")
	}
	if r.Cost != (Cost{}) {
		errs.add(path+".cost", "a descriptor rule is charged the call's hits_addend: cost must be empty")
	}
	l := r.Limit
	if l.Delays() {
		errs.add(path+".limit.onExceed", "a descriptor rule answers a rate-limit service call, which cannot hold the request: only %s", OnExceedDeny)
		l.OnExceed, l.MaxDelay, l.DelayAfter = "", metav1.Duration{}, 0
	}
	switch {
	case l.Unlimited:
		if l.Requests != 0 || l.Per.Duration != 0 || l.Burst != 0 || l.Algorithm != "" || l.Lease != "" || l.Split != 0 ||
			l.OnExceed != "" || l.MaxDelay.Duration != 0 || l.DelayAfter != 0 {
			errs.add(path+".limit", "an unlimited rule takes no requests, per, burst, algorithm, lease, split, onExceed, maxDelay or delayAfter")
		}
	case l.Requests == 0:
		// Denies every call; the limit still needs a valid period.
		l.Requests = 1
		if l.Split > 1 {
			errs.add(path+".limit.split", "a rule of 0 requests denies every call and has nothing to split")
			l.Split = 0
		}
		fallthrough
	default:
		lim, problems := l.Check()
		errs.addLimit(path+".limit", problems)
		if len(problems) == 0 {
			errs.addLimit(path+".limit", l.CheckSpread(lim))
		}
	}
	r.validateModes(path, errs)
}

// validateModes checks the failureMode, mode and responseHeaders that
// every rule has.
func (r *Rule) validateModes(path string, errs *errList) {
	switch r.FailureMode {
	case "", FailureOpen, FailureClosed:
	default:
		errs.add(path+".failureMode", "must be %s or %s, got %q", FailureOpen, FailureClosed, r.FailureMode)
	}
	switch r.Mode {
	case "", ModeEnforce, ModeShadow:
	default:
		errs.add(path+".mode", "must be %s or %s, got %q", ModeEnforce, ModeShadow, r.Mode)
	}
	switch r.ResponseHeaders {
	case "", ResponseHeadersFull, ResponseHeadersRetryAfter, ResponseHeadersNone:
		if r.ResponseHeaders != "" && r.Limit == (Limit{}) {
			errs.add(path+".responseHeaders", "applies to rate limits only: it says which of a rate rule's numbers its answers carry")
		}
	default:
		errs.add(path+".responseHeaders", "must be %s, %s or %s, got %q",
			ResponseHeadersFull, ResponseHeadersRetryAfter, ResponseHeadersNone, r.ResponseHeaders)
	}
}

func (m *Match) validate(path string, p *Policy, errs *errList) {
	if pm := m.Path; pm != nil {
		switch pm.Type {
		case PathExact, PathPrefix:
			if !strings.HasPrefix(pm.Value, "/") {
				errs.add(path+".path.value", "must start with '/', got %q", pm.Value)
			}
		case PathRegularExpression:
			if len(pm.Value) > MaxRegexLength {
				errs.add(path+".path.value", "at most %d characters, got %d", MaxRegexLength, len(pm.Value))
			} else if _, err := regexp.Compile(pm.Value); err != nil {
				errs.add(path+".path.value", "%v", err)
			}
		default:
			errs.add(path+".path.type", "must be %s, %s or %s, got %q", PathExact, PathPrefix, PathRegularExpression, pm.Type)
		}
	}
	for i, meth := range m.Methods {
		if !validToken(meth) || strings.ToUpper(meth) != meth {
			errs.add(fmt.Sprintf("%s.methods[%d]", path, i), "must be an upper-case method token, got %q", meth)
		}
	}
	if len(m.Headers) > MaxValueMatches {
		errs.add(path+".headers", "at most %d entries, got %d", MaxValueMatches, len(m.Headers))
	}
	for i, h := range m.Headers {
		hp := fmt.Sprintf("%s.headers[%d]", path, i)
		if !validToken(h.Name) || len(h.Name) > MaxMatchNameLength {
			errs.add(hp+".name", "not a valid header name: %q", h.Name)
		}
		validateValueMatch(hp, h.Value, h.Regex, h.Absent, h.Invert, errs)
	}
	if len(m.Query) > MaxValueMatches {
		errs.add(path+".query", "at most %d entries, got %d", MaxValueMatches, len(m.Query))
	}
	for i, q := range m.Query {
		qp := fmt.Sprintf("%s.query[%d]", path, i)
		if q.Name == "" || len(q.Name) > MaxMatchNameLength || !printable(q.Name) {
			errs.add(qp+".name", "must be 1-%d printable characters, got %q", MaxMatchNameLength, q.Name)
		}
		validateValueMatch(qp, q.Value, q.Regex, q.Absent, q.Invert, errs)
	}
	if len(m.Hosts) > MaxHosts {
		errs.add(path+".hosts", "at most %d hosts, got %d", MaxHosts, len(m.Hosts))
	}
	for i, h := range m.Hosts {
		if len(h) > MaxHostLength || !hostPattern.MatchString(h) {
			errs.add(fmt.Sprintf("%s.hosts[%d]", path, i), "must be a lower-case DNS name such as api.example.com, or a wildcard such as *.example.com, got %q", h)
		}
	}
	validateCIDRs(path+".sourceCIDRs", m.SourceCIDRs, errs)
	validateConditions(path+".when", m.When, p, errs)
}

// Limiter converts l to the limiter's form and validates it. The error
// joins one error per problem, each starting with the field name. A Delay
// limit (OnExceed) becomes a GCRA limit whose Burst is DelayAfter (1 when
// 0) and whose MaxDelay is MaxDelay; its capacity problems are reported on
// delayAfter, which sets it.
func (l Limit) Limiter() (limiter.Limit, error) {
	alg := limiter.TokenBucket
	var errs []error
	parsed := true
	if l.Algorithm != "" {
		a, err := limiter.ParseAlgorithm(l.Algorithm)
		if err != nil {
			errs = append(errs, fmt.Errorf("algorithm: %w", err))
			parsed = false
		} else {
			alg = a
		}
	}
	delayErrs := l.checkDelay(parsed)
	errs = append(errs, delayErrs...)
	out := limiter.Limit{Algorithm: alg, Requests: l.Requests, Period: l.Per.Duration, Burst: l.Burst}
	if l.Delays() {
		out = l.delayLimiter(delayErrs)
	}
	if err := out.Validate(); err != nil {
		for _, e := range message.Unjoin(err) {
			if rest, ok := strings.CutPrefix(e.Error(), "burst: "); ok && l.Delays() {
				e = errors.New("delayAfter: " + rest)
			}
			errs = append(errs, e)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return limiter.Limit{}, err
	}
	return out, nil
}

// Check is Limiter with each problem as a *FieldError whose Path is the
// field of the limit at fault ("requests", "per", "burst", "algorithm",
// "onExceed", "maxDelay" or "delayAfter"), or empty when the problem is
// the limit as a whole. It is the one limit check: the sidecar validates
// its config with it, and the RateLimitPolicy API (api/v1alpha1) its
// rules' limits.
func (l Limit) Check() (limiter.Limit, []*FieldError) {
	lim, err := l.Limiter()
	if err == nil {
		return lim, nil
	}
	var out []*FieldError
	for _, e := range message.Unjoin(err) {
		field, rest, ok := cutField(e.Error())
		if ok {
			out = append(out, &FieldError{Path: field, Msg: rest})
		} else {
			out = append(out, &FieldError{Msg: e.Error()})
		}
	}
	return limiter.Limit{}, out
}

// cutField splits a problem "field: reason" into its field and reason.
func cutField(msg string) (field, rest string, ok bool) {
	field, rest, ok = strings.Cut(msg, ": ")
	if !ok || field == "" || strings.ContainsAny(field, " ") {
		return "", msg, false
	}
	return field, rest, true
}

func validName(s string) bool {
	return s != "" && len(s) <= MaxNameLength && nameChars(s)
}

func nameChars(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// validToken reports whether s is an RFC 9110 token, as header names and
// methods are.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
