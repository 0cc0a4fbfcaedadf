package rlsidentity

import (
	"crypto"
	"crypto/x509"
	"slices"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/internal/pki"
)

// Leaf is a leaf certificate in use and its key.
type Leaf struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// State is the certificates as the Secrets hold them.
type State struct {
	// CA is the current CA, which signs new certificates; nil when
	// missing, unreadable, or not matching CAKey.
	CA *x509.Certificate
	// CAKey is CA's private key.
	CAKey crypto.Signer
	// Trusted is the bundle every party trusts: CA first, then earlier
	// CAs kept while a certificate they signed may still be in use.
	Trusted []*x509.Certificate
	// CARolledAt is when CA joined the bundle.
	CARolledAt time.Time
	// LastIssuedAt is when a certificate was last issued.
	LastIssuedAt time.Time
	// Leaves are the leaf certificates by id (see Manager): the serving
	// certificate and each gateway's client certificate. A missing,
	// unreadable or mismatched one is absent.
	Leaves map[string]Leaf
}

// Policy says how long certificates live and how rotations are staged.
type Policy struct {
	// CALifetime and LeafLifetime are the certificates' validity.
	CALifetime, LeafLifetime time.Duration
	// Propagation is how long a change must have been published before
	// the next stage relies on it: a new CA is in every bundle for this
	// long before it signs a certificate, and the certificates it signed
	// are out for this long before the previous CA leaves the bundles.
	// It must exceed the time the kubelet takes to update a Secret volume
	// (its sync period plus its cache TTL, about a minute and a half by
	// default) plus the time the parties take to read the files again
	// (the central service: at its next handshake; Envoy: at once, it
	// watches the directory).
	Propagation time.Duration
}

// Decision is one step of Plan.
type Decision struct {
	// NewCA asks for a new CA. When Staged it joins the bundle ahead of
	// the old ones and signs nothing until Propagation has passed;
	// otherwise (no usable CA) it replaces them at once.
	NewCA, Staged bool
	// Issue lists, sorted, the leaves to issue from the current CA.
	Issue []string
	// DropOld removes every CA but the current one from the bundle.
	DropOld bool
	// Reason explains the decision, for logs.
	Reason string
}

// Changes reports whether d asks for anything.
func (d Decision) Changes() bool { return d.NewCA || len(d.Issue) > 0 || d.DropOld }

// Plan decides the next step for s at now, given the leaves wanted by id.
// It is pure; the caller applies the decision and plans again until
// nothing changes. rotate is a requested rotation of the whole chain,
// staged like a scheduled one.
//
// A CA rotation goes in three stages, each after Propagation, so that at
// every moment each party's certificate is signed by a CA the other
// parties trust, however far behind each one's files are (by less than
// Propagation): the new CA joins the bundle; then every leaf is reissued
// by it; then the old CA leaves the bundle. A leaf that is due is simply
// reissued: the bundle already trusts its CA.
func Plan(s State, want map[string]pki.Leaf, now time.Time, p Policy, rotate bool) Decision {
	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range want {
			if !yield(id) {
				return
			}
		}
	})
	if s.CA == nil || !now.Before(s.CA.NotAfter) {
		return Decision{NewCA: true, Issue: ids, Reason: "no usable CA"}
	}
	var unusable, stale, due []string
	for _, id := range ids {
		l, ok := s.Leaves[id]
		if !ok || l.Cert == nil || !now.Before(l.Cert.NotAfter) || !pki.SignedByAny(l.Cert, s.Trusted) || !pki.Names(l.Cert, want[id]) {
			unusable = append(unusable, id)
			continue
		}
		if l.Cert.CheckSignatureFrom(s.CA) != nil {
			stale = append(stale, id)
		} else if !now.Before(pki.RenewAt(l.Cert)) {
			due = append(due, id)
		}
	}
	switch {
	case len(unusable) > 0:
		return Decision{Issue: unusable, Reason: "no usable certificate for " + strings.Join(unusable, ", ")}
	case len(stale) > 0:
		if !now.Before(s.CARolledAt.Add(p.Propagation)) {
			return Decision{Issue: stale, Reason: "the new CA has been published for the propagation period"}
		}
		return Decision{}
	case rotate || !now.Before(pki.RenewAt(s.CA)):
		reason := "the CA is due for renewal"
		if rotate {
			reason = "a rotation was requested"
		}
		return Decision{NewCA: true, Staged: true, Reason: reason}
	case len(due) > 0:
		return Decision{Issue: due, Reason: "due for renewal: " + strings.Join(due, ", ")}
	case len(s.Trusted) > 1 && !now.Before(s.LastIssuedAt.Add(p.Propagation)):
		return Decision{DropOld: true, Reason: "every certificate in use is the current CA's"}
	}
	return Decision{}
}

// Next is when s next needs a Plan, assuming Plan(s, want, now, ...)
// asks for nothing: the next renewal, expiry, or end of a propagation
// period that is waited for. It is zero when s has no CA.
func Next(s State, want map[string]pki.Leaf, p Policy) time.Time {
	if s.CA == nil {
		return time.Time{}
	}
	t := []time.Time{s.CA.NotAfter}
	stale := false
	for id := range want {
		l, ok := s.Leaves[id]
		if !ok || l.Cert == nil {
			return time.Time{}
		}
		t = append(t, l.Cert.NotAfter)
		if l.Cert.CheckSignatureFrom(s.CA) != nil {
			stale = true
		} else {
			t = append(t, pki.RenewAt(l.Cert))
		}
	}
	if stale {
		// Waiting for the new CA to propagate; nothing else can happen
		// first.
		t = append(t, s.CARolledAt.Add(p.Propagation))
	} else {
		t = append(t, pki.RenewAt(s.CA))
		if len(s.Trusted) > 1 {
			t = append(t, s.LastIssuedAt.Add(p.Propagation))
		}
	}
	return slices.MinFunc(t, func(a, b time.Time) int { return a.Compare(b) })
}

// apply carries out d on s at now. It does not modify s's slices or map.
func apply(s State, d Decision, want map[string]pki.Leaf, now time.Time, p Policy) (State, error) {
	if d.NewCA {
		ca, key, err := pki.NewCA(caName(now), now, p.CALifetime)
		if err != nil {
			return s, err
		}
		// Earlier CAs still valid stay trusted until DropOld: a
		// certificate they signed may be in use.
		trusted := []*x509.Certificate{ca}
		for _, c := range s.Trusted {
			if now.Before(c.NotAfter) {
				trusted = append(trusted, c)
			}
		}
		s.CA, s.CAKey, s.Trusted, s.CARolledAt = ca, key, trusted, now
	}
	if len(d.Issue) > 0 {
		leaves := make(map[string]Leaf, len(s.Leaves)+len(d.Issue))
		for id, l := range s.Leaves {
			leaves[id] = l
		}
		for _, id := range d.Issue {
			cert, key, err := pki.Issue(s.CA, s.CAKey, want[id], now, p.LeafLifetime)
			if err != nil {
				return s, err
			}
			leaves[id] = Leaf{Cert: cert, Key: key}
		}
		s.Leaves, s.LastIssuedAt = leaves, now
	}
	if d.DropOld {
		s.Trusted = []*x509.Certificate{s.CA}
	}
	return s, nil
}
