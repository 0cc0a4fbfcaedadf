package gatewayconfig

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	jsonpatch "github.com/evanphx/json-patch/v5"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The fields of Envoy Gateway's EnvoyPatchPolicy
// (gateway.envoyproxy.io/v1alpha1, api/v1alpha1/envoypatchpolicy_types.go),
// decoded strictly: a misspelt field fails the test.
type eppSpec struct {
	TargetRef struct {
		Group string `json:"group"`
		Kind  string `json:"kind"`
		Name  string `json:"name"`
	} `json:"targetRef"`
	Type        string     `json:"type"`
	JSONPatches []eppPatch `json:"jsonPatches"`
	Priority    int32      `json:"priority,omitempty"`
}

type eppPatch struct {
	Type      string `json:"type"`
	Name      string `json:"name"`
	Operation struct {
		Op       string          `json:"op"`
		Path     *string         `json:"path,omitempty"`
		JSONPath *string         `json:"jsonPath,omitempty"`
		From     *string         `json:"from,omitempty"`
		Value    json.RawMessage `json:"value,omitempty"`
	} `json:"operation"`
}

// egHCM returns a listener's connection manager as Envoy Gateway builds
// one: some filters, then the router.
func egHCM(t *testing.T, routeConfig string) *anypb.Any {
	t.Helper()
	router, err := anypb.New(&routerv3.Router{})
	if err != nil {
		t.Fatal(err)
	}
	health, err := anypb.New(&routerv3.Router{}) // any typed filter stands in for Envoy Gateway's own
	if err != nil {
		t.Fatal(err)
	}
	a, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: "http",
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			RouteConfigName: routeConfig,
		}},
		HttpFilters: []*hcmv3.HttpFilter{
			{Name: "envoy.filters.http.health_check", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: health}},
			{Name: RouterFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestEnvoyGatewayPatchesApply applies the generated EnvoyPatchPolicy's
// JSON patches, as Envoy Gateway does (JSONPath to JSON pointers, then RFC
// 6902), to xDS resources shaped and named as Envoy Gateway's name scheme
// V2 builds them for the fixture Gateway, decodes the results into
// go-control-plane's types and validates them.
func TestEnvoyGatewayPatchesApply(t *testing.T) {
	t.Parallel()
	epp, err := EnvoyGateway(fixtureGateway(), fixtureService(), NameSchemeV2)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := epp.GetAPIVersion()+"/"+epp.GetKind(), "gateway.envoyproxy.io/v1alpha1/EnvoyPatchPolicy"; got != want {
		t.Errorf("apiVersion/kind = %s, want %s", got, want)
	}
	raw, err := json.Marshal(epp.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	var spec eppSpec
	if err := dec.Decode(&spec); err != nil {
		t.Fatalf("the spec has fields EnvoyPatchPolicy does not: %v", err)
	}
	if spec.Type != "JSONPatch" || spec.TargetRef.Kind != "Gateway" || spec.TargetRef.Name != "public" || spec.TargetRef.Group != "gateway.networking.k8s.io" {
		t.Errorf("spec %+v, want a JSONPatch policy targeting the Gateway public", spec)
	}

	// The resources Envoy Gateway would build for the fixture (scheme V2).
	resources := map[string]proto.Message{}
	listener := func(name string, chains int) {
		l := &listenerv3.Listener{Name: name, Address: socket("0.0.0.0", 10080)}
		hcm := &listenerv3.FilterChain{Name: name, Filters: []*listenerv3.Filter{{
			Name: HCMFilter, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: egHCM(t, "http-80")},
		}}}
		if chains == 0 {
			l.DefaultFilterChain = hcm
		}
		for i := range chains {
			c := proto.Clone(hcm).(*listenerv3.FilterChain)
			c.Name = "chain-" + strconv.Itoa(i)
			l.FilterChains = append(l.FilterChains, c)
		}
		resources[typeListener+" "+name] = l
	}
	listener("tcp-80", 0)
	listener("tcp-443", 2)
	route := func(name string, redirect bool) *routev3.Route {
		r := &routev3.Route{Name: name, Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}}
		if redirect {
			r.Action = &routev3.Route_Redirect{Redirect: &routev3.RedirectAction{HostRedirect: "example.org"}}
		} else {
			r.Action = &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "httproute/x/rule/0"}}}
		}
		return r
	}
	for _, rc := range []string{"http-80", "infra/public/https"} {
		resources[typeRouteConfig+" "+rc] = &routev3.RouteConfiguration{Name: rc, VirtualHosts: []*routev3.VirtualHost{{
			Name: "api_example_com", Domains: []string{"api.example.com"},
			Routes: []*routev3.Route{
				route("httproute/shop/api/rule/0/match/0/api_example_com", false),
				route("httproute/shop/api/rule/1/match/0/api_example_com", false),
				route("httproute/shop/api/rule/10/match/0/api_example_com", false),
				route("httproute/shop/api.v2/rule/0/match/0/api_example_com", false),
				route("httproute/other/web/rule/0/match/0/api_example_com", false),
				route("httproute/other/redirect/rule/0/match/0/api_example_com", true),
				// A GRPCRoute of the HTTPRoute's name: another route.
				route("grpcroute/shop/api/rule/0/match/0/api_example_com", false),
			},
		}, {
			Name: "grpc_example_com", Domains: []string{"grpc.example.com"},
			Routes: []*routev3.Route{
				route("grpcroute/shop/orders/rule/0/match/0/grpc_example_com", false),
				route("grpcroute/shop/orders/rule/1/match/0/grpc_example_com", false),
				route("grpcroute/shop/orders/rule/1/match/1/grpc_example_com", false),
				route("grpcroute/shop/orders/rule/1/match/-1/grpc_example_com", false),
				route("httproute/shop/orders/rule/1/match/0/grpc_example_com", false),
			},
		}}}
	}

	for i, p := range spec.JSONPatches {
		key := p.Type + " " + p.Name
		if p.Type == typeCluster && p.Operation.Path == nil && p.Operation.JSONPath == nil {
			var c clusterv3.Cluster
			if err := protojson.Unmarshal(p.Operation.Value, &c); err != nil {
				t.Fatalf("patch %d: the cluster does not decode: %v", i, err)
			}
			if err := c.ValidateAll(); err != nil {
				t.Errorf("patch %d: the cluster fails Envoy's validation: %v", i, err)
			}
			checkUpstreamTLS(t, &c, fixtureService())
			resources[key] = &c
			continue
		}
		res, ok := resources[key]
		if !ok {
			t.Fatalf("patch %d names %s %s, which Envoy Gateway does not build for this Gateway", i, p.Type, p.Name)
		}
		doc, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		pointers := []string{""}
		if p.Operation.JSONPath != nil {
			if pointers, err = locate(doc, *p.Operation.JSONPath); err != nil {
				t.Fatalf("patch %d: %v", i, err)
			}
			if len(pointers) == 0 {
				t.Fatalf("patch %d: JSONPath %s selects nothing in %s (Envoy Gateway reports that as an error)", i, *p.Operation.JSONPath, p.Name)
			}
		}
		for _, ptr := range pointers {
			if p.Operation.Path != nil {
				ptr += *p.Operation.Path
			}
			op := []map[string]any{{"op": p.Operation.Op, "path": ptr, "value": p.Operation.Value}}
			opJSON, _ := json.Marshal(op)
			patch, err := jsonpatch.DecodePatch(opJSON)
			if err != nil {
				t.Fatal(err)
			}
			if doc, err = patch.Apply(doc); err != nil {
				t.Fatalf("patch %d at %s: %v", i, ptr, err)
			}
		}
		next := res.ProtoReflect().New().Interface()
		if err := protojson.Unmarshal(doc, next); err != nil {
			t.Fatalf("patch %d: the patched %s does not decode: %v", i, p.Name, err)
		}
		if err := next.(interface{ ValidateAll() error }).ValidateAll(); err != nil {
			t.Errorf("patch %d: the patched %s fails Envoy's validation: %v", i, p.Name, err)
		}
		resources[key] = next
	}

	// Every HTTP filter chain has floodgate's filter just before the router.
	for _, name := range []string{"tcp-80", "tcp-443"} {
		l := resources[typeListener+" "+name].(*listenerv3.Listener)
		chains := l.GetFilterChains()
		if l.GetDefaultFilterChain() != nil {
			chains = append(chains, l.GetDefaultFilterChain())
		}
		for _, c := range chains {
			var hcm hcmv3.HttpConnectionManager
			if err := c.GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, f := range hcm.GetHttpFilters() {
				names = append(names, f.GetName())
			}
			if want := []string{"envoy.filters.http.health_check", FilterName, RouterFilter}; !slices.Equal(names, want) {
				t.Errorf("listener %s chain %s: filters %q, want %q", name, c.GetName(), names, want)
			}
		}
	}
	// Each route has the policies that apply to it.
	want := map[string][]string{
		"http-80 httproute/shop/api/rule/0/match/0/api_example_com":             {"infra/edge", "shop/api-limits"},
		"http-80 httproute/shop/api/rule/1/match/0/api_example_com":             {"infra/edge", "shop/api-limits"},
		"http-80 httproute/shop/api/rule/10/match/0/api_example_com":            {"infra/edge"},
		"http-80 httproute/shop/api.v2/rule/0/match/0/api_example_com":          {"infra/edge"},
		"http-80 httproute/other/web/rule/0/match/0/api_example_com":            {"infra/edge"},
		"http-80 httproute/other/redirect/rule/0/match/0/api_example_com":       nil,
		"infra/public/https httproute/shop/api/rule/0/match/0/api_example_com":  {"infra/edge", "infra/tls-only", "shop/api-limits"},
		"infra/public/https httproute/other/web/rule/0/match/0/api_example_com": {"infra/edge", "infra/tls-only"},
		// The GRPCRoute's rule 1, every match of it, on the https listener
		// it attaches to; not its rule 0, nor an HTTPRoute of its name,
		// nor a GRPCRoute of the HTTPRoute's name.
		"infra/public/https grpcroute/shop/orders/rule/1/match/0/grpc_example_com":  {"infra/edge", "infra/tls-only", "shop/orders-limits"},
		"infra/public/https grpcroute/shop/orders/rule/1/match/1/grpc_example_com":  {"infra/edge", "infra/tls-only", "shop/orders-limits"},
		"infra/public/https grpcroute/shop/orders/rule/1/match/-1/grpc_example_com": {"infra/edge", "infra/tls-only", "shop/orders-limits"},
		"infra/public/https grpcroute/shop/orders/rule/0/match/0/grpc_example_com":  {"infra/edge", "infra/tls-only"},
		"infra/public/https httproute/shop/orders/rule/1/match/0/grpc_example_com":  {"infra/edge", "infra/tls-only"},
		"infra/public/https grpcroute/shop/api/rule/0/match/0/api_example_com":      {"infra/edge", "infra/tls-only"},
		"http-80 grpcroute/shop/orders/rule/1/match/0/grpc_example_com":             {"infra/edge"},
		"http-80 grpcroute/shop/api/rule/0/match/0/api_example_com":                 {"infra/edge"},
	}
	for k, w := range want {
		rc, name, _ := strings.Cut(k, " ")
		var got []string
		for _, vh := range resources[typeRouteConfig+" "+rc].(*routev3.RouteConfiguration).GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if r.GetName() != name {
					continue
				}
				for _, rl := range r.GetRoute().GetRateLimits() {
					got = append(got, rl.GetActions()[0].GetGenericKey().GetDescriptorValue())
				}
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, w) {
			t.Errorf("%s: rate_limits of policies %q, want %q", k, got, w)
		}
	}
}

