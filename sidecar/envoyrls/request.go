package envoyrls

import (
	"net/http"
	"net/url"
	"strings"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// Request descriptors.
//
// A descriptor whose first entry is keyed config.PolicyEntryKey is a
// request descriptor: a gateway describes one HTTP request in it and names
// the policy, "<namespace>/<name>", to decide it on. The server rebuilds
// the request (method, path and query, host, client address, and every
// other entry as a header, keyed by its name) and evaluates the policy's
// HTTP rules on it as the sidecar's proxy does (proxy.Check, through
// ruleset.Set.EvaluatePolicy): the same path cleaning, matching (hosts,
// headers, query, sourceCIDRs, when), exemptions, key alternatives, cost
// and onMissingKey. Its hits join the call's single engine decision with
// those of ordinary descriptors, so tightest wins across the call.
//
// A request that a rule rejects (a key part missing under onMissingKey
// Reject, a malformed cost header, or a token that does not verify), which
// the proxy answers 400 or 401, is OVER_LIMIT here and charges nothing:
// the rate-limit API has no other refusal, and an error would let Envoy
// admit the request. A request descriptor naming no policy in force gets a
// bare OK, as a descriptor of an unknown domain does.

// isRequest reports whether d is a request descriptor.
func isRequest(d *rlcommonv3.RateLimitDescriptor) bool {
	return len(d.Entries) > 0 && d.Entries[0].Key == config.PolicyEntryKey
}

// httpView is one request descriptor rebuilt as the HTTP request it
// describes; a scratch keeps one and reuses it call after call.
type httpView struct {
	r    http.Request
	u    url.URL
	h    http.Header
	vals []string // backing of h's values
	// canon memoizes the canonical form of entry keys: a gateway sends
	// the same few header names call after call.
	canon map[string]string
	eval  ruleset.Scratch
}

// maxCanon bounds httpView.canon.
const maxCanon = 256

// fill rebuilds the request that d describes.
func (hv *httpView) fill(d *rlcommonv3.RateLimitDescriptor) {
	if hv.h == nil {
		hv.h = http.Header{}
		hv.canon = map[string]string{}
		hv.r = http.Request{URL: &hv.u, Header: hv.h}
	}
	clear(hv.h)
	hv.vals = hv.vals[:0]
	// Only the fields fill sets are reset: zeroing the whole
	// http.Request, pointers and all, cost about 5% of a decision.
	hv.u.Path, hv.u.RawQuery = "", ""
	hv.r.Method, hv.r.Host, hv.r.RemoteAddr = "", "", ""
	for _, e := range d.Entries[1:] {
		switch e.Key {
		case config.MethodEntryKey:
			hv.r.Method = e.Value
		case config.PathEntryKey:
			p, q, _ := strings.Cut(e.Value, "?")
			hv.u.RawQuery = q
			hv.u.Path = p
			if strings.IndexByte(p, '%') >= 0 {
				// The proxy sees the decoded path, as net/http does.
				if dec, err := url.PathUnescape(p); err == nil {
					hv.u.Path = dec
				}
			}
		case config.AuthorityEntryKey:
			hv.r.Host = e.Value
		case config.RemoteAddressEntryKey:
			hv.r.RemoteAddr = e.Value
		default:
			k := hv.canonical(e.Key)
			if vs, ok := hv.h[k]; ok {
				hv.h[k] = append(vs, e.Value)
				continue
			}
			at := len(hv.vals)
			hv.vals = append(hv.vals, e.Value)
			hv.h[k] = hv.vals[at : at+1 : at+1]
		}
	}
}

func (hv *httpView) canonical(key string) string {
	if c, ok := hv.canon[key]; ok {
		return c
	}
	c := http.CanonicalHeaderKey(key)
	if len(hv.canon) >= maxCanon {
		clear(hv.canon)
	}
	hv.canon[strings.Clone(key)] = c
	return c
}

// requestHits decides request descriptor i of the call on its policy's
// rules and appends a hit for every rule that matches, does not exempt the
// request and keys it. It reports whether a rule rejects the request, in
// which case it appends nothing.
func (s *Server) requestHits(st *state, i int, d *rlcommonv3.RateLimitDescriptor, sc *scratch) (rejected bool) {
	pol := st.set.Requests.Policy(d.Entries[0].Value)
	if pol == nil {
		return false
	}
	hv := &sc.http
	hv.fill(d)
	ev := &hv.eval
	ev.Request.Reset(&hv.r, match.MatchPath(hv.u.Path), st.set.Policies)
	if err := st.set.EvaluatePolicy(pol, ev); err != nil {
		return true
	}
	for k := range ev.Hits {
		sc.hits = append(sc.hits, ev.Hits[k])
		sc.owner = append(sc.owner, int32(i))
		sc.hrule = append(sc.hrule, st.set.Requests.Reported(ev.Rules[k]))
	}
	return false
}

// requestEvent returns what a deny event says of request descriptor d:
// the request's method, path and client address.
func requestEvent(d *rlcommonv3.RateLimitDescriptor) (method, path, client string) {
	for _, e := range d.Entries[1:] {
		switch e.Key {
		case config.MethodEntryKey:
			method = e.Value
		case config.PathEntryKey:
			path, _, _ = strings.Cut(e.Value, "?")
		case config.RemoteAddressEntryKey:
			client = e.Value
		}
	}
	return method, path, client
}
