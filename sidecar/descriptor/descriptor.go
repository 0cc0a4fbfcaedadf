// Package descriptor turns a request into the counter key of a rule: it
// reads the rule's key parts (header, query parameter, client IP, JWT
// claim, path, method) and hashes their values into a key of the form
// "<policy-uid>:<rule>:<hash>". Its hash (key.go) is the one the Envoy
// rate-limit front keys descriptor entries with too.
//
// Client-supplied strings are hashed, never embedded, so a key has a fixed
// length and cannot carry Redis hash-tag braces. The hash is SHA-256,
// truncated to 128 bits: a client who can choose its descriptor values
// cannot find a second value that lands in another client's counter, which
// a non-cryptographic hash would allow.
package descriptor

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/expr"
)

// Policy is what the key parts of one policy's rules share: how the client
// IP is found and how tokens are verified.
type Policy struct {
	// Index is the policy's position in its set; it selects the per-policy
	// caches of a Request.
	Index int
	IP    *IPResolver
	JWT   *JWTVerifier
	// InvalidTokenNext makes a token that is present but does not verify
	// count as absent, so that the next key alternative keys the request,
	// instead of answering 401 (jwt.onInvalidToken NextAlternative).
	InvalidTokenNext bool
}

// NewPolicy builds the extraction context of a policy. index is the
// policy's position in its set.
func NewPolicy(index int, p *config.Policy) (*Policy, error) {
	ip, err := NewIPResolver(p.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("trustedProxies: %w", err)
	}
	out := &Policy{Index: index, IP: ip}
	if p.JWT != nil {
		if out.JWT, err = NewJWTVerifier(p.JWT); err != nil {
			return nil, fmt.Errorf("jwt: %w", err)
		}
		out.InvalidTokenNext = p.JWT.OnInvalidToken == config.OnInvalidTokenNextAlternative
	}
	return out, nil
}

// Missing says what a rule does with a request that carries no complete
// key alternative.
type Missing uint8

// The OnMissingKey behaviours. The zero value is Shared, the default: no
// request escapes a rule because it lacks a key.
const (
	MissingShared Missing = iota
	MissingReject
	MissingSkip
)

type partKind uint8

const (
	kindHeader partKind = iota + 1
	kindQuery
	kindClientIP
	kindJWTClaim
	kindPath
	kindMethod
	kindExpression
	// altMarker, followed by the alternative's index, starts the hash
	// input of every alternative but the first, so that equal values
	// under different alternatives never share a counter while the first
	// alternative's keys stay what they were before alternatives existed.
	altMarker   = 0xfe
	kindMissing = 0xff
)

type part struct {
	kind partKind
	name string        // canonical header, query name or claim
	prog *expr.Program // kindExpression
	// v4, v6 are the prefix lengths a clientIP part keys by.
	v4, v6 int
}

// Extractor computes one rule's counter key. It is immutable and safe for
// concurrent use.
type Extractor struct {
	prefix  string
	policy  *Policy
	alts    [][]part
	missing Missing
}

