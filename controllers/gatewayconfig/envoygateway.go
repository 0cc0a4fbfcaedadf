package gatewayconfig

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Envoy Gateway's EnvoyPatchPolicy.
const (
	EnvoyGatewayAPIVersion = "gateway.envoyproxy.io/v1alpha1"
	EnvoyGatewayKind       = "EnvoyPatchPolicy"
)

// Keys of the generated objects that recur.
const (
	keyName      = "name"
	keyOperation = "operation"
	keyType      = "type"
	keyValue     = "value"
)

// The xDS resource types an EnvoyPatchPolicy patches.
const (
	typeListener    = "type.googleapis.com/envoy.config.listener.v3.Listener"
	typeRouteConfig = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	typeCluster     = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
)

// NameScheme is the way Envoy Gateway names the xDS resources it
// generates, which an EnvoyPatchPolicy must name.
type NameScheme string

// The name schemes (Envoy Gateway's XDSNameSchemeV2 runtime flag, on by
// default from Envoy Gateway 1.10).
const (
	// NameSchemeV2: listeners "tcp-<port>", HTTP route configurations
	// "http-<port>", HTTPS ones "<namespace>/<gateway>/<listener>".
	NameSchemeV2 NameScheme = "V2"
	// NameSchemeV1: listeners and route configurations
	// "<namespace>/<gateway>/<listener>", HTTP listeners sharing a port
	// merged under the first one's name.
	NameSchemeV1 NameScheme = "V1"
)

// EnvoyGateway returns the EnvoyPatchPolicy that makes an Envoy Gateway
// gateway enforce gw's attachments. It lives in the Gateway's namespace,
// targets the Gateway, and needs EnvoyPatchPolicy enabled in Envoy Gateway
// (extensionApis.enableEnvoyPatchPolicy). Its JSON patches, in order:
//
//   - add the cluster floodgate-ratelimit (HTTP/2 to the central
//     service's Service);
//   - on each HTTP and HTTPS listener, insert floodgate's rate-limit
//     filter before the router of every filter chain;
//   - on each route configuration, set route.rate_limits of the routes the
//     policies apply to: first every route with a route action, for the
//     policies that target the Gateway, then the routes Envoy Gateway
//     builds from each targeted HTTPRoute or GRPCRoute rule
//     ("httproute/<namespace>/<name>/rule/<index>/match/<m>/<host>", or
//     "grpcroute/..."), with every policy that applies to them, the
//     Gateway's included (a JSON patch add replaces the list).
//
// Envoy Gateway names a route's xDS routes after its kind in lower case
// (internal/gatewayapi/helpers.go, irRoutePrefix and irRouteName:
// "%s/%s/%s/" of strings.ToLower(route.GetRouteType()), namespace and
// name, then "rule/%d/match/%d"), and a GRPCRoute's type is "GRPCRoute"
// (internal/gatewayapi/contexts.go, GRPCRouteContext.GetRouteType;
// internal/gatewayapi/route.go, processGRPCRouteRule names each match's
// route with irRouteName, as processHTTPRouteRule does): read in
// envoyproxy/gateway at d32f28294245 (August 2026).
func EnvoyGateway(gw *Gateway, svc Service, scheme NameScheme) (*unstructured.Unstructured, error) {
	if err := gw.Validate(); err != nil {
		return nil, err
	}
	if err := svc.Validate(); err != nil {
		return nil, err
	}
	if scheme != NameSchemeV1 && scheme != NameSchemeV2 {
		return nil, fmt.Errorf("unknown Envoy Gateway name scheme %q (V1 or V2)", scheme)
	}
	cluster, err := Cluster(svc)
	if err != nil {
		return nil, err
	}
	if err := validate("cluster", cluster); err != nil {
		return nil, err
	}
	filter, err := HTTPFilter(svc, ClusterName)
	if err != nil {
		return nil, err
	}
	if err := validate("rate-limit filter", filter); err != nil {
		return nil, err
	}
	cv, err := toMap(cluster)
	if err != nil {
		return nil, err
	}
	fv, err := toMap(filter)
	if err != nil {
		return nil, err
	}
	patches := []any{map[string]any{
		keyType: typeCluster, keyName: ClusterName,
		keyOperation: map[string]any{"op": "add", keyValue: cv},
	}}
	all := gw.listenersOf(nil)
	for _, name := range egNames(gw, all, scheme, egListenerName) {
		patches = append(patches, map[string]any{
			keyType: typeListener, keyName: name,
			keyOperation: map[string]any{
				"op":       "add",
				"jsonPath": "..http_filters[?(@.name=='" + RouterFilter + "')]",
				keyValue:   fv,
			},
		})
	}
	routePatches, err := egRoutePatches(gw, scheme)
	if err != nil {
		return nil, err
	}
	patches = append(patches, routePatches...)
	meta := map[string]any{keyName: ObjectName(gw.Name), "namespace": gw.Namespace, "labels": Labels()}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": EnvoyGatewayAPIVersion,
		"kind":       EnvoyGatewayKind,
		"metadata":   meta,
		"spec": map[string]any{
			"targetRef":   map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", keyName: gw.Name},
			keyType:       "JSONPatch",
			"jsonPatches": patches,
		},
	}}, nil
}

