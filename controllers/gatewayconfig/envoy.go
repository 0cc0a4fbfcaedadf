package gatewayconfig

import (
	"fmt"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"
)

// appCluster names the application's cluster, virtual host and route in
// the bootstrap Envoy generates.
const appCluster = "app"

// EnvoyOptions shape the plain Envoy bootstrap.
type EnvoyOptions struct {
	// ListenPort is the port Envoy takes requests on.
	ListenPort uint32
	// UpstreamHost and UpstreamPort are the application Envoy routes to.
	UpstreamHost string
	UpstreamPort uint32
}

// Envoy returns a complete Envoy bootstrap that enforces policies through
// the central rate-limit service at svc (floodgate-sidecar --grpc-listen,
// in a cluster or standalone with --policy-file): a listener on
// o.ListenPort whose one route sends every request to the application,
// with each policy's rate_limits entry and floodgate's rate-limit filter
// before the router; a cluster for the application and one for the
// service. The connection manager uses the peer address as the client
// address (use_remote_address), as an edge proxy should; Envoy behind
// another proxy sets xff_num_trusted_hops instead. An Envoy that has its
// own configuration takes the filter, the cluster and the route entries
// from it.
func Envoy(policies []Policy, svc Service, o EnvoyOptions) (*bootstrapv3.Bootstrap, error) {
	if err := svc.Validate(); err != nil {
		return nil, err
	}
	filter, err := HTTPFilter(svc, ClusterName)
	if err != nil {
		return nil, err
	}
	router, err := anypb.New(&routerv3.Router{})
	if err != nil {
		return nil, fmt.Errorf("pack the router config: %w", err)
	}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix:       "ingress",
		UseRemoteAddress: wrapperspb.Bool(true),
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: "local",
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    appCluster,
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Name:  appCluster,
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: appCluster},
						RateLimits:       RateLimits(policies),
					}},
				}},
			}},
		}},
		HttpFilters: []*hcmv3.HttpFilter{filter, {Name: RouterFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	}
	hcmAny, err := anypb.New(hcm)
	if err != nil {
		return nil, fmt.Errorf("pack the connection manager config: %w", err)
	}
	rls, err := Cluster(svc)
	if err != nil {
		return nil, err
	}
	b := &bootstrapv3.Bootstrap{
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{
			Listeners: []*listenerv3.Listener{{
				Name:    "ingress",
				Address: socket("0.0.0.0", o.ListenPort),
				FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
					Name: HCMFilter, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcmAny},
				}}}},
			}},
			Clusters: []*clusterv3.Cluster{{
				Name:                 appCluster,
				ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
				ConnectTimeout:       durationpb.New(time.Second),
				LoadAssignment: &endpointv3.ClusterLoadAssignment{
					ClusterName: appCluster,
					Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
						HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: socket(o.UpstreamHost, o.UpstreamPort)}},
					}}}},
				},
			}, rls},
		},
	}
	if err := validate("bootstrap", b); err != nil {
		return nil, err
	}
	return b, nil
}

func socket(host string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// YAML renders m as YAML with Envoy's field names, as Envoy reads it.
func YAML(m proto.Message) ([]byte, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal %T: %w", m, err)
	}
	out, err := yaml.JSONToYAML(b)
	if err != nil {
		return nil, fmt.Errorf("render %T as YAML: %w", m, err)
	}
	return out, nil
}
