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
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/golang-jwt/jwt/v5"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Policy is what the key parts of one policy's rules share: how the client
// IP is found and how tokens are verified.
type Policy struct {
	// Index is the policy's position in its set; it selects the per-policy
	// caches of a Request.
	Index int
	IP    *IPResolver
	JWT   *JWTVerifier
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
	}
	return out, nil
}

// Missing says what a rule does when a key part is absent.
type Missing uint8

// The OnMissingKey behaviours.
const (
	MissingSkip Missing = iota
	MissingShared
	MissingReject
)

type partKind uint8

const (
	kindHeader partKind = iota + 1
	kindQuery
	kindClientIP
	kindJWTClaim
	kindPath
	kindMethod
	kindMissing = 0xff
)

type part struct {
	kind partKind
	name string // canonical header, query name or claim
}

// Extractor computes one rule's counter key. It is immutable and safe for
// concurrent use.
type Extractor struct {
	prefix  string
	policy  *Policy
	parts   []part
	missing Missing
}

// NewExtractor builds the extractor of rule r of policy p.
func NewExtractor(pol *Policy, p *config.Policy, r *config.Rule) (*Extractor, error) {
	e := &Extractor{prefix: p.UID + ":" + r.Name + ":", policy: pol}
	switch r.OnMissingKey {
	case "", config.OnMissingKeySkip:
		e.missing = MissingSkip
	case config.OnMissingKeyShared:
		e.missing = MissingShared
	case config.OnMissingKeyReject:
		e.missing = MissingReject
	default:
		return nil, fmt.Errorf("onMissingKey: unknown value %q", r.OnMissingKey)
	}
	for i, k := range r.Key {
		switch {
		case k.Header != "":
			e.parts = append(e.parts, part{kind: kindHeader, name: http.CanonicalHeaderKey(k.Header)})
		case k.Query != "":
			e.parts = append(e.parts, part{kind: kindQuery, name: k.Query})
		case k.ClientIP != nil:
			e.parts = append(e.parts, part{kind: kindClientIP})
		case k.JWTClaim != "":
			if pol.JWT == nil {
				return nil, fmt.Errorf("key[%d].jwtClaim: the policy has no jwt section", i)
			}
			e.parts = append(e.parts, part{kind: kindJWTClaim, name: k.JWTClaim})
		case k.Path != nil:
			e.parts = append(e.parts, part{kind: kindPath})
		case k.Method != nil:
			e.parts = append(e.parts, part{kind: kindMethod})
		default:
			return nil, fmt.Errorf("key[%d]: no part set", i)
		}
	}
	return e, nil
}

// Prefix returns the fixed start of the rule's keys, "<uid>:<rule>:".
func (e *Extractor) Prefix() string { return e.prefix }

// Request is one request being keyed, with the values several rules share
// computed once. It is not safe for concurrent use; reuse it with Reset.
type Request struct {
	HTTP *http.Request
	// Path is the cleaned path (match.CleanPath).
	Path string

	ips    []netip.Addr
	ipDone []bool
	claims []jwt.MapClaims
	jwtOK  []bool
	buf    []byte
	memo   [2]keyMemo
}

// keyMemo remembers a key computed with a Request: a Request kept for a
// connection sees the same client's values request after request, and a
// key that repeats is then neither hashed nor allocated again.
type keyMemo struct {
	e        *Extractor
	material []byte
	key      string
}

// Reset prepares r for a request under a set of npolicies policies.
func (r *Request) Reset(req *http.Request, path string, npolicies int) {
	r.HTTP, r.Path = req, path
	r.ips = resize(r.ips, npolicies)
	r.ipDone = resize(r.ipDone, npolicies)
	r.claims = resize(r.claims, npolicies)
	r.jwtOK = resize(r.jwtOK, npolicies)
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// ClientIP returns the client address under a policy, computed once.
func (r *Request) ClientIP(p *Policy) netip.Addr {
	if !r.ipDone[p.Index] {
		r.ips[p.Index] = p.IP.ClientIP(r.HTTP.RemoteAddr, r.HTTP.Header)
		r.ipDone[p.Index] = true
	}
	return r.ips[p.Index]
}

// Claims returns the verified claims under a policy, or nil.
func (r *Request) Claims(p *Policy) jwt.MapClaims {
	if p.JWT == nil {
		return nil
	}
	if !r.jwtOK[p.Index] {
		r.claims[p.Index] = p.JWT.Claims(r.HTTP.Header)
		r.jwtOK[p.Index] = true
	}
	return r.claims[p.Index]
}

// MissingError reports a key part that a rule with OnMissingKey Reject
// could not read.
type MissingError struct {
	Part string
}

// Error implements error.
func (e *MissingError) Error() string { return "missing rate-limit key part: " + e.Part }

// Key returns the rule's counter key for the request. ok is false when a
// part is missing and the rule is skipped; err is a *MissingError when a
// part is missing and the rule rejects.
func (e *Extractor) Key(r *Request) (key string, ok bool, err error) {
	buf := r.buf[:0]
	for _, p := range e.parts {
		start := len(buf)
		var field int
		buf, field = beginField(append(buf, byte(p.kind)))
		found := true
		switch p.kind {
		case kindHeader:
			vs := r.HTTP.Header[p.name]
			found = len(vs) > 0
			for i, v := range vs {
				if i > 0 {
					buf = append(buf, ',')
				}
				buf = append(buf, v...)
			}
		case kindQuery:
			var v string
			v, found = queryValue(r.HTTP.URL.RawQuery, p.name)
			buf = append(buf, v...)
		case kindClientIP:
			a := r.ClientIP(e.policy)
			found = a.IsValid()
			if found {
				buf = a.AppendTo(buf)
			}
		case kindJWTClaim:
			c := r.Claims(e.policy)
			found = c != nil
			if found {
				buf, found = claimValue(c, p.name, buf)
			}
		case kindPath:
			buf = append(buf, r.Path...)
		case kindMethod:
			buf = append(buf, r.HTTP.Method...)
		}
		if !found {
			switch e.missing {
			case MissingSkip:
				r.buf = buf
				return "", false, nil
			case MissingReject:
				r.buf = buf
				return "", false, &MissingError{Part: p.String()}
			}
			// Shared: every request missing this part shares one value.
			buf, field = beginField(append(buf[:start], kindMissing))
		}
		buf = endField(buf, field)
	}
	r.buf = buf
	for i := range r.memo {
		if m := &r.memo[i]; m.e == e && string(m.material) == string(buf) {
			return m.key, true, nil
		}
	}
	h := Sum(buf)
	key = h.Key(e.prefix)
	// Replace the older memo, reusing its buffer.
	old := r.memo[1].material
	r.memo[1] = r.memo[0]
	r.memo[0] = keyMemo{e: e, material: append(old[:0], buf...), key: key}
	return key, true, nil
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
	}
	return "unknown"
}

// queryValue returns the first value of a query parameter without parsing
// the whole query.
func queryValue(raw, name string) (string, bool) {
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
		if strings.ContainsAny(v, "%+") {
			u, err := url.QueryUnescape(v)
			if err != nil {
				return "", false
			}
			v = u
		}
		return v, true
	}
	return "", false
}