// TestEnvoyGatewayNameSchemes pins the resource names of both schemes.
func TestEnvoyGatewayNameSchemes(t *testing.T) {
	t.Parallel()
	gw := fixtureGateway()
	gw.Listeners = append(gw.Listeners, Listener{Name: "http-alt", Port: 80, Protocol: "HTTP"})
	names := func(s NameScheme) []string {
		epp, err := EnvoyGateway(gw, fixtureService(), s)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range epp.Object["spec"].(map[string]any)["jsonPatches"].([]any) {
			m := p.(map[string]any)
			typ := m["type"].(string)
			out = append(out, typ[strings.LastIndexByte(typ, '.')+1:]+" "+m["name"].(string))
		}
		return out
	}
	if got, want := names(NameSchemeV2), []string{
		"Cluster floodgate-ratelimit", "Listener tcp-80", "Listener tcp-443",
		"RouteConfiguration http-80", "RouteConfiguration infra/public/https",
		"RouteConfiguration http-80", "RouteConfiguration http-80", "RouteConfiguration infra/public/https", "RouteConfiguration infra/public/https",
		"RouteConfiguration infra/public/https",
	}; !slices.Equal(got, want) {
		t.Errorf("scheme V2 patches %q, want %q", got, want)
	}
	if got, want := names(NameSchemeV1), []string{
		"Cluster floodgate-ratelimit", "Listener infra/public/http", "Listener infra/public/https",
		"RouteConfiguration infra/public/http", "RouteConfiguration infra/public/https",
		"RouteConfiguration infra/public/http", "RouteConfiguration infra/public/http", "RouteConfiguration infra/public/https", "RouteConfiguration infra/public/https",
		"RouteConfiguration infra/public/https",
	}; !slices.Equal(got, want) {
		t.Errorf("scheme V1 patches %q, want %q", got, want)
	}
}

