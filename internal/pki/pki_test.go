package pki

import (
	"crypto/x509"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// A leaf verifies against its CA for its own usage only, names what it
// was issued for, and survives a PEM round trip.
func TestIssue(t *testing.T) {
	t.Parallel()
	ca, caKey, err := NewCA("ca", t0, 10*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ca.NotBefore, t0.Add(-time.Minute); !got.Equal(want) {
		t.Errorf("CA NotBefore = %v, want %v (backdated a minute)", got, want)
	}
	server := Leaf{CommonName: "svc", Hosts: []string{"svc.ns.svc", "127.0.0.1"}, Usage: Server}
	client := Leaf{CommonName: "ns/gw", URIs: []string{"spiffe://floodgate.dev/ns/ns/gateway/gw"}, Usage: Client}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, tc := range []struct {
		leaf  Leaf
		usage x509.ExtKeyUsage
		other x509.ExtKeyUsage
	}{
		{server, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		{client, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	} {
		c, key, err := Issue(ca, caKey, tc.leaf, t0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if !Names(c, tc.leaf) {
			t.Errorf("%s: Names = false for its own leaf", tc.leaf.CommonName)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
			t.Errorf("%s: does not verify for its usage: %v", tc.leaf.CommonName, err)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{tc.other}}); err == nil {
			t.Errorf("%s: verifies for the other usage", tc.leaf.CommonName)
		}
		if got, want := RenewAt(c), t0.Add(time.Hour-61*time.Minute/3); !got.Equal(want) {
			t.Errorf("%s: RenewAt = %v, want %v (two thirds of the validity)", tc.leaf.CommonName, got, want)
		}
		kp, err := KeyPEM(key)
		if err != nil {
			t.Fatal(err)
		}
		certs := ParseCerts(append(CertPEM(c, ca), "garbage"...))
		if len(certs) != 2 || !certs[0].Equal(c) || !Matches(certs[0], ParseKey(kp)) || Matches(ca, ParseKey(kp)) {
			t.Errorf("%s: the PEM round trip lost the pair", tc.leaf.CommonName)
		}
		if !SignedByAny(c, []*x509.Certificate{certs[1]}) {
			t.Errorf("%s: SignedByAny(its CA) = false", tc.leaf.CommonName)
		}
	}
	c, _, err := Issue(ca, caKey, server, t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []Leaf{
		{CommonName: "svc", Hosts: []string{"svc.ns.svc"}, Usage: Server},
		{CommonName: "svc", Hosts: []string{"127.0.0.1", "svc.ns.svc"}, Usage: Client},
		{CommonName: "other", Hosts: []string{"127.0.0.1", "svc.ns.svc"}, Usage: Server},
		{CommonName: "svc", Hosts: []string{"127.0.0.1", "svc.ns.svc"}, URIs: []string{"spiffe://x/y"}, Usage: Server},
	} {
		if Names(c, other) {
			t.Errorf("Names(%+v) = true for a certificate of %+v", other, server)
		}
	}
	for _, bad := range []Leaf{{Hosts: []string{"x"}, Usage: Server}, {CommonName: "x", Usage: Server}, {CommonName: "x"}} {
		if _, _, err := Issue(ca, caKey, bad, t0, time.Hour); err == nil {
			t.Errorf("Issue(%+v) succeeded", bad)
		}
	}
	if ParseKey([]byte("nothing")) != nil {
		t.Error("ParseKey made a key of garbage")
	}
}
