// Package envoyemu computes, for tests, the rate-limit descriptors that
// Envoy's rate-limit filter sends for a request, from a route's
// rate_limits entries: no Envoy binary can be had here, so the round trip
// from generated gateway configuration to the central rate-limit service's
// answer is checked with this model of Envoy's descriptor population
// (source/common/router/router_ratelimit.cc, Envoy 1.3x):
//
//   - an entry applies when its stage equals the filter's;
//   - its actions run in order, each appending one descriptor entry; an
//     action that cannot produce one drops the whole descriptor, except a
//     request_headers action with skip_if_absent, which only drops its
//     entry;
//   - generic_key gives (descriptor_key or "generic_key",
//     descriptor_value); request_headers the first value of the header,
//     pseudo-headers included (:authority, :method, :path with the query,
//     :scheme); remote_address ("remote_address", the client address).
//
// Actions the model does not know are an error, so that a test never
// passes on a descriptor Envoy would build differently.
package envoyemu

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Request is what Envoy knows of a request when it rate-limits it.
type Request struct {
	Method string
	// Target is the request-target: the path with its query.
	Target string
	// Authority is the :authority (Host).
	Authority string
	// Scheme is http or https; empty means http.
	Scheme string
	// Headers are the request's headers.
	Headers http.Header
	// Client is the client address as Envoy resolved it (the peer, or
	// the trusted X-Forwarded-For hop).
	Client netip.Addr
}

// header returns the first value of a header, pseudo-headers included.
func (r *Request) header(name string) (string, bool) {
	switch strings.ToLower(name) {
	case ":authority", "host":
		return r.Authority, r.Authority != ""
	case ":method":
		return r.Method, r.Method != ""
	case ":path":
		return r.Target, r.Target != ""
	case ":scheme":
		if r.Scheme == "" {
			return "http", true
		}
		return r.Scheme, true
	}
	vs := r.Headers.Values(name)
	if len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// Descriptors returns the descriptors a rate-limit filter of the given
// stage sends for r on a route with rate_limits rls.
func Descriptors(rls []*routev3.RateLimit, stage uint32, r *Request) ([]*rlcommonv3.RateLimitDescriptor, error) {
	var out []*rlcommonv3.RateLimitDescriptor
	for i, rl := range rls {
		if rl.GetStage().GetValue() != stage {
			continue
		}
		d := &rlcommonv3.RateLimitDescriptor{}
		ok := true
		for j, a := range rl.GetActions() {
			var key, value string
			produced := true
			switch spec := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_GenericKey_:
				key = spec.GenericKey.GetDescriptorKey()
				if key == "" {
					key = "generic_key"
				}
				value = spec.GenericKey.GetDescriptorValue()
			case *routev3.RateLimit_Action_RequestHeaders_:
				rh := spec.RequestHeaders
				v, found := r.header(rh.GetHeaderName())
				switch {
				case found:
					key, value = rh.GetDescriptorKey(), v
				case rh.GetSkipIfAbsent():
					produced = false
				default:
					ok = false
				}
			case *routev3.RateLimit_Action_RemoteAddress_:
				if !r.Client.IsValid() {
					ok = false
					break
				}
				key, value = "remote_address", r.Client.String()
			default:
				return nil, fmt.Errorf("rate_limits[%d].actions[%d]: the model does not know %T", i, j, spec)
			}
			if !ok {
				break
			}
			if produced {
				d.Entries = append(d.Entries, &rlcommonv3.RateLimitDescriptor_Entry{Key: key, Value: value})
			}
		}
		if ok && len(d.Entries) > 0 {
			out = append(out, d)
		}
	}
	return out, nil
}

// Call returns the call the filter makes for r, or nil when it makes
// none (no descriptor).
func Call(domain string, rls []*routev3.RateLimit, stage uint32, r *Request) (*rlsv3.RateLimitRequest, error) {
	ds, err := Descriptors(rls, stage, r)
	if err != nil || len(ds) == 0 {
		return nil, err
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}, nil
}
