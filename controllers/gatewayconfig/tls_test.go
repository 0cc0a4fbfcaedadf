package gatewayconfig

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// checkUpstreamTLS checks the cluster c of svc: TLS with the client
// certificate and the CA bundle from the SDS files under ClientCertDir,
// watched for the kubelet's updates, the service's name checked, and h2
// offered; plaintext when svc does not authenticate callers.
func checkUpstreamTLS(t *testing.T, c *clusterv3.Cluster, svc Service) {
	t.Helper()
	if !svc.TLS {
		if c.GetTransportSocket() != nil {
			t.Errorf("cluster %s: a transport socket %v for a plaintext service", c.GetName(), c.GetTransportSocket())
		}
		return
	}
	ts := c.GetTransportSocket()
	if ts.GetName() != TLSTransportSocket {
		t.Fatalf("cluster %s: transport socket %q, want %q", c.GetName(), ts.GetName(), TLSTransportSocket)
	}
	var up tlsv3.UpstreamTlsContext
	if err := ts.GetTypedConfig().UnmarshalTo(&up); err != nil {
		t.Fatalf("cluster %s: the transport socket is not an UpstreamTlsContext: %v", c.GetName(), err)
	}
	if err := up.ValidateAll(); err != nil {
		t.Errorf("cluster %s: the TLS context fails Envoy's validation: %v", c.GetName(), err)
	}
	if up.GetSni() != svc.Host() {
		t.Errorf("SNI %q, want %q", up.GetSni(), svc.Host())
	}
	common := up.GetCommonTlsContext()
	if !slices.Equal(common.GetAlpnProtocols(), []string{"h2"}) {
		t.Errorf("ALPN %q, want h2: the service's gRPC server refuses a TLS connection without it", common.GetAlpnProtocols())
	}
	source := func(sds *tlsv3.SdsSecretConfig, name, file string) {
		t.Helper()
		pcs := sds.GetSdsConfig().GetPathConfigSource()
		if sds.GetName() != name || pcs.GetPath() != ClientCertDir+"/"+file || pcs.GetWatchedDirectory().GetPath() != ClientCertDir {
			t.Errorf("SDS config %v, want %s from %s/%s, watching the directory", sds, name, ClientCertDir, file)
		}
	}
	if certs := common.GetTlsCertificateSdsSecretConfigs(); len(certs) != 1 || len(common.GetTlsCertificates()) != 0 {
		t.Errorf("client certificates %v, want one from SDS", certs)
	} else {
		source(certs[0], ClientCertSDSName, ClientCertSDSFile)
	}
	combined := common.GetCombinedValidationContext()
	source(combined.GetValidationContextSdsSecretConfig(), TrustedCASDSName, TrustedCASDSFile)
	sans := combined.GetDefaultValidationContext().GetMatchTypedSubjectAltNames()
	if len(sans) != 1 || sans[0].GetSanType() != tlsv3.SubjectAltNameMatcher_DNS || sans[0].GetMatcher().GetExact() != svc.Host() {
		t.Errorf("subject alternative names matched %v, want exactly DNS %s", sans, svc.Host())
	}
}

// readSDS decodes an SDS file as Envoy's path source does: a
// DiscoveryResponse whose resources are Secrets.
func readSDS(t *testing.T, file []byte) *tlsv3.Secret {
	t.Helper()
	j, err := yaml.YAMLToJSON(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(j)))
	dec.DisallowUnknownFields()
	var resp struct {
		VersionInfo string            `json:"version_info"`
		Resources   []json.RawMessage `json:"resources"`
	}
	if err := dec.Decode(&resp); err != nil {
		t.Fatalf("the SDS file is not a DiscoveryResponse: %v\n%s", err, file)
	}
	if len(resp.Resources) != 1 {
		t.Fatalf("the SDS file holds %d resources; Envoy's SDS takes exactly one", len(resp.Resources))
	}
	var a anypb.Any
	if err := protojson.Unmarshal(resp.Resources[0], &a); err != nil {
		t.Fatal(err)
	}
	var s tlsv3.Secret
	if err := a.UnmarshalTo(&s); err != nil {
		t.Fatalf("the resource is not an SDS Secret: %v", err)
	}
	if err := s.ValidateAll(); err != nil {
		t.Errorf("the SDS Secret fails Envoy's validation: %v", err)
	}
	return &s
}

// The SDS files carry the certificate, key and CA bundle whole, under the
// names the cluster asks for.
func TestSDSFiles(t *testing.T) {
	t.Parallel()
	const cert, key, ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n", "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"
	f, err := ClientCertificateSDS([]byte(cert), []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	s := readSDS(t, f)
	inline := func(d *corev3.DataSource) string { return d.GetInlineString() }
	if s.GetName() != ClientCertSDSName || inline(s.GetTlsCertificate().GetCertificateChain()) != cert || inline(s.GetTlsCertificate().GetPrivateKey()) != key {
		t.Errorf("client certificate SDS = %v", s)
	}
	f, err = TrustedCASDS([]byte(ca))
	if err != nil {
		t.Fatal(err)
	}
	s = readSDS(t, f)
	if s.GetName() != TrustedCASDSName || inline(s.GetValidationContext().GetTrustedCa()) != ca {
		t.Errorf("CA SDS = %v", s)
	}
}