// NewExtractor builds the extractor of rule r of policy p.
func NewExtractor(pol *Policy, p *config.Policy, r *config.Rule) (*Extractor, error) {
	e := &Extractor{prefix: p.UID + ":" + r.Name + ":", policy: pol}
	switch r.OnMissingKey {
	case "", config.OnMissingKeyShared:
		e.missing = MissingShared
	case config.OnMissingKeySkip:
		e.missing = MissingSkip
	case config.OnMissingKeyReject:
		e.missing = MissingReject
	default:
		return nil, fmt.Errorf("onMissingKey: unknown value %q", r.OnMissingKey)
	}
	field := "key"
	if len(r.Keys) > 0 {
		field = "keys"
	}
	for a, alt := range r.KeyAlternatives() {
		parts := make([]part, 0, len(alt))
		for i, k := range alt {
			at := fmt.Sprintf("%s[%d]", field, i)
			if field == "keys" {
				at = fmt.Sprintf("keys[%d][%d]", a, i)
			}
			switch {
			case k.Header != "":
				parts = append(parts, part{kind: kindHeader, name: http.CanonicalHeaderKey(k.Header)})
			case k.Query != "":
				parts = append(parts, part{kind: kindQuery, name: k.Query})
			case k.ClientIP != nil:
				pt := part{kind: kindClientIP, v4: 32, v6: config.DefaultIPv6PrefixLength}
				if n := k.ClientIP.IPv4PrefixLength; n > 0 {
					pt.v4 = int(n)
				}
				if n := k.ClientIP.IPv6PrefixLength; n > 0 {
					pt.v6 = int(n)
				}
				if pt.v4 > 32 || pt.v6 > 128 {
					return nil, fmt.Errorf("%s.clientIP: prefix lengths must be at most 32 (IPv4) and 128 (IPv6)", at)
				}
				parts = append(parts, pt)
			case k.JWTClaim != "":
				if pol.JWT == nil {
					return nil, fmt.Errorf("%s.jwtClaim: the policy has no jwt section", at)
				}
				parts = append(parts, part{kind: kindJWTClaim, name: k.JWTClaim})
			case k.Path != nil:
				parts = append(parts, part{kind: kindPath})
			case k.Method != nil:
				parts = append(parts, part{kind: kindMethod})
			case k.Expression != "":
				prog, err := expr.CompileKey(k.Expression)
				if err != nil {
					return nil, fmt.Errorf("%s.expression: %w", at, err)
				}
				parts = append(parts, part{kind: kindExpression, name: k.Expression, prog: prog})
			default:
				return nil, fmt.Errorf("%s: no part set", at)
			}
		}
		e.alts = append(e.alts, parts)
	}
	if len(e.alts) > 0xff-1 {
		return nil, fmt.Errorf("%s: too many alternatives", field)
	}
	return e, nil
}

// Prefix returns the fixed start of the rule's keys, "<uid>:<rule>:".
func (e *Extractor) Prefix() string { return e.prefix }

