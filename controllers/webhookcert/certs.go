package webhookcert

import (
	"crypto/x509"
	"fmt"
	"time"

	"github.com/floodgate-dev/floodgate/internal/pki"
)

// Secret keys. tls.crt and tls.key follow the kubernetes.io/tls type, and
// ca.crt is the caBundle, as cert-manager writes it.
const (
	KeyTLSCert = "tls.crt"
	KeyTLSKey  = "tls.key"
	KeyCACert  = "ca.crt"
	KeyCAKey   = "ca.key"
)

// decode reads a Bundle from a Secret's data. Parts that are missing,
// unreadable or mismatched are left nil, for Plan to replace.
func decode(data map[string][]byte, caRolledAt, servingIssuedAt time.Time) Bundle {
	b := Bundle{Trusted: pki.ParseCerts(data[KeyCACert]), CARolledAt: caRolledAt, ServingIssuedAt: servingIssuedAt}
	if key := pki.ParseKey(data[KeyCAKey]); key != nil {
		for _, c := range b.Trusted {
			if c.IsCA && pki.Matches(c, key) {
				b.CA, b.CAKey = c, key
				break
			}
		}
	}
	if certs := pki.ParseCerts(data[KeyTLSCert]); len(certs) > 0 {
		if key := pki.ParseKey(data[KeyTLSKey]); key != nil && pki.Matches(certs[0], key) {
			b.Serving, b.ServingKey = certs[0], key
		}
	}
	return b
}

// encode writes b as a Secret's data.
func encode(b Bundle) (map[string][]byte, error) {
	caKey, err := pki.KeyPEM(b.CAKey)
	if err != nil {
		return nil, err
	}
	tlsKey, err := pki.KeyPEM(b.ServingKey)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		KeyCACert:  pki.CertPEM(b.Trusted...),
		KeyCAKey:   caKey,
		KeyTLSCert: pki.CertPEM(b.Serving),
		KeyTLSKey:  tlsKey,
	}, nil
}

// apply carries out d on b at now. It does not modify b's slices.
func apply(b Bundle, d Decision, now time.Time, p Policy) (Bundle, error) {
	if d.NewCA {
		ca, key, err := pki.NewCA(fmt.Sprintf("floodgate-webhook-ca@%d", now.Unix()), now, p.CALifetime)
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
		cert, key, err := pki.Issue(b.CA, b.CAKey, pki.Leaf{CommonName: p.Hosts[0], Hosts: p.Hosts, Usage: pki.Server}, now, p.ServingLifetime)
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