// locate resolves the JSONPath forms the generator writes, as Envoy
// Gateway's JSONPath library does, into JSON pointers:
// ..<field>[?(@.name=='<value>')], ..<field>[?(@.name =~ '<regexp>')] (a
// search, not anchored unless the pattern is) and ..<field>[?(@.<key>)].
func locate(doc []byte, path string) ([]string, error) {
	m := regexp.MustCompile(`^\.\.([a-z_]+)\[\?\(@\.([a-z_]+)(?:\s*(==|=~)\s*'([^']*)')?\)\]$`).FindStringSubmatch(path)
	if m == nil {
		return nil, fmt.Errorf("the test's JSONPath model does not know %q", path)
	}
	field, key, op, arg := m[1], m[2], m[3], m[4]
	var re *regexp.Regexp
	if op == "=~" {
		var err error
		if re, err = regexp.Compile(arg); err != nil {
			return nil, err
		}
	}
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, err
	}
	var out []string
	var walk func(v any, ptr string)
	walk = func(v any, ptr string) {
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				child := ptr + "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
				if arr, ok := x[k].([]any); ok && k == field {
					for i, e := range arr {
						em, ok := e.(map[string]any)
						if !ok {
							continue
						}
						val, has := em[key]
						s, _ := val.(string)
						if (op == "" && has) || (op == "==" && s == arg) || (op == "=~" && re.MatchString(s)) {
							out = append(out, child+"/"+strconv.Itoa(i))
						}
					}
				}
				walk(x[k], child)
			}
		case []any:
			for i, e := range x {
				walk(e, ptr+"/"+strconv.Itoa(i))
			}
		}
	}
	walk(v, "")
	return out, nil
}
