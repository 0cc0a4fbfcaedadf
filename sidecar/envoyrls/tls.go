package envoyrls

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// TLSFiles are the PEM files of a listener that serves only callers with
// a verified client certificate (ServerTLS).
type TLSFiles struct {
	// CertFile and KeyFile are the listener's certificate (chain) and
	// private key.
	CertFile, KeyFile string
	// ClientCAFile is the bundle of CAs a caller's certificate must
	// verify against. During a CA rotation it holds the old and the new
	// CA.
	ClientCAFile string
}

// ServerTLS returns the TLS configuration of the rate-limit service's
// listener when it authenticates its callers (Options.Authenticate): it
// requires a client certificate that verifies against f.ClientCAFile for
// client authentication, and serves f.CertFile. A caller without one, or
// with one from another CA or not made for client authentication, fails
// the handshake, so no call of it is ever read: it gets the TLS alert
// "handshake failure" (TLS 1.2) or "certificate required" (TLS 1.3)
// without a certificate, "unknown certificate authority" with one of
// another CA, "bad certificate" with one not for client authentication,
// and a gRPC client reports UNAVAILABLE. It offers TLS 1.2 and 1.3, and HTTP/2 (h2) by ALPN, as gRPC
// requires.
//
// The three files are read again for every handshake, so that a rotated
// certificate or CA bundle (a Secret volume the kubelet updates) is used
// from the next connection on without a restart; what they hold is parsed
// only when it changed. A read or parse failure keeps the last good
// configuration, and is logged. The error is for files that are not good
// at the start.
func ServerTLS(f TLSFiles, log *slog.Logger) (*tls.Config, error) {
	if f.CertFile == "" || f.KeyFile == "" || f.ClientCAFile == "" {
		return nil, errors.New("envoyrls: a TLS listener needs a certificate, a key and a client CA bundle")
	}
	if log == nil {
		log = slog.Default()
	}
	r := &reloader{f: f, log: log}
	if _, err := r.load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		// Every handshake takes the current files.
		GetConfigForClient: r.config,
	}, nil
}

// reloader serves the configuration of the files it last read. It is safe
// for concurrent use.
type reloader struct {
	f   TLSFiles
	log *slog.Logger

	mu            sync.Mutex
	cert, key, ca []byte
	cfg           *tls.Config
}

// config is tls.Config.GetConfigForClient.
func (r *reloader) config(*tls.ClientHelloInfo) (*tls.Config, error) {
	cfg, err := r.load()
	if err == nil {
		return cfg, nil
	}
	r.mu.Lock()
	last := r.cfg
	r.mu.Unlock()
	r.log.Warn("the gRPC listener's TLS files cannot be read; the last good ones are served", "error", err.Error())
	return last, nil
}

// load reads the files and returns their configuration, parsing them only
// when they changed since the last good read.
func (r *reloader) load() (*tls.Config, error) {
	cert, err := os.ReadFile(r.f.CertFile)
	if err != nil {
		return nil, fmt.Errorf("read the gRPC TLS certificate: %w", err)
	}
	key, err := os.ReadFile(r.f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("read the gRPC TLS key: %w", err)
	}
	ca, err := os.ReadFile(r.f.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("read the gRPC client CA bundle: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfg != nil && bytes.Equal(cert, r.cert) && bytes.Equal(key, r.key) && bytes.Equal(ca, r.ca) {
		return r.cfg, nil
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("the gRPC TLS certificate %s and key %s: %w", r.f.CertFile, r.f.KeyFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("the gRPC client CA bundle %s holds no PEM certificate", r.f.ClientCAFile)
	}
	r.cert, r.key, r.ca = cert, key, ca
	r.cfg = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2"},
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	return r.cfg, nil
}
