// Package gatewayconfig generates what an Envoy-based gateway needs to
// enforce RateLimitPolicies through floodgate's central rate-limit service:
// Envoy's rate-limit HTTP filter pointed at the service, and on the
// targeted routes the rate-limit actions that send one request descriptor
// per policy (see sidecar/config: config.PolicyEntryKey). It writes them
// for Istio (an EnvoyFilter), Envoy Gateway (an EnvoyPatchPolicy) and
// plain Envoy (a bootstrap). Every function is pure: equal inputs give
// equal objects.
//
// # The request descriptor
//
// Each policy that applies to a route adds one entry to the route's
// rate_limits, whose actions produce, in order: (floodgate.policy,
// "<namespace>/<name>") from a generic_key; :authority, :method and :path
// from request_headers; the client address from remote_address; and one
// request_headers action per header the policy reads (config.
// RequestHeaders), keyed by the header's lower-case name. Every
// request_headers action has skip_if_absent, so a missing header drops its
// entry, not the descriptor: the central service then sees the request as
// a sidecar would, without that header. Envoy sends the first value of a
// repeated header.
//
// The filter and the route entries use Stage, so that other rate-limit
// filters of the gateway (stage 0 by default) ignore floodgate's route
// entries and floodgate's filter ignores theirs.
package gatewayconfig

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	ratelimitconfv3 "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

const (
	// Stage is the rate-limit stage of floodgate's filter and route
	// entries.
	Stage = 7
	// FilterName names floodgate's rate-limit filter in the gateway's
	// HTTP filter chain; the filter's type is Envoy's rate-limit filter.
	FilterName = "floodgate.ratelimit"
	// ClusterName names the cluster of the central service where floodgate
	// defines one (Envoy Gateway and plain Envoy; Istio has its own).
	ClusterName = "floodgate-ratelimit"
	// RouterFilter is the name of Envoy's router filter, before which the
	// rate-limit filter goes.
	RouterFilter = "envoy.filters.http.router"
	// HCMFilter is the name of Envoy's HTTP connection manager.
	HCMFilter = "envoy.filters.network.http_connection_manager"
	// DefaultTimeout bounds a call to the central service; past it the
	// request is admitted (the filter fails open).
	DefaultTimeout = 100 * time.Millisecond
)

// Service is where gateways reach the central rate-limit service.
type Service struct {
	// Name and Namespace name its Kubernetes Service.
	Name, Namespace string
	// Port is the Service's gRPC port.
	Port int32
	// ClusterDomain is the cluster's DNS domain; empty means
	// cluster.local.
	ClusterDomain string
	// Timeout bounds a call; 0 means DefaultTimeout.
	Timeout time.Duration
	// FailureModeDeny makes the gateway refuse a request when the service
	// cannot be reached; by default it admits it.
	FailureModeDeny bool
	// TLS says the service authenticates its callers: the cluster that
	// reaches it speaks TLS and presents the gateway's client
	// certificate, from the files mounted under ClientCertDir
	// (UpstreamTLS).
	TLS bool
}

// Host returns the Service's DNS name.
func (s Service) Host() string {
	d := s.ClusterDomain
	if d == "" {
		d = "cluster.local"
	}
	return s.Name + "." + s.Namespace + ".svc." + d
}

func (s Service) timeout() time.Duration {
	if s.Timeout <= 0 {
		return DefaultTimeout
	}
	return s.Timeout
}

// Validate reports what is missing.
func (s Service) Validate() error {
	if s.Name == "" || s.Namespace == "" {
		return fmt.Errorf("the central rate-limit service needs a name and a namespace, got %q and %q", s.Name, s.Namespace)
	}
	if s.Port < 1 || s.Port > 65535 {
		return fmt.Errorf("the central rate-limit service port must be 1-65535, got %d", s.Port)
	}
	return nil
}

// Policy is a policy enforced at a gateway, as the gateway must describe
// requests for it.
type Policy struct {
	// Namespace and Name identify the policy.
	Namespace, Name string
	// Headers are the request headers its rules read (config.
	// RequestHeaders of its compiled entry).
	Headers []string
}

// PolicyFor returns the Policy of a compiled entry. An expression that
// reads request.headers other than by name, which admission refuses for a
// policy with a targetRef, adds no header: it sees only those listed.
func PolicyFor(p *config.Policy) Policy {
	headers, _ := config.RequestHeaders(p)
	return Policy{Namespace: p.Namespace, Name: p.Name, Headers: headers}
}