// AppendNormalizedPath appends to dst the form in which rules compare a
// cleaned path (match.CleanPath) and a path key part counts it: ASCII
// lower case, without a trailing slash ("/" stays "/").
func AppendNormalizedPath(dst []byte, p string) []byte {
	if len(p) > 1 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// Request is one request being keyed, with the values several rules share
// computed once. It is not safe for concurrent use; reuse it with Reset.
type Request struct {
	HTTP *http.Request
	// Path is the cleaned path (match.CleanPath).
	Path string

	ips    []netip.Addr
	ipDone []bool
	claims []jwt.MapClaims
	jwtErr []error
	jwtOK  []bool
	buf    []byte
	memo   [2]keyMemo

	// views are the per-policy inputs of CEL expressions (request.go).
	views []view
	head  head
}

// keyMemo remembers a key computed with a Request: a Request kept for a
// connection sees the same client's values request after request, and a
// key that repeats is then neither hashed nor allocated again.
type keyMemo struct {
	e        *Extractor
	material []byte
	key      string
}

// Reset prepares r for a request under a set of npolicies policies, or,
// with a nil req, ends the request: nothing it read outlives it. A request
// under far fewer policies than r's buffers hold (after a config change
// that removed policies) drops them, so that a Request kept for a
// connection does not stay at the size of the largest set it served.
func (r *Request) Reset(req *http.Request, path string, npolicies int) {
	r.HTTP, r.Path = req, path
	fit := req != nil
	r.ips = resize(r.ips, npolicies, fit)
	r.ipDone = resize(r.ipDone, npolicies, fit)
	r.claims = resize(r.claims, npolicies, fit)
	r.jwtErr = resize(r.jwtErr, npolicies, fit)
	r.jwtOK = resize(r.jwtOK, npolicies, fit)
	r.views = resize(r.views, npolicies, fit)
	r.head = head{}
}

// resize returns s with n zero values. Its elements beyond its length are
// always zero: it clears the old ones before it shortens s. With fit, it
// also drops a buffer of more than twice n (plus a little).
func resize[T any](s []T, n int, fit bool) []T {
	clear(s)
	if cap(s) < n || fit && cap(s) > 2*n+16 {
		return make([]T, n)
	}
	return s[:n]
}

// ClientIP returns the client address under a policy, computed once.
func (r *Request) ClientIP(p *Policy) netip.Addr {
	if !r.ipDone[p.Index] {
		r.ips[p.Index] = p.IP.ClientIP(r.HTTP.RemoteAddr, r.HTTP.Header)
		r.ipDone[p.Index] = true
	}
	return r.ips[p.Index]
}

// Claims returns the verified claims under a policy, or nil. err is an
// *InvalidTokenError when the request carries a token that does not
// verify; a request without a token has neither claims nor error.
func (r *Request) Claims(p *Policy) (jwt.MapClaims, error) {
	if p.JWT == nil {
		return nil, nil
	}
	if !r.jwtOK[p.Index] {
		r.claims[p.Index], r.jwtErr[p.Index] = p.JWT.Verify(r.HTTP.Header)
		r.jwtOK[p.Index] = true
	}
	return r.claims[p.Index], r.jwtErr[p.Index]
}

// MissingError reports a key part that a rule with OnMissingKey Reject
// could not read.
type MissingError struct {
	Part string
}

// Error implements error.
func (e *MissingError) Error() string { return "missing rate-limit key part: " + e.Part }

// RepeatedError reports a key part the request carries more than once: a
// header field repeated, or a query parameter. Applications read such a
// part differently (the first value, the last, or all joined), so no one
// counter is the one the application would be served on; the request is
// refused with 400, never keyed on a value of its own choosing.
type RepeatedError struct {
	Part string
}

// Error implements error.
func (e *RepeatedError) Error() string {
	return "rate-limit key part " + e.Part + " appears more than once; send it once"
}

// Key returns the rule's counter key for the request: the key of the first
// alternative whose parts the request all carries, or, when none does, what
// the rule's OnMissingKey says. ok is false when the rule is skipped. err
// is a *MissingError when the rule rejects a request without a key, a
// *RepeatedError when a part of any alternative is repeated, and an
// *InvalidTokenError when the request's bearer token does not verify and
// the token is needed: a rule never skips a request because of a bad
// token.
func (e *Extractor) Key(r *Request) (key string, ok bool, err error) {
	var badToken error
	for a, alt := range e.alts {
		buf := r.buf[:0]
		if a > 0 {
			buf = append(buf, altMarker, byte(a))
		}
		var found bool
		buf, found, err = e.appendAlt(r, alt, buf, false)
		r.buf = buf
		if found {
			return e.keyOf(r, buf), true, nil
		}
		var rep *RepeatedError
		if errors.As(err, &rep) {
			return "", false, err
		}
		if err != nil {
			if !e.policy.InvalidTokenNext {
				return "", false, err
			}
			badToken = err
		}
	}
	switch {
	case e.missing == MissingShared:
		// Every request without a key shares one value per missing part
		// of the first alternative.
		buf, _, _ := e.appendAlt(r, e.alts[0], r.buf[:0], true)
		r.buf = buf
		return e.keyOf(r, buf), true, nil
	case badToken != nil:
		return "", false, badToken
	case e.missing == MissingReject:
		return "", false, &MissingError{Part: e.firstMissing(r)}
	}
	return "", false, nil
}

// keyOf returns the counter key of the hash input material, from r's memo
// when one of its last two keys had the same material.
func (e *Extractor) keyOf(r *Request, material []byte) string {
	for i := range r.memo {
		if m := &r.memo[i]; m.e == e && string(m.material) == string(material) {
			return m.key
		}
	}
	h := Sum(material)
	key := h.Key(e.prefix)
	// Replace the older memo, reusing its buffer.
	old := r.memo[1].material
	r.memo[1] = r.memo[0]
	r.memo[0] = keyMemo{e: e, material: append(old[:0], material...), key: key}
	return key
}

// appendAlt appends the hash input of one alternative to buf. found is
// false at the first part the request lacks, unless shared, which writes
// a missing part as the shared value and carries on. err is the token's
// *InvalidTokenError when a jwtClaim part lacks its value because the
// token did not verify.
func (e *Extractor) appendAlt(r *Request, alt []part, buf []byte, shared bool) ([]byte, bool, error) {
	var bad error
	for _, p := range alt {
		start := len(buf)
		var field int
		buf, field = beginField(append(buf, byte(p.kind)))
		found := true
		switch p.kind {
		case kindHeader:
			vs := r.HTTP.Header[p.name]
			if len(vs) > 1 {
				return buf, false, &RepeatedError{Part: p.String()}
			}
			// An empty value is none: applications read the two alike
			// (Go's Header.Get, nginx's $http_ variables).
			found = len(vs) > 0 && vs[0] != ""
			if found {
				buf = append(buf, vs[0]...)
			}
		case kindQuery:
			v, n, ok := queryValue(r.HTTP.URL.RawQuery, p.name)
			if n > 1 {
				return buf, false, &RepeatedError{Part: p.String()}
			}
			found = ok
			buf = append(buf, v...)
		case kindClientIP:
			a := r.ClientIP(e.policy)
			found = a.IsValid()
			if found {
				buf = maskAddr(a, p.v4, p.v6).AppendTo(buf)
			}
		case kindJWTClaim:
			c, err := r.Claims(e.policy)
			found = c != nil
			if found {
				buf, found = claimValue(c, p.name, buf)
			} else if err != nil {
				bad = err
			}
		case kindPath:
			// As rules match it, so that "/Login/" and "/login" share a
			// counter.
			buf = AppendNormalizedPath(buf, r.Path)
		case kindMethod:
			buf = append(buf, r.HTTP.Method...)
		case kindExpression:
			buf, found = p.prog.AppendValue(buf, r.Activation(e.policy))
		}
		if !found {
			if !shared {
				return buf, false, bad
			}
			buf, field = beginField(append(buf[:start], kindMissing))
		}
		buf = endField(buf, field)
	}
	return buf, true, nil
}

// firstMissing names the first part of the first alternative that the
// request lacks.
func (e *Extractor) firstMissing(r *Request) string {
	for _, p := range e.alts[0] {
		_, found, _ := e.appendAlt(r, []part{p}, r.buf[:0], false)
		if !found {
			return p.String()
		}
	}
	return "unknown"
}

// maskAddr keeps the leading v4 or v6 bits of a, so that clients are keyed
// by network.
func maskAddr(a netip.Addr, v4, v6 int) netip.Addr {
	bits := v6
	if a.Is4() {
		bits = v4
	}
	if bits >= a.BitLen() {
		return a
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return a
	}
	return p.Addr()
}

// String names the part for error messages.
func (p part) String() string {
	switch p.kind {
	case kindHeader:
		return "header " + p.name
	case kindQuery:
		return "query parameter " + p.name
	case kindClientIP:
		return "client IP"
	case kindJWTClaim:
		return "JWT claim " + p.name
	case kindPath:
		return "path"
	case kindMethod:
		return "method"
	case kindExpression:
		return "expression " + p.name
	}
	return "unknown"
}

// queryValue returns the value of a query parameter without parsing the
// whole query, and how many times the parameter appears, counting to 2
// (an occurrence whose value does not decode counts too). ok is false
// when it appears once with a value that does not decode.
func queryValue(raw, name string) (val string, n int, ok bool) {
	for raw != "" {
		var kv string
		kv, raw, _ = strings.Cut(raw, "&")
		k, v, _ := strings.Cut(kv, "=")
		if strings.ContainsAny(k, "%+") {
			var err error
			if k, err = url.QueryUnescape(k); err != nil {
				continue
			}
		}
		if k != name {
			continue
		}
		if n++; n > 1 {
			return "", n, false
		}
		ok = true
		if strings.ContainsAny(v, "%+") {
			u, err := url.QueryUnescape(v)
			if err != nil {
				ok = false
				continue
			}
			v = u
		}
		val = v
	}
	return val, n, ok
}
