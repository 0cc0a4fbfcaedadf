// Package pki issues the certificates floodgate-manager keeps: a
// self-signed CA and the leaf certificates it signs (a TLS server's, a TLS
// client's), in PEM as Secrets hold them. It is pure apart from the random
// source: time is a parameter, and nothing is read or written.
//
// Keys are ECDSA P-256. A certificate's NotBefore is backdated a little
// (at most a tenth of its lifetime, at most a minute), so that a peer
// whose clock is slightly behind accepts a new one.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"time"
)

// backdate moves NotBefore into the past by this much, at most a tenth of
// the lifetime.
const backdate = time.Minute

// NotBefore is the NotBefore of a certificate issued at now for lifetime.
func NotBefore(now time.Time, lifetime time.Duration) time.Time {
	return now.Add(-min(backdate, lifetime/10))
}

// RenewAt is when a certificate is due for renewal: at two thirds of its
// validity.
func RenewAt(c *x509.Certificate) time.Time {
	return c.NotAfter.Add(-c.NotAfter.Sub(c.NotBefore) / 3)
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generate a serial number: %w", err)
	}
	return n, nil
}

// NewCA creates a self-signed CA named commonName, valid from now for
// lifetime, that signs leaf certificates only (path length zero).
func NewCA(commonName string, now time.Time, lifetime time.Duration) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate the CA key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"floodgate"}},
		NotBefore:             NotBefore(now, lifetime),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse the CA certificate: %w", err)
	}
	return cert, key, nil
}

// Usage is what a leaf certificate authenticates.
type Usage int

// The usages.
const (
	// Server authenticates a TLS server (ExtKeyUsageServerAuth).
	Server Usage = iota + 1
	// Client authenticates a TLS client (ExtKeyUsageClientAuth).
	Client
)

// Leaf says what a leaf certificate names.
type Leaf struct {
	// CommonName is the subject's common name.
	CommonName string
	// Hosts are DNS names and IP addresses (subject alternative names).
	Hosts []string
	// URIs are URI subject alternative names, such as a SPIFFE ID.
	URIs []string
	// Usage is Server or Client; a certificate has exactly one.
	Usage Usage
}

// Validate reports what Issue cannot work with.
func (l Leaf) Validate() error {
	if l.CommonName == "" {
		return errors.New("a leaf certificate needs a common name")
	}
	if l.Usage != Server && l.Usage != Client {
		return fmt.Errorf("a leaf certificate is for a server or a client, got usage %d", l.Usage)
	}
	if l.Usage == Server && len(l.Hosts) == 0 {
		return errors.New("a server certificate needs at least one host")
	}
	for _, u := range l.URIs {
		if _, err := url.Parse(u); err != nil {
			return fmt.Errorf("URI %q: %w", u, err)
		}
	}
	return nil
}

// Issue creates the leaf certificate l, signed by ca, valid from now for
// lifetime.
func Issue(ca *x509.Certificate, caKey crypto.Signer, l Leaf, now time.Time, lifetime time.Duration) (*x509.Certificate, crypto.Signer, error) {
	if err := l.Validate(); err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate a leaf key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	usage := x509.ExtKeyUsageServerAuth
	if l.Usage == Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: l.CommonName, Organization: []string{"floodgate"}},
		NotBefore:    NotBefore(now, lifetime),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	for _, s := range l.URIs {
		u, err := url.Parse(s)
		if err != nil {
			return nil, nil, fmt.Errorf("URI %q: %w", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign the certificate of %s: %w", l.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse the certificate of %s: %w", l.CommonName, err)
	}
	return cert, key, nil
}

// Names reports whether c is the leaf certificate l describes: its common
// name, hosts, URIs and usage, whatever their order.
func Names(c *x509.Certificate, l Leaf) bool {
	if c == nil || c.Subject.CommonName != l.CommonName {
		return false
	}
	have := slices.Clone(c.DNSNames)
	for _, ip := range c.IPAddresses {
		have = append(have, ip.String())
	}
	want := make([]string, 0, len(l.Hosts))
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			h = ip.String()
		}
		want = append(want, h)
	}
	if !sameSet(have, want) {
		return false
	}
	uris := make([]string, 0, len(c.URIs))
	for _, u := range c.URIs {
		uris = append(uris, u.String())
	}
	if !sameSet(uris, slices.Clone(l.URIs)) {
		return false
	}
	usage := x509.ExtKeyUsageServerAuth
	if l.Usage == Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	return slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{usage})
}

func sameSet(a, b []string) bool {
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// SignedByAny reports whether one of cas signed c.
func SignedByAny(c *x509.Certificate, cas []*x509.Certificate) bool {
	return slices.ContainsFunc(cas, func(ca *x509.Certificate) bool { return c.CheckSignatureFrom(ca) == nil })
}

// CertPEM encodes certs as PEM CERTIFICATE blocks, in order.
func CertPEM(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// KeyPEM encodes k as a PEM PKCS #8 PRIVATE KEY block.
func KeyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("marshal a private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseCerts reads every CERTIFICATE block of data, skipping what does
// not parse.
func ParseCerts(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// ParseKey reads the first PEM block of data as a private key (PKCS #8,
// SEC 1 or PKCS #1), or returns nil.
func ParseKey(data []byte) crypto.Signer {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil
	}
	var k any
	var err error
	switch b.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		return nil
	}
	if err != nil {
		return nil
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil
	}
	return s
}

// Matches reports whether key is c's private key.
func Matches(c *x509.Certificate, key crypto.Signer) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	pub, ok := key.Public().(equaler)
	return ok && pub.Equal(c.PublicKey)
}
