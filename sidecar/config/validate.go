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
	// MaxKeyParts bounds the descriptor parts of one rule.
	MaxKeyParts = 8
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
)

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
	uids := map[string]int{}
	names := map[string]int{}
	for i := range c.Policies {
		p := &c.Policies[i]
		path := fmt.Sprintf("policies[%d]", i)
		p.validate(path, &errs)
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

func (p *Policy) validate(path string, errs *errList) {
	if !validName(p.Name) {
		errs.add(path+".name", "must be 1-%d letters, digits, '-', '_' or '.', got %q", MaxNameLength, p.Name)
	}
	if p.UID == "" || len(p.UID) > MaxUIDLength || !nameChars(p.UID) {
		errs.add(path+".uid", "must be 1-%d letters, digits, '-', '_' or '.', got %q", MaxUIDLength, p.UID)
	}
	if p.Replicas < 0 {
		errs.add(path+".replicas", "must not be negative, got %d", p.Replicas)
	}
	if p.PodSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(p.PodSelector); err != nil {
			errs.add(path+".podSelector", "%v", err)
		}
	}
	if tp := p.TrustedProxies; tp != nil {
		for i, c := range tp.CIDRs {
			if _, err := netip.ParsePrefix(c); err != nil {
				errs.add(fmt.Sprintf("%s.trustedProxies.cidrs[%d]", path, i), "%v", err)
			}
		}
		if tp.Hops < 0 || tp.Hops > MaxHops {
			errs.add(path+".trustedProxies.hops", "must be between 0 and %d, got %d", MaxHops, tp.Hops)
		}
		if len(tp.CIDRs) == 0 && tp.Hops == 0 {
			errs.add(path+".trustedProxies", "set cidrs, hops or both; omit trustedProxies to use the socket peer")
		}
	}
	if j := p.JWT; j != nil {
		jp := path + ".jwt"
		if j.Header != "" && !validToken(j.Header) {
			errs.add(jp+".header", "not a valid header name: %q", j.Header)
		}
		if j.UpstreamVerified && (j.HMACSecretFile != "" || j.JWKSFile != "") {
			errs.add(jp, "upstreamVerified excludes hmacSecretFile and jwksFile")
		}
		if !j.UpstreamVerified && j.HMACSecretFile == "" && j.JWKSFile == "" {
			errs.add(jp, "set hmacSecretFile, jwksFile, or upstreamVerified: claims are only read from verified tokens")
		}
	}
	if len(p.Rules) == 0 {
		errs.add(path+".rules", "a policy needs at least one rule")
	}
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
	r.Match.validate(path+".match", errs)
	if r.Match.Descriptors != nil {
		r.validateDescriptorRule(path, errs)
		return
	}
	if r.Limit.Unlimited {
		errs.add(path+".limit.unlimited", "only a descriptor rule (match.descriptors) can be unlimited")
	}
	if len(r.Key) > MaxKeyParts {
		errs.add(path+".key", "at most %d parts, got %d", MaxKeyParts, len(r.Key))
	}
	for i, k := range r.Key {
		kp := fmt.Sprintf("%s.key[%d]", path, i)
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
		if k.ClientIP != nil {
			set++
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
		if set != 1 {
			errs.add(kp, "set exactly one of header, query, clientIP, jwtClaim, path, method; %d are set", set)
		}
	}
	switch r.OnMissingKey {
	case "", OnMissingKeySkip, OnMissingKeyShared, OnMissingKeyReject:
	default:
		errs.add(path+".onMissingKey", "must be %s, %s or %s, got %q", OnMissingKeySkip, OnMissingKeyShared, OnMissingKeyReject, r.OnMissingKey)
	}
	lim, problems := r.Limit.Check()
	errs.addLimit(path+".limit", problems)
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
		capacity := lim.Capacity()
		if c.Default > capacity {
			errs.add(path+".cost.default", "%d exceeds the rule's capacity %d, so every request would be denied", c.Default, capacity)
		}
		if c.Max > capacity {
			errs.add(path+".cost.max", "%d exceeds the rule's capacity %d", c.Max, capacity)
		}
	}
	if c.Max > 0 && c.Default > c.Max {
		errs.add(path+".cost.default", "%d exceeds cost.max %d", c.Default, c.Max)
	}
	r.validateModes(path, errs)
}

