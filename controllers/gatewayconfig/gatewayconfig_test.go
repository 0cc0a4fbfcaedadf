package gatewayconfig

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istionet "istio.io/api/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

// fixtureService is the chart's central service, which authenticates
// its callers (the chart's default).
func fixtureService() Service {
	return Service{Name: "floodgate-ratelimit", Namespace: "floodgate-system", Port: 8082, TLS: true}
}

// plaintextService is the central service without TLS.
func plaintextService() Service {
	s := fixtureService()
	s.TLS = false
	return s
}

// fixtureGateway has an HTTP and an HTTPS listener, and four policies:
// shop/api-limits on two rules of HTTPRoute shop/api (one unnamed, one
// named "login"), infra/edge on the whole Gateway, infra/tls-only on its
// https listener, and shop/orders-limits on the second (unnamed) rule of
// GRPCRoute shop/orders, attached to the https listener.
func fixtureGateway() *Gateway {
	return &Gateway{
		Namespace: "infra", Name: "public",
		Listeners: []Listener{{Name: "http", Port: 80, Protocol: "HTTP"}, {Name: "https", Port: 443, Protocol: "HTTPS"}, {Name: "tcp", Port: 5432, Protocol: "TCP"}},
		Attachments: []Attachment{
			{Policy: Policy{Namespace: "shop", Name: "api-limits", Headers: []string{"X-Api-Key", "X-Tier"}},
				Route: &Route{Namespace: "shop", Name: "api", Hostnames: []string{"api.example.com"},
					Rules: []RouteRule{{Index: 0}, {Index: 1, Name: "login"}}}},
			{Policy: Policy{Namespace: "infra", Name: "edge"}},
			{Policy: Policy{Namespace: "infra", Name: "tls-only"}, Listener: "https"},
			{Policy: Policy{Namespace: "shop", Name: "orders-limits", Headers: []string{"X-Api-Key"}},
				Route: &Route{Kind: KindGRPCRoute, Namespace: "shop", Name: "orders", Hostnames: []string{"grpc.example.com"},
					Rules: []RouteRule{{Index: 1}}, Listeners: []string{"https"}}},
		},
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	file := filepath.Join("testdata", name+".golden.yaml")
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test ./controllers/gatewayconfig -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s (rerun with -update if the change is intended)\n got:\n%s", name, file, got)
	}
}

func render(t *testing.T, u *unstructured.Unstructured) []byte {
	t.Helper()
	b, err := yaml.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGolden(t *testing.T) {
	t.Parallel()
	gw, svc := fixtureGateway(), fixtureService()
	ef, err := Istio(gw, svc)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "istio", render(t, ef))
	ef, err = Istio(gw, plaintextService())
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "istio-plaintext", render(t, ef))
	for _, s := range []NameScheme{NameSchemeV2, NameSchemeV1} {
		epp, err := EnvoyGateway(gw, svc, s)
		if err != nil {
			t.Fatal(err)
		}
		golden(t, "envoy-gateway-"+strings.ToLower(string(s)), render(t, epp))
	}
	b, err := Envoy([]Policy{{Namespace: "", Name: "edge", Headers: []string{"X-Api-Key"}}},
		Service{Name: "floodgate", Namespace: "default", Port: 8082}, EnvoyOptions{ListenPort: 10000, UpstreamHost: "127.0.0.1", UpstreamPort: 8080})
	if err != nil {
		t.Fatal(err)
	}
	y, err := YAML(b)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "envoy", y)
}

// TestIstioEnvoyFilterIsValid decodes the generated EnvoyFilter's spec
// into Istio's own API type, which refuses unknown fields and enum values,
// and each patch value into go-control-plane's Envoy types, validated; a
// route patch is merged, as Istio merges it, into a route like those Istio
// builds, and the result validated whole.
func TestIstioEnvoyFilterIsValid(t *testing.T) {
	t.Parallel()
	for _, svc := range []Service{fixtureService(), plaintextService()} {
		t.Run(fmt.Sprintf("tls=%v", svc.TLS), func(t *testing.T) {
			t.Parallel()
			checkIstio(t, svc)
		})
	}
}

