package descriptor

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// IPResolver finds a request's client address. The zero value, and a nil
// *IPResolver, use the socket peer and never read X-Forwarded-For.
//
// Nothing a client sends is believed unless the socket peer is inside the
// trusted CIDRs: without CIDRs, the client is the peer, whatever Hops
// says, since otherwise any client could claim any address. From a trusted
// peer, X-Forwarded-For is read and the client is the right-most entry not
// inside the CIDRs; with Hops, the Hops-th entry from the right (the
// left-most when there are fewer). With Header, the client is that
// header's address instead. An entry that is not an address is never
// believed: the resolver then answers the hop that appended it. An
// IPResolver is immutable and safe for concurrent use.
type IPResolver struct {
	cidrs  []netip.Prefix
	hops   int
	header string // canonical; empty reads X-Forwarded-For
}

// NewIPResolver builds the resolver for a policy's TrustedProxies.
func NewIPResolver(tp *config.TrustedProxies) (*IPResolver, error) {
	r := &IPResolver{}
	if tp == nil {
		return r, nil
	}
	for _, c := range tp.CIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, err
		}
		r.cidrs = append(r.cidrs, p.Masked())
	}
	r.hops = int(tp.Hops)
	if tp.Header != "" {
		r.header = http.CanonicalHeaderKey(tp.Header)
	}
	return r, nil
}

// ClientIP returns the client address of a request whose socket peer is
// remoteAddr (host:port, as http.Request.RemoteAddr). It returns the zero
// Addr when not even the peer is an IP address.
func (r *IPResolver) ClientIP(remoteAddr string, h http.Header) netip.Addr {
	peer := parseAddr(remoteAddr)
	if r == nil || len(r.cidrs) == 0 || !peer.IsValid() || !r.trusted(peer) {
		return peer
	}
	if r.header != "" {
		vs := h[r.header]
		if len(vs) != 1 {
			// Absent, or sent twice: nothing to believe.
			return peer
		}
		if a := parseAddr(strings.TrimSpace(vs[0])); a.IsValid() {
			return a
		}
		return peer
	}
	xff := h["X-Forwarded-For"]
	last := peer // the hop to the right of the entry being read
	seen := 0
	for i := len(xff) - 1; i >= 0; i-- {
		line := xff[i]
		for line != "" {
			entry := line
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				line = ""
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			a := parseAddr(entry)
			if !a.IsValid() {
				return last
			}
			seen++
			if r.hops > 0 {
				if seen == r.hops {
					return a
				}
			} else if !r.trusted(a) {
				return a
			}
			last = a
		}
	}
	return last
}

func (r *IPResolver) trusted(a netip.Addr) bool {
	for _, p := range r.cidrs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseAddr reads "ip", "ip:port", "[ip]:port" or "[ip]"; IPv4-mapped IPv6
// addresses are unmapped and zones dropped so one client has one form.
func parseAddr(s string) netip.Addr {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone("")
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap().WithZone("")
		}
	}
	return netip.Addr{}
}