// validateDescriptorRule checks a rule with match.descriptors.
func (r *Rule) validateDescriptorRule(path string, errs *errList) {
	m := &r.Match
	if m.Path != nil || len(m.Methods) > 0 || len(m.Headers) > 0 || len(m.Hosts) > 0 {
		errs.add(path+".match", "a descriptor rule matches Envoy rate-limit descriptors only: path, methods, headers and hosts must be empty")
	}
	m.Descriptors.validate(path+".match.descriptors", errs)
	if len(r.Key) > 0 {
		errs.add(path+".key", "a descriptor rule is keyed by the descriptor's values: key must be empty")
	}
	if r.OnMissingKey != "" {
		errs.add(path+".onMissingKey", "not used by a descriptor rule")
	}
	if r.Cost != (Cost{}) {
		errs.add(path+".cost", "a descriptor rule is charged the call's hits_addend: cost must be empty")
	}
	l := r.Limit
	switch {
	case l.Unlimited:
		if l.Requests != 0 || l.Per.Duration != 0 || l.Burst != 0 || l.Algorithm != "" {
			errs.add(path+".limit", "an unlimited rule takes no requests, per, burst or algorithm")
		}
	case l.Requests == 0:
		// Denies every call; the limit still needs a valid period.
		l.Requests = 1
		fallthrough
	default:
		_, problems := l.Check()
		errs.addLimit(path+".limit", problems)
	}
	r.validateModes(path, errs)
}

// validateModes checks the failureMode and mode that every rule has.
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
}

func (m *Match) validate(path string, errs *errList) {
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
	for i, h := range m.Hosts {
		if !ValidHostPattern(h) {
			errs.add(fmt.Sprintf("%s.hosts[%d]", path, i), "must be a lower-case DNS name or a wildcard *.<name>, got %q", h)
		}
	}
	for i, meth := range m.Methods {
		if !validToken(meth) || strings.ToUpper(meth) != meth {
			errs.add(fmt.Sprintf("%s.methods[%d]", path, i), "must be an upper-case method token, got %q", meth)
		}
	}
	for i, h := range m.Headers {
		if !validToken(h.Name) {
			errs.add(fmt.Sprintf("%s.headers[%d].name", path, i), "not a valid header name: %q", h.Name)
		}
	}
}

// Limiter converts l to the limiter's form and validates it. The error
// joins one error per problem, each starting with the field name.
func (l Limit) Limiter() (limiter.Limit, error) {
	alg := limiter.TokenBucket
	var errs []error
	if l.Algorithm != "" {
		a, err := limiter.ParseAlgorithm(l.Algorithm)
		if err != nil {
			errs = append(errs, fmt.Errorf("algorithm: %w", err))
		} else {
			alg = a
		}
	}
	out := limiter.Limit{Algorithm: alg, Requests: l.Requests, Period: l.Per.Duration, Burst: l.Burst}
	if err := out.Validate(); err != nil {
		errs = append(errs, message.Unjoin(err)...)
	}
	if err := errors.Join(errs...); err != nil {
		return limiter.Limit{}, err
	}
	return out, nil
}

// Check is Limiter with each problem as a *FieldError whose Path is the
// field of the limit at fault ("requests", "per", "burst" or "algorithm"),
// or empty when the problem is the limit as a whole. It is the one limit
// check: the sidecar validates its config with it, and the
// RateLimitPolicy API (api/v1alpha1) its rules' limits.
func (l Limit) Check() (limiter.Limit, []*FieldError) {
	lim, err := l.Limiter()
	if err == nil {
		return lim, nil
	}
	var out []*FieldError
	for _, e := range message.Unjoin(err) {
		msg := e.Error()
		if field, rest, ok := strings.Cut(msg, ": "); ok && !strings.ContainsAny(field, " ") {
			out = append(out, &FieldError{Path: field, Msg: rest})
		} else {
			out = append(out, &FieldError{Msg: msg})
		}
	}
	return limiter.Limit{}, out
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

// ValidHostPattern reports whether h is a lower-case DNS name, or "*."
// followed by one: a match.hosts entry.
func ValidHostPattern(h string) bool {
	h = strings.TrimPrefix(h, "*.")
	if h == "" || len(h) > 253 || strings.ToLower(h) != h {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
		}
	}
	return true
}
