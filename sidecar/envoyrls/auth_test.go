package envoyrls_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/controllers/rlsidentity"
	"github.com/floodgate-dev/floodgate/internal/pki"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// tenantDoc holds two tenants' gateway policies, each enforced at its own
// Gateway (what floodgate-manager compiles from the targeted routes'
// parents), and a descriptor rule that belongs to no gateway.
const tenantDoc = `
apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: edge
  namespace: shop
  uid: edge-shop
  gateways: [infra/g1]
  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 5, per: 1h}
- name: accounts
  namespace: bank
  uid: accounts-bank
  gateways: [bank/g2]
  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 5, per: 1h}
- name: legacy
  uid: legacy
  rules:
  - name: by-user
    match: {descriptors: {domain: floodgate, entries: [{key: user}]}}
    limit: {requests: 1, per: 1h}
`

// quiet discards the listener's logs.
var quiet = slog.New(slog.DiscardHandler)

// serviceName is the name gateways check in the service's certificate.
const serviceName = "floodgate-ratelimit.floodgate-system.svc"

// pkiFixture is a CA with the certificates the manager issues from it,
// made by the manager's own code (rlsidentity's leaves, package pki).
type pkiFixture struct {
	ca    *x509.Certificate
	caKey crypto.Signer
	dir   string // tls.crt, tls.key and ca.crt of the service
}

