package redisstore_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// writeCert writes a PEM certificate and key signed by parent (self-signed
// when parent is nil) and returns them.
func writeCert(t *testing.T, dir, name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestTLS runs decisions over TLS to a standalone redis-server, and fails
// them as unavailable when the server's certificate is not trusted.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Now()
	ca, caKey := writeCert(t, dir, "ca", &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "floodgate test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	writeCert(t, dir, "server", &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "redis"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, caKey)
	tlsPort := redistest.FreePort(t)
	redistest.StartServer(t, redistest.ServerOptions{ExtraArgs: []string{
		"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", filepath.Join(dir, "server.crt"),
		"--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"),
		"--tls-auth-clients", "no",
	}})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 2, Period: time.Minute}

	s, err := redisstore.New(redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Addrs: []string{addr}, Single: true, Timeout: 2 * time.Second,
		TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	for j := range 3 {
		d, _, err := s.Take(t.Context(), limiter.Request{Key: "tls-key", Limit: l, Cost: 1})
		if err != nil {
			t.Fatalf("take over TLS: %v", err)
		}
		if got, want := d.Allowed, j < 2; got != want {
			t.Fatalf("request %d over TLS: Allowed = %v, want %v", j, got, want)
		}
	}

	untrusting, err := redisstore.New(redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Addrs: []string{addr}, Single: true, Timeout: 2 * time.Second,
		TLS: &tls.Config{RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = untrusting.Close() }()
	if _, _, err := untrusting.Take(t.Context(), limiter.Request{Key: "tls-key", Limit: l, Cost: 1}); !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("take with an untrusted server certificate: %v, want ErrUnavailable", err)
	}
}
