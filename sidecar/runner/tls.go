package runner

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

func readFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// tlsConfig builds the client TLS configuration for the store and, with
// a CA file, the function that reads the file's roots again for every new
// connection (redisstore.Options.TLSRoots): a bundle that the kubelet
// writes after the config arrives (the manager mirrors it into the
// sidecar's Secret volume, which may lag the ConfigMap), or rotates later,
// is used without a restart. Until the file can be read and holds a
// certificate, every dial fails with that reason and decisions take each
// rule's failure mode.
func tlsConfig(t *config.TLS) (*tls.Config, func() (*x509.CertPool, error)) {
	if t == nil {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // opt-in, documented as testing only
	if t.CAFile == "" {
		return c, nil
	}
	file := t.CAFile
	return c, func() (*x509.CertPool, error) { return caPool(file) }
}

// caPool reads a PEM CA bundle.
func caPool(file string) (*x509.CertPool, error) {
	pem, err := readFile(file)
	if err != nil {
		return nil, fmt.Errorf("the store's CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the store's CA bundle %s holds no PEM certificate", file)
	}
	return pool, nil
}
