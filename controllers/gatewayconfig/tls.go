package gatewayconfig

import (
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// Client certificates (Service.TLS).
//
// When the central service authenticates its callers, each gateway
// presents a client certificate that floodgate-manager issues for it. The
// manager writes, into the gateway's client-certificate Secret, two files
// in Envoy's file-based SDS format (a DiscoveryResponse with one Secret):
// the gateway's certificate and key, and the CA bundle that the service's
// certificate must verify against. The gateway's pods mount them under
// ClientCertDir, and the generated cluster reads them from there through
// SDS path sources that watch the directory: when the kubelet updates the
// Secret volume (it moves a new "..data" link into it), Envoy reads the
// files again, so a renewed certificate or a rotated CA is used without a
// restart. Envoy reads certificate files named directly in a cluster only
// once, so they are not named directly.
const (
	// ClientCertDir is where the gateway's pods mount their
	// client-certificate files.
	ClientCertDir = "/etc/floodgate/ratelimit-client"
	// ClientCertSDSFile holds the gateway's certificate and key
	// (ClientCertificateSDS).
	ClientCertSDSFile = "tls.sds.yaml"
	// TrustedCASDSFile holds the CA bundle that the service's certificate
	// must verify against (TrustedCASDS).
	TrustedCASDSFile = "ca.sds.yaml"
	// ClientCertSDSName and TrustedCASDSName name the SDS secrets in the
	// files, which the cluster asks for.
	ClientCertSDSName = "floodgate-ratelimit-client"
	TrustedCASDSName  = "floodgate-ratelimit-ca"
	// TLSTransportSocket is Envoy's TLS transport socket.
	TLSTransportSocket = "envoy.transport_sockets.tls"
)

// ClientCertificateSDS renders the file ClientCertSDSFile for a client
// certificate (chain) and key in PEM.
func ClientCertificateSDS(certPEM, keyPEM []byte) ([]byte, error) {
	return sdsFile(&tlsv3.Secret{Name: ClientCertSDSName, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: string(certPEM)}},
		PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: string(keyPEM)}},
	}}})
}

// TrustedCASDS renders the file TrustedCASDSFile for a CA bundle in PEM.
func TrustedCASDS(caPEM []byte) ([]byte, error) {
	return sdsFile(&tlsv3.Secret{Name: TrustedCASDSName, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: string(caPEM)}},
	}}})
}

// sdsFile renders s as an SDS path source reads it: a DiscoveryResponse
// whose one resource is s, in YAML.
func sdsFile(s *tlsv3.Secret) ([]byte, error) {
	if err := validate("SDS secret "+s.Name, s); err != nil {
		return nil, err
	}
	a, err := anypb.New(s)
	if err != nil {
		return nil, fmt.Errorf("pack SDS secret %s: %w", s.Name, err)
	}
	res, err := toMap(a)
	if err != nil {
		return nil, err
	}
	out, err := yaml.Marshal(map[string]any{"resources": []any{res}})
	if err != nil {
		return nil, fmt.Errorf("render SDS secret %s: %w", s.Name, err)
	}
	return out, nil
}

// sdsSource is an SDS config that reads file in ClientCertDir, again
// whenever an entry is moved into the directory.
func sdsSource(name, file string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{
		ResourceApiVersion: corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_PathConfigSource{PathConfigSource: &corev3.PathConfigSource{
			Path:             ClientCertDir + "/" + file,
			WatchedDirectory: &corev3.WatchedDirectory{Path: ClientCertDir},
		}},
	}}
}

// UpstreamTLS returns the transport socket of the cluster of svc when it
// authenticates its callers: TLS 1.2 or 1.3 with ALPN h2 (gRPC), the
// gateway's client certificate from ClientCertSDSFile, and the service's
// certificate verified against TrustedCASDSFile for its Service name,
// which is also the SNI.
func UpstreamTLS(svc Service) (*corev3.TransportSocket, error) {
	ctx := &tlsv3.UpstreamTlsContext{
		Sni: svc.Host(),
		CommonTlsContext: &tlsv3.CommonTlsContext{
			AlpnProtocols: []string{"h2"},
			TlsParams: &tlsv3.TlsParameters{
				TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
				TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3,
			},
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsSource(ClientCertSDSName, ClientCertSDSFile)},
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext: &tlsv3.CertificateValidationContext{
					MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
						SanType: tlsv3.SubjectAltNameMatcher_DNS,
						Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: svc.Host()}},
					}},
				},
				ValidationContextSdsSecretConfig: sdsSource(TrustedCASDSName, TrustedCASDSFile),
			}},
		},
	}
	tc, err := anypb.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("pack the upstream TLS context: %w", err)
	}
	return &corev3.TransportSocket{Name: TLSTransportSocket, ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: tc}}, nil
}
