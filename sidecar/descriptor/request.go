package descriptor

import (
	"net"
	"net/url"
	"strings"

	"github.com/floodgate-dev/floodgate/sidecar/expr"
)

// The request head as the rules read it. Matching, keys and CEL
// expressions read a request only through these methods, so that a front
// end that parses requests itself can feed them without building an
// *http.Request for anything else.

// Method returns the request method.
func (r *Request) Method() string { return r.HTTP.Method }

// HeaderValues returns the values of the header with the canonical name
// (net/http's form, such as "X-Api-Key"); nil when it is absent.
func (r *Request) HeaderValues(canonical string) []string { return r.HTTP.Header[canonical] }

// RawQuery returns the query, without the '?', undecoded.
func (r *Request) RawQuery() string { return r.HTTP.URL.RawQuery }

// QueryValue returns the first value of a query parameter, decoded.
func (r *Request) QueryValue(name string) (v string, found bool) {
	r.QueryValues(name, func(s string) bool {
		v, found = s, true
		return false
	})
	return v, found
}

// QueryValues calls f with each value of a query parameter, decoded, until
// f returns false.
func (r *Request) QueryValues(name string, f func(v string) bool) {
	raw := r.RawQuery()
	for raw != "" {
		var kv string
		kv, raw, _ = strings.Cut(raw, "&")
		k, v, _ := strings.Cut(kv, "=")
		if k != name {
			if !strings.ContainsAny(k, "%+") {
				continue
			}
			u, err := url.QueryUnescape(k)
			if err != nil || u != name {
				continue
			}
		}
		if strings.ContainsAny(v, "%+") {
			u, err := url.QueryUnescape(v)
			if err != nil {
				continue
			}
			v = u
		}
		if !f(v) {
			return
		}
	}
}

// Host returns the host the request names (Host, or :authority in HTTP/2)
// in lower case, without the port, the brackets of an IPv6 literal and a
// trailing dot. It is computed once per request.
func (r *Request) Host() string {
	if !r.head.hostDone {
		r.head.host, r.head.hostDone = normalizeHost(r.HTTP.Host), true
	}
	return r.head.host
}

// normalizeHost is Host's normal form of a Host header value.
func normalizeHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	h = strings.TrimSuffix(h, ".")
	for i := 0; i < len(h); i++ {
		if c := h[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(h)
		}
	}
	return h
}

// HeadSize returns the size of the request head in bytes: method, path,
// query, and each header's name and values. It is computed once per
// request.
func (r *Request) HeadSize() int {
	if !r.head.sizeDone {
		n := len(r.HTTP.Method) + len(r.HTTP.URL.Path) + len(r.RawQuery()) + len(r.HTTP.Host)
		for k, vs := range r.HTTP.Header {
			for _, v := range vs {
				n += len(k) + len(v) + 4
			}
		}
		r.head.size, r.head.sizeDone = n, true
	}
	return r.head.size
}

// head holds what the methods above compute once per request.
type head struct {
	host     string
	hostDone bool
	size     int
	sizeDone bool
	headers  map[string]string
	query    map[string]string
}

// Activation returns the CEL activation of the request under a policy:
// the client address and the claims depend on the policy.
func (r *Request) Activation(p *Policy) *expr.Activation {
	v := &r.views[p.Index]
	if v.r == nil {
		v.r, v.p = r, p
		v.act.Reset(v)
	}
	return &v.act
}

// view is the request under one policy, as CEL expressions see it.
type view struct {
	r   *Request
	p   *Policy
	act expr.Activation

	source     string
	sourceDone bool
}

var _ expr.Input = (*view)(nil)

func (v *view) Method() string                         { return v.r.Method() }
func (v *view) Path() string                           { return v.r.Path }
func (v *view) Host() string                           { return v.r.Host() }
func (v *view) HeaderValues(canonical string) []string { return v.r.HeaderValues(canonical) }
func (v *view) QueryValue(name string) (string, bool)  { return v.r.QueryValue(name) }
func (v *view) HeadSize() int                          { return v.r.HeadSize() }

func (v *view) SourceAddress() string {
	if !v.sourceDone {
		if a := v.r.ClientIP(v.p); a.IsValid() {
			v.source = a.String()
		}
		v.sourceDone = true
	}
	return v.source
}

func (v *view) Claims() map[string]any {
	// An invalid token has no claims here; the rules that key by a claim
	// answer it (onInvalidToken).
	if c, _ := v.r.Claims(v.p); c != nil {
		return map[string]any(c)
	}
	return nil
}

func (v *view) Headers() map[string]string {
	h := &v.r.head
	if h.headers == nil {
		h.headers = make(map[string]string, len(v.r.HTTP.Header))
		for k, vs := range v.r.HTTP.Header {
			if len(vs) > 0 {
				h.headers[strings.ToLower(k)] = strings.Join(vs, ",")
			}
		}
	}
	return h.headers
}

func (v *view) Query() map[string]string {
	h := &v.r.head
	if h.query == nil {
		// The first occurrence of a name decides, as QueryValue reads it:
		// a value that does not decode makes the parameter missing.
		h.query = map[string]string{}
		var undecodable map[string]bool
		raw := v.r.RawQuery()
		for raw != "" {
			var kv string
			kv, raw, _ = strings.Cut(raw, "&")
			k, val, _ := strings.Cut(kv, "=")
			uk, err := url.QueryUnescape(k)
			if err != nil {
				continue
			}
			if _, seen := h.query[uk]; seen || undecodable[uk] {
				continue
			}
			uv, err := url.QueryUnescape(val)
			if err != nil {
				if undecodable == nil {
					undecodable = map[string]bool{}
				}
				undecodable[uk] = true
				continue
			}
			h.query[uk] = uv
		}
	}
	return h.query
}
