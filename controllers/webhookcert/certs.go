package webhookcert

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Secret keys. tls.crt and tls.key follow the kubernetes.io/tls type, and
// ca.crt is the caBundle, as cert-manager writes it.
const (
	KeyTLSCert = "tls.crt"
	KeyTLSKey  = "tls.key"
	KeyCACert  = "ca.crt"
	KeyCAKey   = "ca.key"
)

// backdate moves NotBefore into the past by this much, at most a tenth of
// the lifetime, so that a clock slightly behind still accepts a new
// certificate.
const backdate = time.Minute

func notBefore(now time.Time, lifetime time.Duration) time.Time {
	return now.Add(-min(backdate, lifetime/10))
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generate a serial number: %w", err)
	}
	return n, nil
}

// newCA creates a self-signed CA valid from now for lifetime.
func newCA(now time.Time, lifetime time.Duration) (*x509.Certificate, crypto.Signer, error) {
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
		Subject:               pkix.Name{CommonName: fmt.Sprintf("floodgate-webhook-ca@%d", now.Unix()), Organization: []string{"floodgate"}},
		NotBefore:             notBefore(now, lifetime),
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

// newServing creates a serving certificate for hosts signed by ca.
func newServing(ca *x509.Certificate, caKey crypto.Signer, hosts []string, now time.Time, lifetime time.Duration) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate the serving key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: hosts[0], Organization: []string{"floodgate"}},
		NotBefore:    notBefore(now, lifetime),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign the serving certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse the serving certificate: %w", err)
	}
	return cert, key, nil
}

func certPEM(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

func keyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("marshal a private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCerts reads every CERTIFICATE block of data, skipping what does
// not parse.
func parseCerts(data []byte) []*x509.Certificate {
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

func parseKey(data []byte) crypto.Signer {
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

// matches reports whether key is c's private key.
func matches(c *x509.Certificate, key crypto.Signer) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	pub, ok := key.Public().(equaler)
	return ok && pub.Equal(c.PublicKey)
}

// decode reads a Bundle from a Secret's data. Parts that are missing,
// unreadable or mismatched are left nil, for Plan to replace.
func decode(data map[string][]byte, caRolledAt, servingIssuedAt time.Time) Bundle {
	b := Bundle{Trusted: parseCerts(data[KeyCACert]), CARolledAt: caRolledAt, ServingIssuedAt: servingIssuedAt}
	if key := parseKey(data[KeyCAKey]); key != nil {
		for _, c := range b.Trusted {
			if c.IsCA && matches(c, key) {
				b.CA, b.CAKey = c, key
				break
			}
		}
	}
	if certs := parseCerts(data[KeyTLSCert]); len(certs) > 0 {
		if key := parseKey(data[KeyTLSKey]); key != nil && matches(certs[0], key) {
			b.Serving, b.ServingKey = certs[0], key
		}
	}
	return b
}

// encode writes b as a Secret's data.
func encode(b Bundle) (map[string][]byte, error) {
	caKey, err := keyPEM(b.CAKey)
	if err != nil {
		return nil, err
	}
	tlsKey, err := keyPEM(b.ServingKey)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		KeyCACert:  certPEM(b.Trusted...),
		KeyCAKey:   caKey,
		KeyTLSCert: certPEM(b.Serving),
		KeyTLSKey:  tlsKey,
	}, nil
}

// apply carries out d on b at now. It does not modify b's slices.
func apply(b Bundle, d Decision, now time.Time, p Policy) (Bundle, error) {
	if d.NewCA {
		ca, key, err := newCA(now, p.CALifetime)
		if err != nil {
			return b, err
		}
		trusted := []*x509.Certificate{ca}
		for _, c := range b.Trusted {
			if now.Before(c.NotAfter) {
				trusted = append(trusted, c)
			}
		}
		b.CA, b.CAKey, b.Trusted, b.CARolledAt = ca, key, trusted, now
	}
	if d.NewServing {
		cert, key, err := newServing(b.CA, b.CAKey, p.Hosts, now, p.ServingLifetime)
		if err != nil {
			return b, err
		}
		b.Serving, b.ServingKey, b.ServingIssuedAt = cert, key, now
	}
	if d.DropOld {
		b.Trusted = []*x509.Certificate{b.CA}
	}
	return b, nil
}
