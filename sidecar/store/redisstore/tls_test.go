package redisstore_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestTLS runs decisions over TLS to a standalone redis-server, and fails
// them as unavailable when the server's certificate is not trusted.
func TestTLS(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTLSServer(t)
	addr := srv.TLSAddr
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(srv.CA) {
		t.Fatal("the test server's CA is not PEM")
	}
	l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 2, Period: time.Minute}

	s, err := redisstore.New(redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Addrs: []string{addr}, Single: true, Timeout: suiteTimeout,
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

	untrusting, err := redisstore.New(redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Addrs: []string{addr}, Single: true, Timeout: suiteTimeout,
		TLS: &tls.Config{RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = untrusting.Close() }()
	if _, _, err := untrusting.Take(t.Context(), limiter.Request{Key: "tls-key", Limit: l, Cost: 1}); !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("take with an untrusted server certificate: %v, want ErrUnavailable", err)
	}
}

// TestTLSRootsPerConnection: with TLSRoots, every new connection verifies
// the server with the pool it returns then, so a store whose CA bundle is
// missing at first, or wrong, connects once the bundle is right, without
// a new store.
func TestTLSRootsPerConnection(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTLSServer(t)
	_, _, otherCA := redistest.NewCA(t)
	var bundle atomic.Pointer[[]byte]
	var calls atomic.Int64
	roots := func() (*x509.CertPool, error) {
		calls.Add(1)
		b := bundle.Load()
		if b == nil {
			return nil, errors.New("no CA bundle yet")
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(*b)
		return pool, nil
	}
	s, err := redisstore.New(redisstore.Options{Addrs: []string{srv.TLSAddr}, Single: true, Timeout: suiteTimeout,
		BreakerCooldown: 50 * time.Millisecond, TLS: &tls.Config{MinVersion: tls.VersionTLS12}, TLSRoots: roots})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 100, Period: time.Minute}
	take := func() error {
		_, _, err := s.Take(t.Context(), limiter.Request{Key: "roots-key", Limit: l, Cost: 1})
		return err
	}
	if err := take(); !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("take without a CA bundle: %v, want ErrUnavailable", err)
	}
	bundle.Store(&otherCA)
	if err := take(); !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("take with a CA bundle that did not sign the server: %v, want ErrUnavailable", err)
	}
	before := calls.Load()
	bundle.Store(&srv.CA)
	deadline := time.Now().Add(30 * time.Second)
	for err := take(); err != nil; err = take() {
		if time.Now().After(deadline) {
			t.Fatalf("take still fails 30 s after the right CA bundle: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if calls.Load() == before {
		t.Error("the store connected without asking TLSRoots again")
	}
}