// egRoutePatches returns the route configuration patches.
func egRoutePatches(gw *Gateway, scheme NameScheme) ([]any, error) {
	// Policies that target the Gateway, per route configuration.
	gwWide := map[string][]Policy{}
	// Per route configuration and HTTPRoute or GRPCRoute rule, the
	// policies that target the rule's route.
	type ruleKey struct {
		config, kind, namespace, name string
		index                         int
	}
	perRule := map[ruleKey][]Policy{}
	var ruleOrder []ruleKey
	var configs []string
	addConfig := func(c string) {
		if !slices.Contains(configs, c) {
			configs = append(configs, c)
		}
	}
	for _, a := range gw.Attachments {
		var narrow []string
		switch {
		case a.Route != nil:
			narrow = a.Route.Listeners
		case a.Listener != "":
			narrow = []string{a.Listener}
		}
		for _, c := range egNames(gw, gw.listenersOf(narrow), scheme, egRouteConfigName) {
			addConfig(c)
			if a.Route == nil {
				gwWide[c] = append(gwWide[c], a.Policy)
				continue
			}
			for _, r := range a.Route.Rules {
				k := ruleKey{c, strings.ToLower(a.Route.kind()), a.Route.Namespace, a.Route.Name, r.Index}
				if _, ok := perRule[k]; !ok {
					ruleOrder = append(ruleOrder, k)
				}
				perRule[k] = append(perRule[k], a.Policy)
			}
		}
	}
	value := func(ps []Policy) ([]any, error) {
		rls := RateLimits(ps)
		for _, rl := range rls {
			if err := validate("rate_limits entry", rl); err != nil {
				return nil, err
			}
		}
		return toList(rls)
	}
	var out []any
	for _, c := range configs {
		if len(gwWide[c]) == 0 {
			continue
		}
		v, err := value(gwWide[c])
		if err != nil {
			return nil, err
		}
		out = append(out, map[string]any{
			keyType: typeRouteConfig, keyName: c,
			keyOperation: map[string]any{"op": "add", "jsonPath": "..routes[?(@.route)]", "path": "/route/rate_limits", keyValue: v},
		})
	}
	for _, k := range ruleOrder {
		v, err := value(append(slices.Clone(gwWide[k.config]), perRule[k]...))
		if err != nil {
			return nil, err
		}
		prefix := fmt.Sprintf("^%s/%s/%s/rule/%d/", k.kind, k.namespace, k.name, k.index)
		out = append(out, map[string]any{
			keyType: typeRouteConfig, keyName: k.config,
			keyOperation: map[string]any{
				"op": "add", "jsonPath": "..routes[?(@.name =~ '" + regexLiteral(prefix) + "')]",
				"path": "/route/rate_limits", keyValue: v,
			},
		})
	}
	return out, nil
}

// regexLiteral escapes the one regular expression metacharacter that
// Kubernetes names hold, '.', as a character class: the JSONPath string
// literal then needs no backslash.
func regexLiteral(s string) string { return strings.ReplaceAll(s, ".", "[.]") }

// egNames returns the distinct resource names, in listener order, that
// name gives the listeners ls.
func egNames(gw *Gateway, ls []Listener, scheme NameScheme, name func(*Gateway, Listener, NameScheme) string) []string {
	var out []string
	for _, l := range ls {
		if n := name(gw, l, scheme); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// egListenerName is the Envoy listener Envoy Gateway builds for l.
func egListenerName(gw *Gateway, l Listener, scheme NameScheme) string {
	if scheme == NameSchemeV2 {
		return "tcp-" + port(l.Port)
	}
	return egFirstOnPort(gw, l)
}

// egRouteConfigName is the route configuration Envoy Gateway builds for l.
func egRouteConfigName(gw *Gateway, l Listener, scheme NameScheme) string {
	switch {
	case l.Protocol == "HTTPS":
		return gw.Namespace + "/" + gw.Name + "/" + l.Name
	case scheme == NameSchemeV2:
		return "http-" + port(l.Port)
	}
	return egFirstOnPort(gw, l)
}

// egFirstOnPort names, in scheme V1, the merged resource of the HTTP
// listeners on l's port: the first one's.
func egFirstOnPort(gw *Gateway, l Listener) string {
	if l.Protocol == "HTTP" {
		for _, o := range gw.Listeners {
			if o.Protocol == "HTTP" && o.Port == l.Port {
				return gw.Namespace + "/" + gw.Name + "/" + o.Name
			}
		}
	}
	return gw.Namespace + "/" + gw.Name + "/" + l.Name
}
