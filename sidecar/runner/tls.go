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

// tlsConfig builds the client TLS configuration for the store.
func tlsConfig(t *config.TLS) (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // opt-in, documented as testing only
	if t.CAFile != "" {
		pem, err := readFile(t.CAFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificates", t.CAFile)
		}
		c.RootCAs = pool
	}
	return c, nil
}
