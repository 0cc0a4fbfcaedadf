package webhookcert

import (
	"crypto"
	"crypto/x509"
	"net"
	"slices"
	"time"

	"github.com/floodgate-dev/floodgate/internal/pki"
)

// Bundle is the certificate state kept in the Secret.
type Bundle struct {
	// CA is the current CA, which signs new serving certificates; nil
	// when missing, unreadable, or not matching CAKey.
	CA *x509.Certificate
	// CAKey is CA's private key.
	CAKey crypto.Signer
	// Trusted is the caBundle: CA first, then earlier CAs kept while a
	// serving certificate they signed may still be in use.
	Trusted []*x509.Certificate
	// Serving is the serving certificate; nil when missing, unreadable,
	// or not matching ServingKey.
	Serving *x509.Certificate
	// ServingKey is Serving's private key.
	ServingKey crypto.Signer
	// CARolledAt is when CA joined the caBundle.
	CARolledAt time.Time
	// ServingIssuedAt is when Serving was issued.
	ServingIssuedAt time.Time
}

// Policy says how long certificates live and how rotations are staged.
type Policy struct {
	// CALifetime and ServingLifetime are the certificates' validity.
	CALifetime, ServingLifetime time.Duration
	// Propagation is how long a change must have been published before
	// the next stage relies on it: a new CA is in the caBundle for this
	// long before it signs the serving certificate, and a new serving
	// certificate is on every replica's disk for this long before the
	// previous CA leaves the caBundle. It must exceed the time the API
	// servers take to see a caBundle change plus the time every replica
	// takes to load a new certificate (its sync interval plus the
	// certwatcher's poll).
	Propagation time.Duration
	// Hosts are the serving certificate's DNS names and IP addresses.
	Hosts []string
}

// Decision is one step of Plan.
type Decision struct {
	// NewCA asks for a new CA. When Staged, it joins the caBundle ahead of
	// the old ones and signs nothing until Propagation has passed;
	// otherwise (no usable CA) it replaces them at once.
	NewCA  bool
	Staged bool
	// NewServing asks for a new serving certificate from the current CA.
	NewServing bool
	// DropOld removes every CA but the current one from the caBundle.
	DropOld bool
	// Reason explains the decision, for logs.
	Reason string
}

// Changes reports whether d asks for anything.
func (d Decision) Changes() bool { return d.NewCA || d.NewServing || d.DropOld }

// Plan decides the next step for b at now. It is pure; the caller applies
// the decision and plans again until nothing changes. rotate is a
// requested rotation of the whole chain, staged like a scheduled one.
func Plan(b Bundle, now time.Time, p Policy, rotate bool) Decision {
	if b.CA == nil || !now.Before(b.CA.NotAfter) {
		return Decision{NewCA: true, NewServing: true, Reason: "no usable CA"}
	}
	servingOK := b.Serving != nil && now.Before(b.Serving.NotAfter) &&
		pki.SignedByAny(b.Serving, b.Trusted) && sameHosts(b.Serving, p.Hosts)
	if !servingOK {
		return Decision{NewServing: true, Reason: "no usable serving certificate for " + joinHosts(p.Hosts)}
	}
	signedByCurrent := b.Serving.CheckSignatureFrom(b.CA) == nil
	if signedByCurrent && (rotate || !now.Before(pki.RenewAt(b.CA))) {
		reason := "the CA is due for renewal"
		if rotate {
			reason = "a rotation was requested"
		}
		return Decision{NewCA: true, Staged: true, Reason: reason}
	}
	if !signedByCurrent {
		if !now.Before(b.CARolledAt.Add(p.Propagation)) {
			return Decision{NewServing: true, Reason: "the new CA has been published for the propagation period"}
		}
		return Decision{}
	}
	if !now.Before(pki.RenewAt(b.Serving)) {
		return Decision{NewServing: true, Reason: "the serving certificate is due for renewal"}
	}
	if len(b.Trusted) > 1 && !now.Before(b.ServingIssuedAt.Add(p.Propagation)) {
		return Decision{DropOld: true, Reason: "every replica serves a certificate of the current CA"}
	}
	return Decision{}
}

// Next is when b next needs a Plan, assuming Plan(b, now, ...) asks for
// nothing: the next renewal, expiry, or end of a propagation period that
// is waited for. It is zero for an empty bundle.
func Next(b Bundle, p Policy) time.Time {
	if b.CA == nil || b.Serving == nil {
		return time.Time{}
	}
	t := []time.Time{b.CA.NotAfter, b.Serving.NotAfter}
	if b.Serving.CheckSignatureFrom(b.CA) != nil {
		// Waiting for the new CA to propagate; nothing else can happen
		// first.
		t = append(t, b.CARolledAt.Add(p.Propagation))
	} else {
		t = append(t, pki.RenewAt(b.CA), pki.RenewAt(b.Serving))
		if len(b.Trusted) > 1 {
			t = append(t, b.ServingIssuedAt.Add(p.Propagation))
		}
	}
	return slices.MinFunc(t, func(a, b time.Time) int { return a.Compare(b) })
}

// sameHosts reports whether c names exactly hosts.
func sameHosts(c *x509.Certificate, hosts []string) bool {
	if c == nil {
		return false
	}
	have := slices.Clone(c.DNSNames)
	for _, ip := range c.IPAddresses {
		have = append(have, ip.String())
	}
	want := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			h = ip.String()
		}
		want = append(want, h)
	}
	slices.Sort(have)
	slices.Sort(want)
	return slices.Equal(slices.Compact(have), slices.Compact(want))
}

func joinHosts(hosts []string) string {
	s := ""
	for i, h := range hosts {
		if i > 0 {
			s += ", "
		}
		s += h
	}
	return s
}