func newPKI(t *testing.T) *pkiFixture {
	t.Helper()
	ca, key, err := pki.NewCA("test-ca", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := &pkiFixture{ca: ca, caKey: key, dir: t.TempDir()}
	f.writeServing(t, f.ca, f.caKey, f.ca)
	return f
}

// writeServing writes a serving certificate signed by ca, and the client
// CA bundle trusted, into the service's files.
func (f *pkiFixture) writeServing(t *testing.T, ca *x509.Certificate, caKey crypto.Signer, trusted ...*x509.Certificate) {
	t.Helper()
	cert, key, err := pki.Issue(ca, caKey, rlsidentity.ServingLeaf("floodgate-ratelimit", "floodgate-system", ""), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.KeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	// Written as the kubelet does: each file replaced whole.
	for name, data := range map[string][]byte{"tls.crt": pki.CertPEM(cert), "tls.key": kp, "ca.crt": pki.CertPEM(trusted...)} {
		tmp := filepath.Join(f.dir, "."+name)
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(f.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *pkiFixture) files() envoyrls.TLSFiles {
	return envoyrls.TLSFiles{
		CertFile: filepath.Join(f.dir, "tls.crt"), KeyFile: filepath.Join(f.dir, "tls.key"), ClientCAFile: filepath.Join(f.dir, "ca.crt"),
	}
}

// client returns a client certificate of leaf, signed by ca.
func client(t *testing.T, ca *x509.Certificate, caKey crypto.Signer, leaf pki.Leaf) tls.Certificate {
	t.Helper()
	cert, key, err := pki.Issue(ca, caKey, leaf, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
}

// authServer is an authenticating server on a real loopback socket.
type authServer struct {
	addr  string
	store *memstore.Store
	reg   *prometheus.Registry
}

// newAuthServer serves tenantDoc with Authenticate on 127.0.0.1:0, over
// TLS from tlsCfg, or in plaintext when it is nil.
func newAuthServer(t *testing.T, tlsCfg *tls.Config) *authServer {
	t.Helper()
	c, err := config.Parse([]byte(tenantDoc))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.NewMetrics(reg)
	set, err := ruleset.Compile(c, labels.Set{}, m)
	if err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return testNow }
	store, err := memstore.New(memstore.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	fallback, err := memstore.New(memstore.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Options{Store: store, Fallback: fallback, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := envoyrls.New(envoyrls.Options{Registerer: reg, Authenticate: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Install(eng, set)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	gs := grpc.NewServer(opts...)
	srv.Register(gs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(ln)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	return &authServer{addr: ln.Addr().String(), store: store, reg: reg}
}

// dial connects to s over TLS, trusting roots for the service's name and
// presenting certs.
func (s *authServer) dial(t *testing.T, roots []*x509.Certificate, certs ...tls.Certificate) rlsv3.RateLimitServiceClient {
	t.Helper()
	return s.dialVersion(t, 0, roots, certs...)
}

// dialVersion is dial with TLS at most maxVersion (0: 1.3).
func (s *authServer) dialVersion(t *testing.T, maxVersion uint16, roots []*x509.Certificate, certs ...tls.Certificate) rlsv3.RateLimitServiceClient {
	t.Helper()
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	cfg := &tls.Config{ServerName: serviceName, RootCAs: pool, MinVersion: tls.VersionTLS12, MaxVersion: maxVersion}
	if len(certs) > 0 {
		// The certificate is sent whatever CAs the server names, as Envoy
		// sends its configured one (Go's client would send none that the
		// server's list does not name).
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
	}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func shouldRateLimit(c rlsv3.RateLimitServiceClient, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.ShouldRateLimit(ctx, in)
}

func metricOf(t *testing.T, reg *prometheus.Registry, code string) float64 {
	t.Helper()
	return (&rls{reg: reg}).metric(t, "floodgate_sidecar_rls_calls_total", "code", code)
}

// TestCallersAuthenticate: with TLS and Authenticate, only a gateway with
// a certificate of the service's CA is served, and a gateway may only
// spend the counters of the policies whose target is attached to it: the
// hole where any pod named any client address of any policy is closed.
func TestCallersAuthenticate(t *testing.T) {
	t.Parallel()
	f := newPKI(t)
	cfg, err := envoyrls.ServerTLS(f.files(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	s := newAuthServer(t, cfg)
	victim := req(config.GatewayDomain, rd("bank/accounts", "GET", "/", "127.0.0.9"))

	// Refused handshakes, as a gateway's Envoy sees them: it speaks TLS
	// 1.2 to an upstream unless told otherwise, and in TLS 1.2 the
	// server's alert ends the client's handshake.
	other, otherKey, err := pki.NewCA("other-ca", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		alert string
	}{
		{"no client certificate", nil, "tls: handshake failure"},
		{"a certificate of another CA", []tls.Certificate{client(t, other, otherKey, rlsidentity.ClientLeaf("bank", "g2"))}, "tls: unknown certificate authority"},
		// A serving certificate of the right CA is not a client's.
		{"the service's own certificate", []tls.Certificate{client(t, f.ca, f.caKey, rlsidentity.ServingLeaf("floodgate-ratelimit", "floodgate-system", ""))}, "tls: bad certificate"},
	} {
		_, err := shouldRateLimit(s.dialVersion(t, tls.VersionTLS12, []*x509.Certificate{f.ca}, tc.certs...), victim)
		if got := status.Code(err); got != codes.Unavailable || !strings.Contains(err.Error(), "authentication handshake failed: remote error: "+tc.alert) {
			t.Errorf("%s: %v (code %v), want the handshake refused: Unavailable, %q", tc.name, err, got, tc.alert)
		}
	}
	// In TLS 1.3 the client's half of the handshake ends first, and the
	// server's alert arrives on the first read.
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		alert string
	}{
		{"no client certificate", nil, "remote error: tls: certificate required"},
		{"a certificate of another CA", []tls.Certificate{client(t, other, otherKey, rlsidentity.ClientLeaf("bank", "g2"))}, "remote error: tls: unknown certificate authority"},
	} {
		pool := x509.NewCertPool()
		pool.AddCert(f.ca)
		cfg := &tls.Config{ServerName: serviceName, RootCAs: pool, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}}
		if len(tc.certs) > 0 {
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tc.certs[0], nil }
		}
		conn, err := tls.Dial("tcp", s.addr, cfg)
		if err != nil {
			t.Fatalf("TLS 1.3, %s: the client's half of the handshake: %v", tc.name, err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		_ = conn.Close()
		if err == nil || err.Error() != tc.alert {
			t.Errorf("TLS 1.3, %s: the first read = %v, want %q", tc.name, err, tc.alert)
		}
	}
	if n := s.store.Len(); n != 0 {
		t.Fatalf("refused handshakes left %d counters in the store, want 0", n)
	}

	g1 := s.dial(t, []*x509.Certificate{f.ca}, client(t, f.ca, f.caKey, rlsidentity.ClientLeaf("infra", "g1")))
	g2 := s.dial(t, []*x509.Certificate{f.ca}, client(t, f.ca, f.caKey, rlsidentity.ClientLeaf("bank", "g2")))

	// Gateway g1 tries to spend client 127.0.0.9's counter of bank's
	// policy, whose route is attached to g2 only.
	for i := range 100 {
		_, err := shouldRateLimit(g1, victim)
		if got := status.Code(err); got != codes.PermissionDenied {
			t.Fatalf("g1's call %d about bank/accounts: %v, want PermissionDenied", i, err)
		}
		if i == 0 && !strings.Contains(err.Error(), "gateway infra/g1 may not ask about policy bank/accounts") {
			t.Errorf("the refusal says %q, want it to name the gateway and the policy", status.Convert(err).Message())
		}
	}
	// A call that mixes its own policy with the victim's is refused whole.
	mixed := req(config.GatewayDomain, rd("shop/edge", "GET", "/", "127.0.0.9"), rd("bank/accounts", "GET", "/", "127.0.0.9"))
	if _, err := shouldRateLimit(g1, mixed); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("g1's call about its own and bank's policy: %v, want PermissionDenied", err)
	}
	if n := s.store.Len(); n != 0 {
		t.Fatalf("refused calls left %d counters in the store, want 0: the victim's counter moved", n)
	}
	if got, want := metricOf(t, s.reg, "permission_denied"), 101.0; got != want {
		t.Errorf("permission_denied calls = %v, want %v", got, want)
	}

	// The victim's client is untouched: g2, the gateway of its route,
	// gets all 5 of its requests, and its remote_address is honoured (a
	// counter per client).
	for i := range 5 {
		resp, err := shouldRateLimit(g2, victim)
		if err != nil {
			t.Fatalf("g2's call %d: %v", i, err)
		}
		if resp.OverallCode != ok {
			t.Fatalf("g2's call %d for 127.0.0.9 = %v, want OK: g1 spent the victim's counter", i, resp.OverallCode)
		}
		if got, want := resp.Statuses[0].LimitRemaining, uint32(4-i); got != want {
			t.Errorf("g2's call %d: limit_remaining %d, want %d", i, got, want)
		}
	}
	if resp, err := shouldRateLimit(g2, victim); err != nil || resp.OverallCode != over {
		t.Fatalf("g2's 6th call for 127.0.0.9 = %v, %v; want OVER_LIMIT", resp, err)
	}
	if resp, err := shouldRateLimit(g2, req(config.GatewayDomain, rd("bank/accounts", "GET", "/", "127.0.0.10"))); err != nil || resp.OverallCode != ok {
		t.Fatalf("g2's call for another client, 127.0.0.10 = %v, %v; want OK (the client address keys the counter)", resp, err)
	}

	// g1 asking about its own policy is served.
	for i := range 5 {
		resp, err := shouldRateLimit(g1, req(config.GatewayDomain, rd("shop/edge", "GET", "/", "127.0.0.9")))
		if err != nil || resp.OverallCode != ok {
			t.Fatalf("g1's call %d about its own policy = %v, %v; want OK", i, resp, err)
		}
	}
	if resp, err := shouldRateLimit(g1, req(config.GatewayDomain, rd("shop/edge", "GET", "/", "127.0.0.9"))); err != nil || resp.OverallCode != over {
		t.Fatalf("g1's 6th call about its own policy = %v, %v; want OVER_LIMIT", resp, err)
	}

	// A certificate of the CA that names no gateway may ask about
	// descriptor rules, which belong to no gateway, and no policy.
	anon := s.dial(t, []*x509.Certificate{f.ca}, client(t, f.ca, f.caKey, pki.Leaf{CommonName: "someone", Usage: pki.Client}))
	if resp, err := shouldRateLimit(anon, req(config.GatewayDomain, d("user=alice"))); err != nil || resp.OverallCode != ok {
		t.Fatalf("a descriptor rule from a certificate without a gateway = %v, %v; want OK", resp, err)
	}
	_, err = shouldRateLimit(anon, req(config.GatewayDomain, rd("shop/edge", "GET", "/", "127.0.0.11")))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "names no gateway") {
		t.Fatalf("a request descriptor from a certificate without a gateway: %v, want PermissionDenied", err)
	}
	// A policy no document holds charges nothing, as without
	// authentication.
	if resp, err := shouldRateLimit(g1, req(config.GatewayDomain, rd("nowhere/none", "GET", "/", "127.0.0.9"))); err != nil || resp.OverallCode != ok {
		t.Fatalf("a request descriptor of no policy = %v, %v; want a bare OK", resp, err)
	}
}

// TestAuthenticateNeedsTLS: a server told to authenticate but listening
// without TLS answers UNAUTHENTICATED to every call, counting nothing.
func TestAuthenticateNeedsTLS(t *testing.T) {
	t.Parallel()
	s := newAuthServer(t, nil)
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := rlsv3.NewRateLimitServiceClient(conn)
	for _, in := range []*rlsv3.RateLimitRequest{
		req(config.GatewayDomain, rd("bank/accounts", "GET", "/", "127.0.0.9")),
		req(config.GatewayDomain, d("user=alice")),
	} {
		if _, err := shouldRateLimit(c, in); status.Code(err) != codes.Unauthenticated {
			t.Errorf("plaintext call %v: %v, want Unauthenticated", in, err)
		}
	}
	if got, want := metricOf(t, s.reg, "unauthenticated"), 2.0; got != want {
		t.Errorf("unauthenticated calls = %v, want %v", got, want)
	}
	if n := s.store.Len(); n != 0 {
		t.Errorf("%d counters in the store, want 0", n)
	}
}

// TestServerTLSReloadsFiles: the listener reads its files for every
// handshake, so a CA rotation as the manager stages it (the new CA
// trusted beside the old, then the serving certificate reissued) serves
// gateways with either CA's certificate, without a restart.
func TestServerTLSReloadsFiles(t *testing.T) {
	t.Parallel()
	f := newPKI(t)
	cfg, err := envoyrls.ServerTLS(f.files(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	s := newAuthServer(t, cfg)
	call := func(c rlsv3.RateLimitServiceClient) error {
		_, err := shouldRateLimit(c, req(config.GatewayDomain, rd("shop/edge", "GET", "/", "127.0.0.1")))
		return err
	}
	newCA, newKey, err := pki.NewCA("new-ca", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	oldClient := client(t, f.ca, f.caKey, rlsidentity.ClientLeaf("infra", "g1"))
	newClient := client(t, newCA, newKey, rlsidentity.ClientLeaf("infra", "g1"))
	both := []*x509.Certificate{newCA, f.ca}

	if err := call(s.dial(t, both, newClient)); status.Code(err) != codes.Unavailable {
		t.Fatalf("a certificate of a CA not yet trusted: %v, want the handshake refused", err)
	}
	held := s.dial(t, both, oldClient)
	if err := call(held); err != nil {
		t.Fatalf("a certificate of the current CA: %v", err)
	}
	// Stage 1: the new CA is trusted beside the old one.
	f.writeServing(t, f.ca, f.caKey, newCA, f.ca)
	if err := call(s.dial(t, both, newClient)); err != nil {
		t.Fatalf("after the new CA joined the bundle, a certificate of it: %v", err)
	}
	// Stage 2: the service serves a certificate of the new CA; a gateway
	// that trusts only the new CA reaches it, one with an old-CA
	// certificate still does.
	f.writeServing(t, newCA, newKey, newCA, f.ca)
	if err := call(s.dial(t, []*x509.Certificate{newCA}, oldClient)); err != nil {
		t.Fatalf("after the serving certificate was reissued: %v", err)
	}
	// Stage 3: the old CA leaves the bundle; its certificates are refused
	// on new connections, and a connection made before goes on.
	f.writeServing(t, newCA, newKey, newCA)
	if err := call(s.dial(t, []*x509.Certificate{newCA}, oldClient)); status.Code(err) != codes.Unavailable {
		t.Fatalf("an old-CA certificate after the old CA left the bundle: %v, want the handshake refused", err)
	}
	if err := call(held); err != nil {
		t.Fatalf("a connection made before the rotation: %v", err)
	}
	// A file that cannot be read keeps the last good configuration.
	if err := os.Remove(f.files().CertFile); err != nil {
		t.Fatal(err)
	}
	if err := call(s.dial(t, []*x509.Certificate{newCA}, newClient)); err != nil {
		t.Fatalf("with the certificate file gone: %v, want the last good files served", err)
	}
}

// TestServerTLSRefusesBadFiles: missing or unusable files are refused at
// the start, naming the file.
func TestServerTLSRefusesBadFiles(t *testing.T) {
	t.Parallel()
	f := newPKI(t)
	good := f.files()
	bad := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(bad, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		files envoyrls.TLSFiles
		want  string
	}{
		{envoyrls.TLSFiles{CertFile: good.CertFile, KeyFile: good.KeyFile}, "needs a certificate, a key and a client CA bundle"},
		{envoyrls.TLSFiles{CertFile: good.CertFile, KeyFile: good.KeyFile, ClientCAFile: bad}, "holds no PEM certificate"},
		{envoyrls.TLSFiles{CertFile: good.CertFile, KeyFile: bad, ClientCAFile: good.ClientCAFile}, "bad.pem"},
		{envoyrls.TLSFiles{CertFile: good.CertFile + ".missing", KeyFile: good.KeyFile, ClientCAFile: good.ClientCAFile}, "no such file"},
	} {
		_, err := envoyrls.ServerTLS(tc.files, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ServerTLS(%+v) = %v, want %q", tc.files, err, tc.want)
		}
	}
	var pathErr *os.PathError
	if _, err := envoyrls.ServerTLS(envoyrls.TLSFiles{CertFile: "/nonexistent", KeyFile: good.KeyFile, ClientCAFile: good.ClientCAFile}, nil); !errors.As(err, &pathErr) {
		t.Errorf("a missing file: %v, want an *os.PathError", err)
	}
}