func checkIstio(t *testing.T, svc Service) {
	ef, err := Istio(fixtureGateway(), svc)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ef.GetAPIVersion()+"/"+ef.GetKind(), "networking.istio.io/v1alpha3/EnvoyFilter"; got != want {
		t.Errorf("apiVersion/kind = %s, want %s", got, want)
	}
	spec, err := json.Marshal(ef.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	var typed istionet.EnvoyFilter
	if err := protojson.Unmarshal(spec, &typed); err != nil {
		t.Fatalf("Istio's EnvoyFilter type rejects the spec: %v\n%s", err, spec)
	}
	if got := len(typed.GetTargetRefs()); got != 1 || typed.GetTargetRefs()[0].GetKind() != "Gateway" || typed.GetTargetRefs()[0].GetName() != "public" {
		t.Errorf("targetRefs = %v, want the Gateway public", typed.GetTargetRefs())
	}
	var routes, filters, clusters int
	routeNames := map[string]bool{}
	for i, p := range typed.GetConfigPatches() {
		value, err := p.GetPatch().GetValue().MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		switch p.GetApplyTo() {
		case istionet.EnvoyFilter_HTTP_FILTER:
			filters++
			if p.GetPatch().GetOperation() != istionet.EnvoyFilter_Patch_INSERT_BEFORE ||
				p.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() != RouterFilter {
				t.Errorf("patch %d: the filter must go before the router: %v", i, p)
			}
			var f hcmv3.HttpFilter
			if err := protojson.Unmarshal(value, &f); err != nil {
				t.Fatalf("patch %d: %v", i, err)
			}
			if err := f.ValidateAll(); err != nil {
				t.Errorf("patch %d: the filter fails Envoy's validation: %v", i, err)
			}
			var rl ratelimitv3.RateLimit
			if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
				t.Fatal(err)
			}
			want := IstioCluster(svc)
			if svc.TLS {
				want = ClusterName
			}
			if got := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != want {
				t.Errorf("patch %d: the filter asks cluster %q, want %q", i, got, want)
			}
			if !rl.GetRateLimitedAsResourceExhausted() {
				t.Errorf("patch %d: a refused gRPC call must get RESOURCE_EXHAUSTED, not the UNAVAILABLE Envoy maps a 429 to", i)
			}
		case istionet.EnvoyFilter_CLUSTER:
			clusters++
			if p.GetPatch().GetOperation() != istionet.EnvoyFilter_Patch_ADD || p.GetMatch().GetContext() != istionet.EnvoyFilter_GATEWAY {
				t.Errorf("patch %d: the cluster is added to the gateway: %v", i, p)
			}
			var c clusterv3.Cluster
			if err := protojson.Unmarshal(value, &c); err != nil {
				t.Fatalf("patch %d: %v", i, err)
			}
			if err := c.ValidateAll(); err != nil {
				t.Errorf("patch %d: the cluster fails Envoy's validation: %v", i, err)
			}
			checkUpstreamTLS(t, &c, svc)
		case istionet.EnvoyFilter_HTTP_ROUTE:
			routes++
			if p.GetPatch().GetOperation() != istionet.EnvoyFilter_Patch_MERGE ||
				p.GetMatch().GetRouteConfiguration().GetVhost().GetRoute().GetAction() != istionet.EnvoyFilter_RouteConfigurationMatch_RouteMatch_ROUTE {
				t.Errorf("patch %d: routes are merged into, and only those with a route action: %v", i, p)
			}
			routeNames[p.GetMatch().GetRouteConfiguration().GetVhost().GetRoute().GetName()] = true
			var patch routev3.Route
			if err := protojson.Unmarshal(value, &patch); err != nil {
				t.Fatalf("patch %d: %v", i, err)
			}
			istioRoute := &routev3.Route{
				Name:   "shop.api.0",
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "outbound|80||api.shop.svc.cluster.local"}}},
			}
			proto.Merge(istioRoute, &patch)
			if err := istioRoute.ValidateAll(); err != nil {
				t.Errorf("patch %d: the merged route fails Envoy's validation: %v", i, err)
			}
			if got := len(istioRoute.GetRoute().GetRateLimits()); got != 1 {
				t.Errorf("patch %d: merged route has %d rate_limits entries, want 1", i, got)
			}
		default:
			t.Errorf("patch %d: unexpected applyTo %v", i, p.GetApplyTo())
		}
	}
	if filters != 1 {
		t.Errorf("%d filter patches, want 1", filters)
	}
	if want := map[bool]int{true: 1}[svc.TLS]; clusters != want {
		t.Errorf("%d cluster patches, want %d", clusters, want)
	}
	// api-limits: rule 0 by its generated name, rule 1 (login) by name on
	// the route's host; edge on every route; tls-only on port 443;
	// orders-limits on the GRPCRoute's rule 1, named as Istio names an
	// HTTPRoute's rule, on port 443.
	if routes != 5 {
		t.Errorf("%d route patches, want 5", routes)
	}
	for _, n := range []string{"shop.api.0", "login", "", "shop.orders.1"} {
		if !routeNames[n] {
			t.Errorf("no route patch for route name %q", n)
		}
	}
}

