package envoyrls

import (
	"context"
	"crypto/x509"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Callers (Options.Authenticate).
//
// A request descriptor names a policy and carries the client address the
// gateway resolved; whoever may send one spends that client's counters of
// that policy. With Authenticate, only a Gateway that the policy's target
// is attached to may: the caller is the Gateway its verified client
// certificate names (config.GatewayOf), and the policy lists the Gateways
// that may ask about it (config.Policy.Gateways). The whole call is
// refused, before anything is counted, when one of its request
// descriptors is not the caller's to send.

// verifiedClient returns the leaf certificate of the caller's verified
// chain, or nil when the call did not come over TLS with a client
// certificate that the listener verified.
func verifiedClient(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0][0]
}

// authorize returns a PERMISSION_DENIED error when a request descriptor of
// req names a policy in force that does not list gateway, the caller's
// config.GatewayRef ("" when its certificate names no gateway). A request
// descriptor naming no policy in force charges nothing and passes, as it
// does without authentication.
func authorize(st *state, req *rlsv3.RateLimitRequest, gateway string) error {
	for _, d := range req.Descriptors {
		if !isRequest(d) {
			continue
		}
		name := d.Entries[0].Value
		pol := st.set.Requests.Policy(name)
		if pol == nil || (gateway != "" && pol.Allows(gateway)) {
			continue
		}
		if gateway == "" {
			return status.Errorf(codes.PermissionDenied, "the client certificate names no gateway, so it may not ask about policy %s", name)
		}
		return status.Errorf(codes.PermissionDenied, "gateway %s may not ask about policy %s: the policy's target is not attached to it", gateway, name)
	}
	return nil
}
