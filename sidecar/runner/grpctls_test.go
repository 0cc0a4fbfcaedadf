package runner

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/controllers/rlsidentity"
	"github.com/floodgate-dev/floodgate/internal/pki"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

const gatewayPolicies = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: edge
  namespace: shop
  uid: edge-shop
  gateways: [shop/public]
  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 2, per: 1h}
- name: edge
  namespace: bank
  uid: edge-bank
  gateways: [bank/public]
  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 2, per: 1h}
`

// floodgate-sidecar with --grpc-tls-cert-file, --grpc-tls-key-file and
// --grpc-client-ca-file serves ShouldRateLimit over TLS to gateways with
// a client certificate of the CA only, each for its own policies.
func TestGRPCListenWithClientCertificates(t *testing.T) {
	t.Parallel()
	ca, caKey, err := pki.NewCA("test-ca", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	serving, servingKey, err := pki.Issue(ca, caKey, rlsidentity.ServingLeaf("floodgate-ratelimit", "floodgate-system", ""), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.KeyPEM(servingKey)
	if err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, filepath.Join(dir, "tls.crt"), string(pki.CertPEM(serving)))
	writeAtomic(t, filepath.Join(dir, "tls.key"), string(kp))
	writeAtomic(t, filepath.Join(dir, "ca.crt"), string(pki.CertPEM(ca)))

	be := newBackend(t, nil)
	sc := startSidecar(t, be.URL, gatewayPolicies, true, "--grpc-listen", "127.0.0.1:0",
		"--grpc-tls-cert-file", filepath.Join(dir, "tls.crt"), "--grpc-tls-key-file", filepath.Join(dir, "tls.key"),
		"--grpc-client-ca-file", filepath.Join(dir, "ca.crt"))

	dial := func(creds credentials.TransportCredentials) rlsv3.RateLimitServiceClient {
		conn, err := grpc.NewClient(sc.GRPCAddr(), grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return rlsv3.NewRateLimitServiceClient(conn)
	}
	gateway := func(ns, name string) rlsv3.RateLimitServiceClient {
		cert, key, err := pki.Issue(ca, caKey, rlsidentity.ClientLeaf(ns, name), time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AddCert(ca)
		return dial(credentials.NewTLS(&tls.Config{
			ServerName: "floodgate-ratelimit.floodgate-system.svc.cluster.local", RootCAs: roots, MinVersion: tls.VersionTLS12,
			Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key}},
		}))
	}
	call := func(c rlsv3.RateLimitServiceClient, policy string) (rlsv3.RateLimitResponse_Code, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: config.GatewayDomain, Descriptors: []*rlcommonv3.RateLimitDescriptor{{
			Entries: []*rlcommonv3.RateLimitDescriptor_Entry{
				{Key: config.PolicyEntryKey, Value: policy}, {Key: config.MethodEntryKey, Value: "GET"},
				{Key: config.PathEntryKey, Value: "/"}, {Key: config.RemoteAddressEntryKey, Value: "192.0.2.7"},
			},
		}}})
		if err != nil {
			return 0, err
		}
		return out.OverallCode, nil
	}

	if _, err := call(dial(insecure.NewCredentials()), "shop/edge"); status.Code(err) != codes.Unavailable {
		t.Fatalf("a plaintext call: %v, want Unavailable (the listener speaks only TLS)", err)
	}
	shop, bank := gateway("shop", "public"), gateway("bank", "public")
	for range 3 {
		if _, err := call(shop, "bank/edge"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("shop's gateway asking about bank's policy: %v, want PermissionDenied", err)
		}
	}
	var got []rlsv3.RateLimitResponse_Code
	for range 3 {
		code, err := call(bank, "bank/edge")
		if err != nil {
			t.Fatalf("bank's gateway asking about its policy: %v", err)
		}
		got = append(got, code)
	}
	if want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}; !equalCodes(got, want) {
		t.Errorf("bank's gateway for client 192.0.2.7: %v, want %v (shop's refused calls counted nothing)", got, want)
	}
	if code, err := call(shop, "shop/edge"); err != nil || code != rlsv3.RateLimitResponse_OK {
		t.Errorf("shop's gateway asking about its policy: %v, %v; want OK", code, err)
	}
}

func equalCodes(a, b []rlsv3.RateLimitResponse_Code) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The gRPC TLS flags go together, with --grpc-listen, and bad files stop
// the start.
func TestGRPCTLSFlags(t *testing.T) {
	t.Parallel()
	c, err := parse(t, []string{"--policy-file", "p.yaml", "--grpc-tls-cert-file", "tls.crt"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	for _, want := range []string{"--grpc-tls-cert-file (FLOODGATE_GRPC_TLS_CERT_FILE): needs --grpc-listen",
		"--grpc-tls-key-file (FLOODGATE_GRPC_TLS_KEY_FILE): required with the other gRPC TLS flags",
		"--grpc-client-ca-file (FLOODGATE_GRPC_CLIENT_CA_FILE): required with the other gRPC TLS flags"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
	c, err = parse(t, []string{"--policy-file", "p.yaml", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--grpc-listen", "127.0.0.1:0", "--grpc-tls-cert-file", "/nonexistent/tls.crt",
		"--grpc-tls-key-file", "/nonexistent/tls.key", "--grpc-client-ca-file", "/nonexistent/ca.crt"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("all three flags: %v", err)
	}
	if _, err := New(c, slog.New(slog.DiscardHandler), nil); err == nil || !strings.Contains(err.Error(), "/nonexistent/tls.crt") {
		t.Errorf("New with missing TLS files = %v, want an error naming the file", err)
	}
}