func TestEnvoyBootstrapIsValid(t *testing.T) {
	t.Parallel()
	b, err := Envoy([]Policy{{Name: "edge"}, {Namespace: "shop", Name: "api", Headers: []string{"X-Api-Key"}}},
		fixtureService(), EnvoyOptions{ListenPort: 10000, UpstreamHost: "app", UpstreamPort: 8080})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("bootstrap fails Envoy's validation: %v", err)
	}
	y, err := YAML(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rate_limits", "floodgate.ratelimit", "use_remote_address: true", "floodgate-ratelimit.floodgate-system.svc.cluster.local"} {
		if !strings.Contains(string(y), want) {
			t.Errorf("bootstrap YAML lacks %q", want)
		}
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == ClusterName {
			checkUpstreamTLS(t, c, fixtureService())
		}
	}
}

func TestRateLimitActions(t *testing.T) {
	t.Parallel()
	rl := RateLimit(Policy{Namespace: "shop", Name: "api", Headers: []string{"X-Api-Key"}})
	if err := rl.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	if got := rl.GetStage().GetValue(); got != Stage {
		t.Errorf("stage %d, want %d", got, Stage)
	}
	var got []string
	for _, a := range rl.GetActions() {
		switch s := a.GetActionSpecifier().(type) {
		case *routev3.RateLimit_Action_GenericKey_:
			got = append(got, s.GenericKey.GetDescriptorKey()+"="+s.GenericKey.GetDescriptorValue())
		case *routev3.RateLimit_Action_RequestHeaders_:
			if !s.RequestHeaders.GetSkipIfAbsent() {
				t.Errorf("request_headers %s without skip_if_absent: a missing header would drop the descriptor", s.RequestHeaders.GetHeaderName())
			}
			got = append(got, s.RequestHeaders.GetDescriptorKey()+"<-"+s.RequestHeaders.GetHeaderName())
		case *routev3.RateLimit_Action_RemoteAddress_:
			got = append(got, "remote_address")
		}
	}
	want := []string{"floodgate.policy=shop/api", ":authority<-:authority", ":method<-:method", ":path<-:path", "remote_address", "x-api-key<-x-api-key"}
	if !slices.Equal(got, want) {
		t.Errorf("actions %q, want %q", got, want)
	}
}

func TestInvalidInputs(t *testing.T) {
	t.Parallel()
	gw := fixtureGateway()
	gw.Attachments[2].Listener = "nope"
	if _, err := Istio(gw, fixtureService()); err == nil || !strings.Contains(err.Error(), `no listener "nope"`) {
		t.Errorf("Istio with an unknown listener: %v, want an error naming it", err)
	}
	gw = fixtureGateway()
	gw.Attachments[3].Route.Kind = "TLSRoute"
	if _, err := EnvoyGateway(gw, fixtureService(), NameSchemeV2); err == nil || !strings.Contains(err.Error(), `kind "TLSRoute"`) {
		t.Errorf("EnvoyGateway with a TLSRoute: %v, want an error naming its kind", err)
	}
	if _, err := EnvoyGateway(fixtureGateway(), Service{Name: "x", Namespace: "y"}, NameSchemeV2); err == nil || !strings.Contains(err.Error(), "port") {
		t.Errorf("EnvoyGateway without a service port: %v, want an error naming the port", err)
	}
	if _, err := EnvoyGateway(fixtureGateway(), fixtureService(), "V3"); err == nil || !strings.Contains(err.Error(), "name scheme") {
		t.Errorf("EnvoyGateway with name scheme V3: %v", err)
	}
}