// RateLimit returns the route rate_limits entry that sends p's request
// descriptor.
func RateLimit(p Policy) *routev3.RateLimit {
	header := func(name string) *routev3.RateLimit_Action {
		return &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RequestHeaders_{
			RequestHeaders: &routev3.RateLimit_Action_RequestHeaders{
				HeaderName: config.HeaderEntryKey(name), DescriptorKey: config.HeaderEntryKey(name), SkipIfAbsent: true,
			}}}
	}
	actions := make([]*routev3.RateLimit_Action, 0, 5+len(p.Headers))
	actions = append(actions,
		&routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_GenericKey_{GenericKey: &routev3.RateLimit_Action_GenericKey{
			DescriptorKey: config.PolicyEntryKey, DescriptorValue: config.PolicyEntryValue(p.Namespace, p.Name),
		}}},
		header(config.AuthorityEntryKey),
		header(config.MethodEntryKey),
		header(config.PathEntryKey),
		&routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RemoteAddress_{RemoteAddress: &routev3.RateLimit_Action_RemoteAddress{}}},
	)
	for _, h := range p.Headers {
		actions = append(actions, header(h))
	}
	return &routev3.RateLimit{Stage: wrapperspb.UInt32(Stage), Actions: actions}
}

// RateLimits returns the rate_limits entries of policies, ordered by
// namespace and name.
func RateLimits(policies []Policy) []*routev3.RateLimit {
	ps := slices.Clone(policies)
	slices.SortFunc(ps, comparePolicies)
	out := make([]*routev3.RateLimit, 0, len(ps))
	for _, p := range ps {
		out = append(out, RateLimit(p))
	}
	return out
}

func comparePolicies(a, b Policy) int {
	if a.Namespace != b.Namespace {
		if a.Namespace < b.Namespace {
			return -1
		}
		return 1
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}

// HTTPFilter returns the rate-limit filter that asks the central service
// through the cluster named cluster.
func HTTPFilter(svc Service, cluster string) (*hcmv3.HttpFilter, error) {
	rl := &ratelimitv3.RateLimit{
		Domain:                         config.GatewayDomain,
		Stage:                          Stage,
		RequestType:                    "both",
		Timeout:                        durationpb.New(svc.timeout()),
		FailureModeDeny:                svc.FailureModeDeny,
		RateLimitedAsResourceExhausted: true,
		RateLimitService: &ratelimitconfv3.RateLimitServiceConfig{
			GrpcService: &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster},
			}},
			TransportApiVersion: corev3.ApiVersion_V3,
		},
	}
	tc, err := anypb.New(rl)
	if err != nil {
		return nil, fmt.Errorf("pack the rate-limit filter config: %w", err)
	}
	return &hcmv3.HttpFilter{Name: FilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: tc}}, nil
}

// Cluster returns a cluster that reaches the central service over HTTP/2
// (gRPC), resolving its Service name; over TLS with the gateway's client
// certificate when the service authenticates its callers (svc.TLS).
func Cluster(svc Service) (*clusterv3.Cluster, error) {
	opts, err := anypb.New(&httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("pack the HTTP/2 protocol options: %w", err)
	}
	var ts *corev3.TransportSocket
	if svc.TLS {
		if ts, err = UpstreamTLS(svc); err != nil {
			return nil, err
		}
	}
	return &clusterv3.Cluster{
		Name:                 ClusterName,
		TransportSocket:      ts,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		ConnectTimeout:       durationpb.New(time.Second),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		TypedExtensionProtocolOptions: map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts,
		},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: ClusterName,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address:       svc.Host(),
						PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(svc.Port)},
					}}},
				}},
			}}}},
		},
	}, nil
}

// IstioCluster is the name Istio gives the cluster of the central
// service's Service port.
func IstioCluster(svc Service) string {
	return "outbound|" + strconv.Itoa(int(svc.Port)) + "||" + svc.Host()
}

// validate runs go-control-plane's validation of m, with context.
func validate(what string, m interface{ ValidateAll() error }) error {
	if err := m.ValidateAll(); err != nil {
		return fmt.Errorf("generated %s is not valid Envoy config: %w", what, err)
	}
	return nil
}

var _ proto.Message = (*routev3.RateLimit)(nil)
