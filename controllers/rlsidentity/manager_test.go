package rlsidentity_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/rlsidentity"
	"github.com/floodgate-dev/floodgate/internal/pki"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

const managerNS = "fg"

// clock is the manager's clock, moved by the test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

type env struct {
	c     client.Client
	owner *admissionregistrationv1.MutatingWebhookConfiguration
}

func startEnv(t *testing.T) *env {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is unset: run the tests with `make test`, or KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)")
	}
	te := &envtest.Environment{}
	cfg, err := te.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = te.Stop() })
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, ns := range []string{managerNS, "shop", "bank", "egw", "foreign"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "fg-injector"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "inject.floodgate.dev", AdmissionReviewVersions: []string{"v1"},
			SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: managerNS, Name: "fg-webhook", Path: ptr.To("/inject")},
			},
		}},
	}
	if err := c.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	return &env{c: c, owner: mwc}
}

func (e *env) manager(t *testing.T, clk *clock, gateways ...string) *rlsidentity.Manager {
	t.Helper()
	var gws []rlsidentity.Gateway
	for _, s := range gateways {
		g, err := rlsidentity.ParseGateway(s)
		if err != nil {
			t.Fatal(err)
		}
		gws = append(gws, g)
	}
	m, err := rlsidentity.New(rlsidentity.Options{
		Client: e.c, Reader: e.c, Namespace: managerNS, ServiceName: "floodgate-ratelimit", Gateways: gws,
		OwnerWebhookConfig: e.owner.Name, Log: logr.Discard(), Now: clk.Now,
		CALifetime: 30 * time.Hour, LeafLifetime: 3 * time.Hour, Propagation: 10 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (e *env) secret(t *testing.T, ns, name string) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	if err := e.c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatalf("get Secret %s/%s: %v", ns, name, err)
	}
	return &s
}

func (e *env) owned(t *testing.T, s *corev1.Secret) {
	t.Helper()
	for _, r := range s.OwnerReferences {
		if r.UID == e.owner.UID && r.Kind == "MutatingWebhookConfiguration" {
			return
		}
	}
	t.Errorf("Secret %s/%s is not owned by the webhook configuration: %v", s.Namespace, s.Name, s.OwnerReferences)
}

func one(t *testing.T, pemData []byte) *x509.Certificate {
	t.Helper()
	cs := pki.ParseCerts(pemData)
	if len(cs) == 0 {
		t.Fatal("no certificate")
	}
	return cs[0]
}

func verifies(c *x509.Certificate, bundle []byte, at time.Time, usage x509.ExtKeyUsage, dns string) error {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(bundle)
	_, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: at, DNSName: dns, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// TestManagerKeepsTheIdentities runs the Manager against a real API
// server: it creates the CA, serving and client Secrets, owned by the
// chart's webhook configuration; the certificates in them let the
// gateways call a real central service over TLS, each for its own
// policies; it rotates them in stages; and it removes what a gateway no
// longer listed had.
func TestManagerKeepsTheIdentities(t *testing.T) {
	e := startEnv(t)
	ctx := t.Context()
	clk := &clock{t: time.Now()}
	m := e.manager(t, clk, "shop/public", "bank/public=egw", "bank/internal=egw")
	if _, err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	ca := e.secret(t, managerNS, rlsidentity.CASecretName)
	serving := e.secret(t, managerNS, rlsidentity.ServingSecretName)
	shop := e.secret(t, "shop", rlsidentity.ClientSecretName)
	egw := e.secret(t, "egw", rlsidentity.ClientSecretName)
	for _, s := range []*corev1.Secret{ca, serving, shop, egw} {
		e.owned(t, s)
		if s.Labels["app.kubernetes.io/managed-by"] != "floodgate-manager" {
			t.Errorf("Secret %s/%s labels %v", s.Namespace, s.Name, s.Labels)
		}
	}
	if serving.Type != corev1.SecretTypeTLS {
		t.Errorf("serving Secret type %s, want kubernetes.io/tls", serving.Type)
	}
	if _, ok := shop.Data[rlsidentity.KeyCAKey]; ok {
		t.Fatal("a gateway's Secret holds the CA key")
	}
	if _, ok := serving.Data[rlsidentity.KeyCAKey]; ok {
		t.Fatal("the service's Secret holds the CA key")
	}
	bundle := ca.Data[rlsidentity.KeyCACert]
	now := clk.Now()
	if err := verifies(one(t, serving.Data["tls.crt"]), bundle, now, x509.ExtKeyUsageServerAuth, "floodgate-ratelimit.fg.svc.cluster.local"); err != nil {
		t.Errorf("the serving certificate: %v", err)
	}
	for _, tc := range []struct {
		s    *corev1.Secret
		gw   rlsidentity.Gateway
		keys int
	}{
		{shop, rlsidentity.Gateway{Namespace: "shop", Name: "public"}, 5},
		{egw, rlsidentity.Gateway{Namespace: "bank", Name: "public", SecretNamespace: "egw"}, 8},
		{egw, rlsidentity.Gateway{Namespace: "bank", Name: "internal", SecretNamespace: "egw"}, 8},
	} {
		if len(tc.s.Data) != tc.keys {
			t.Errorf("Secret %s/%s has keys %v, want %d", tc.s.Namespace, tc.s.Name, keys(tc.s.Data), tc.keys)
		}
		certKey, keyKey, sdsKey := rlsidentity.ClientKeys(tc.gw)
		c := one(t, tc.s.Data[certKey])
		if err := verifies(c, bundle, now, x509.ExtKeyUsageClientAuth, ""); err != nil {
			t.Errorf("%s's certificate: %v", tc.gw.Ref(), err)
		}
		if ref, ok := config.GatewayOf(c.URIs); !ok || ref != tc.gw.Ref() {
			t.Errorf("%s's certificate names gateway %q", tc.gw.Ref(), ref)
		}
		var sds struct {
			Resources []struct {
				Type           string `json:"@type"`
				Name           string `json:"name"`
				TLSCertificate struct {
					CertificateChain struct {
						InlineString string `json:"inline_string"`
					} `json:"certificate_chain"`
					PrivateKey struct {
						InlineString string `json:"inline_string"`
					} `json:"private_key"`
				} `json:"tls_certificate"`
			} `json:"resources"`
		}
		if err := yaml.UnmarshalStrict(tc.s.Data[sdsKey], &sds); err != nil || len(sds.Resources) != 1 {
			t.Fatalf("%s's SDS file: %v", tc.gw.Ref(), err)
		}
		if r := sds.Resources[0]; r.Name != gatewayconfig.ClientCertSDSName || r.TLSCertificate.CertificateChain.InlineString != string(tc.s.Data[certKey]) ||
			r.TLSCertificate.PrivateKey.InlineString != string(tc.s.Data[keyKey]) {
			t.Errorf("%s's SDS file does not carry its certificate and key under %s", tc.gw.Ref(), gatewayconfig.ClientCertSDSName)
		}
		if string(tc.s.Data[rlsidentity.KeyCACert]) != string(bundle) {
			t.Errorf("%s's ca.crt is not the bundle", tc.s.Namespace)
		}
		if len(tc.s.Data[rlsidentity.KeyCASDS]) == 0 {
			t.Errorf("%s's CA SDS file is missing", tc.gw.Ref())
		}
	}

	// The certificates at work: the central service serves what the
	// serving Secret holds, and each gateway presents what its Secret
	// holds.
	checkCalls(t, serving, map[string]*corev1.Secret{"shop/public": shop, "bank/public": egw})

	// A second sync changes nothing.
	rv := map[string]string{}
	for _, s := range []*corev1.Secret{ca, serving, shop, egw} {
		rv[s.Namespace+"/"+s.Name] = s.ResourceVersion
	}
	if _, err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for k, v := range rv {
		ns, name, _ := strings.Cut(k, "/")
		if got := e.secret(t, ns, name).ResourceVersion; got != v {
			t.Errorf("a sync with nothing to do rewrote Secret %s", k)
		}
	}

	// A requested rotation, stage by stage.
	ca.Annotations[rlsidentity.AnnotationRotate] = "1"
	if err := e.c.Update(ctx, ca); err != nil {
		t.Fatal(err)
	}
	oldCA := one(t, bundle)
	oldShop := one(t, shop.Data["shop.public.tls.crt"])
	stage := func(at time.Time, wantCAs int, leavesByNew bool) {
		t.Helper()
		clk.Set(at)
		if _, err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		caNow := e.secret(t, managerNS, rlsidentity.CASecretName)
		newCA := one(t, caNow.Data[rlsidentity.KeyCACert])
		for _, s := range []*corev1.Secret{e.secret(t, managerNS, rlsidentity.ServingSecretName), e.secret(t, "shop", rlsidentity.ClientSecretName), e.secret(t, "egw", rlsidentity.ClientSecretName)} {
			if got := len(pki.ParseCerts(s.Data[rlsidentity.KeyCACert])); got != wantCAs {
				t.Errorf("at %v: Secret %s/%s trusts %d CAs, want %d", at.Sub(now), s.Namespace, s.Name, got, wantCAs)
			}
		}
		shopCert := one(t, e.secret(t, "shop", rlsidentity.ClientSecretName).Data["shop.public.tls.crt"])
		if got := shopCert.CheckSignatureFrom(newCA) == nil; got != leavesByNew {
			t.Errorf("at %v: shop's certificate signed by the new CA = %v, want %v", at.Sub(now), got, leavesByNew)
		}
		// The gateway's previous certificate verifies against the
		// service's bundle as long as it may be in use.
		if wantCAs == 2 {
			if err := verifies(oldShop, e.secret(t, managerNS, rlsidentity.ServingSecretName).Data[rlsidentity.KeyCACert], at, x509.ExtKeyUsageClientAuth, ""); err != nil {
				t.Errorf("at %v: shop's earlier certificate: %v", at.Sub(now), err)
			}
		}
	}
	stage(now.Add(time.Minute), 2, false)
	if got := e.secret(t, managerNS, rlsidentity.CASecretName).Annotations[rlsidentity.AnnotationRotated]; got != "1" {
		t.Errorf("rotated annotation %q, want 1", got)
	}
	if one(t, e.secret(t, managerNS, rlsidentity.CASecretName).Data[rlsidentity.KeyCACert]).Equal(oldCA) {
		t.Fatal("the new CA is not first in the bundle")
	}
	stage(now.Add(time.Minute+10*time.Minute), 2, true)
	stage(now.Add(time.Minute+20*time.Minute), 1, true)

	// Leaves are renewed at two thirds of their life; the CA stays.
	before := one(t, e.secret(t, "shop", rlsidentity.ClientSecretName).Data["shop.public.tls.crt"])
	stage(pki.RenewAt(before), 1, true)
	if after := one(t, e.secret(t, "shop", rlsidentity.ClientSecretName).Data["shop.public.tls.crt"]); after.Equal(before) {
		t.Error("shop's certificate was not renewed at two thirds of its life")
	}

	// A deleted Secret comes back at the next sync.
	if err := e.c.Delete(ctx, e.secret(t, "shop", rlsidentity.ClientSecretName)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	e.secret(t, "shop", rlsidentity.ClientSecretName)

	// The bank gateways leave the list: their Secret goes, shop's stays.
	m2 := e.manager(t, clk, "shop/public")
	if _, err := m2.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var gone corev1.Secret
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "egw", Name: rlsidentity.ClientSecretName}, &gone); err == nil {
		t.Error("the Secret of gateways no longer listed is still there")
	}
	e.secret(t, "shop", rlsidentity.ClientSecretName)
	if got := e.secret(t, managerNS, rlsidentity.CASecretName).Annotations[rlsidentity.AnnotationClientNamespaces]; got != "shop" {
		t.Errorf("recorded client namespaces %q, want shop", got)
	}
}

// TestManagerLeavesForeignSecretsAlone: a Secret of the client name that
// the manager did not write is not overwritten, a namespace that does not
// exist is waited for, and neither stops the other gateways' certificates
// or makes every sync issue new ones.
func TestManagerLeavesForeignSecretsAlone(t *testing.T) {
	e := startEnv(t)
	ctx := t.Context()
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "foreign", Name: rlsidentity.ClientSecretName},
		Data: map[string][]byte{"mine": []byte("keep")}}
	if err := e.c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Now()}
	m := e.manager(t, clk, "foreign/gw", "nowhere/gw", "shop/public")
	_, err := m.Sync(ctx)
	if err == nil || !strings.Contains(err.Error(), "Secret foreign/floodgate-ratelimit-client exists and is not floodgate-manager's") ||
		!strings.Contains(err.Error(), "namespace nowhere does not exist") {
		t.Fatalf("Sync = %v, want both problems reported", err)
	}
	if got := e.secret(t, "foreign", rlsidentity.ClientSecretName); string(got.Data["mine"]) != "keep" || len(got.Data) != 1 {
		t.Errorf("the foreign Secret was touched: %v", keys(got.Data))
	}
	e.secret(t, "shop", rlsidentity.ClientSecretName)
	rv := e.secret(t, managerNS, rlsidentity.CASecretName).ResourceVersion
	clk.Set(clk.Now().Add(time.Minute))
	if _, err := m.Sync(ctx); err == nil {
		t.Fatal("the second Sync reports nothing")
	}
	if got := e.secret(t, managerNS, rlsidentity.CASecretName).ResourceVersion; got != rv {
		t.Error("a sync that could not write a gateway's Secret rewrote the CA Secret: it issues a new certificate every time")
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// checkCalls serves a document of two policies, each enforced at one of
// the gateways, from a real central service using the serving Secret's
// files, and calls it as each gateway with the files of its Secret.
func checkCalls(t *testing.T, serving *corev1.Secret, gateways map[string]*corev1.Secret) {
	t.Helper()
	dir := t.TempDir()
	for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(dir, k), serving.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tlsCfg, err := envoyrls.ServerTLS(envoyrls.TLSFiles{
		CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), ClientCAFile: filepath.Join(dir, "ca.crt"),
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	doc := &config.Config{APIVersion: config.APIVersion}
	if err := yaml.UnmarshalStrict([]byte(`
apiVersion: floodgate.dev/sidecar-config/v1
policies:
- {name: edge, namespace: shop, uid: a, gateways: [shop/public], rules: [{name: r, key: [{clientIP: {}}], limit: {requests: 5, per: 1h}}]}
- {name: edge, namespace: bank, uid: b, gateways: [bank/public], rules: [{name: r, key: [{clientIP: {}}], limit: {requests: 5, per: 1h}}]}
`), doc); err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	met := metrics.NewMetrics(reg)
	set, err := ruleset.Compile(doc, labels.Set{}, met)
	if err != nil {
		t.Fatal(err)
	}
	store, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Options{Store: store, Fallback: store, Metrics: met})
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
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)))
	srv.Register(gs)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	for ref, s := range gateways {
		ns, name, _ := strings.Cut(ref, "/")
		certKey, keyKey, _ := rlsidentity.ClientKeys(rlsidentity.Gateway{Namespace: ns, Name: name})
		pair, err := tls.X509KeyPair(s.Data[certKey], s.Data[keyKey])
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(s.Data[rlsidentity.KeyCACert])
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			ServerName: "floodgate-ratelimit.fg.svc.cluster.local", RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12,
		})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		c := rlsv3.NewRateLimitServiceClient(conn)
		for _, policy := range []string{"shop/edge", "bank/edge"} {
			callCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := c.ShouldRateLimit(callCtx, &rlsv3.RateLimitRequest{Domain: config.GatewayDomain, Descriptors: []*rlcommonv3.RateLimitDescriptor{{
				Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: config.PolicyEntryKey, Value: policy}, {Key: config.RemoteAddressEntryKey, Value: "192.0.2.1"}},
			}}})
			cancel()
			own := strings.HasPrefix(policy, ns+"/")
			switch {
			case own && err != nil:
				t.Errorf("gateway %s asking about its policy %s: %v", ref, policy, err)
			case !own && status.Code(err) != codes.PermissionDenied:
				t.Errorf("gateway %s asking about %s: %v, want PermissionDenied", ref, policy, err)
			}
		}
	}
}
