package gatewayconfig

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Istio's EnvoyFilter.
const (
	IstioAPIVersion = "networking.istio.io/v1alpha3"
	IstioKind       = "EnvoyFilter"
)

// Istio returns the EnvoyFilter that makes an Istio gateway (Istio 1.22 or
// later, which reads EnvoyFilter targetRefs) enforce gw's attachments. It
// lives in the Gateway's namespace and targets the Gateway. Its patches:
//
//   - HTTP_FILTER: floodgate's rate-limit filter before the router, asking
//     Istio's cluster of the central service's Service port, which Istio
//     speaks HTTP/2 to because the port's appProtocol is grpc; or, when
//     the service authenticates its callers (svc.TLS), the cluster
//     floodgate-ratelimit that the CLUSTER patch adds, which speaks TLS
//     with the gateway's client certificate (Istio's own cluster of an
//     unmeshed Service carries its auto-mTLS transport socket matches,
//     which would win over a merged transport socket);
//   - HTTP_ROUTE, MERGE: each policy's rate_limits entry on the routes
//     Istio builds from the targeted HTTPRoute or GRPCRoute rules, which
//     it names "<namespace>.<name>.<rule index>", or the rule's name when
//     it has one (then on the route's hostnames only, as names need not be
//     unique across routes); a policy that targets the Gateway goes on
//     every route of its listeners. Only routes with a route action are
//     patched, never redirects or direct responses. Istio merges repeated
//     fields by appending, so policies on one route add up.
//
// Istio names the routes of a GRPCRoute rule exactly as those of an
// HTTPRoute rule (pilot/pkg/config/kube/gateway/conversion.go:
// convertGRPCRoute and convertHTTPRoute both set the rule's name, or
// obj.Namespace + "." + obj.Name + "." + strconv.Itoa(pos), where
// route_collections.go passes the rule's index as pos; pilot/pkg/
// networking/core/route/route.go names the Envoy route after it): read in
// istio/istio at 86c9f01fd735 (August 2026). So an HTTPRoute and a
// GRPCRoute of the same namespace and name, on one Gateway, share route
// names, and a policy on a rule of one also applies to the rule of the
// same index (or name) of the other.
func Istio(gw *Gateway, svc Service) (*unstructured.Unstructured, error) {
	if err := gw.Validate(); err != nil {
		return nil, err
	}
	if err := svc.Validate(); err != nil {
		return nil, err
	}
	cluster := IstioCluster(svc)
	if svc.TLS {
		cluster = ClusterName
	}
	filter, err := HTTPFilter(svc, cluster)
	if err != nil {
		return nil, err
	}
	if err := validate("rate-limit filter", filter); err != nil {
		return nil, err
	}
	fv, err := toMap(filter)
	if err != nil {
		return nil, err
	}
	patches := []any{map[string]any{
		"applyTo": "HTTP_FILTER",
		"match": map[string]any{
			"context": "GATEWAY",
			"listener": map[string]any{"filterChain": map[string]any{"filter": map[string]any{
				keyName: HCMFilter, "subFilter": map[string]any{keyName: RouterFilter},
			}}},
		},
		"patch": map[string]any{keyOperation: "INSERT_BEFORE", keyValue: fv},
	}}
	if svc.TLS {
		c, err := Cluster(svc)
		if err != nil {
			return nil, err
		}
		if err := validate("cluster", c); err != nil {
			return nil, err
		}
		cv, err := toMap(c)
		if err != nil {
			return nil, err
		}
		patches = append([]any{map[string]any{
			"applyTo": "CLUSTER",
			"match":   map[string]any{"context": "GATEWAY"},
			"patch":   map[string]any{keyOperation: "ADD", keyValue: cv},
		}}, patches...)
	}
	atts := slices.Clone(gw.Attachments)
	slices.SortStableFunc(atts, func(a, b Attachment) int { return comparePolicies(a.Policy, b.Policy) })
	for _, a := range atts {
		rl := RateLimit(a.Policy)
		if err := validate(fmt.Sprintf("rate_limits entry of policy %s/%s", a.Policy.Namespace, a.Policy.Name), rl); err != nil {
			return nil, err
		}
		value, err := toMap(rl)
		if err != nil {
			return nil, err
		}
		merge := map[string]any{keyOperation: "MERGE", keyValue: map[string]any{"route": map[string]any{"rate_limits": []any{value}}}}
		for _, m := range istioRouteMatches(gw, a) {
			patches = append(patches, map[string]any{"applyTo": "HTTP_ROUTE", "match": m, "patch": merge})
		}
	}
	meta := map[string]any{keyName: ObjectName(gw.Name), "namespace": gw.Namespace, "labels": Labels()}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": IstioAPIVersion,
		"kind":       IstioKind,
		"metadata":   meta,
		"spec": map[string]any{
			"targetRefs":    []any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", keyName: gw.Name}},
			"configPatches": patches,
		},
	}}, nil
}

// istioRouteMatches returns the HTTP_ROUTE matches of attachment a.
func istioRouteMatches(gw *Gateway, a Attachment) []any {
	route := func(name string) map[string]any {
		r := map[string]any{"action": "ROUTE"}
		if name != "" {
			r["name"] = name
		}
		return r
	}
	match := func(listener *Listener, vhost map[string]any) map[string]any {
		rc := map[string]any{"vhost": vhost}
		if listener != nil {
			rc["portNumber"] = listener.Port
		}
		return map[string]any{"context": "GATEWAY", "routeConfiguration": rc}
	}
	// The listeners: one match per listener port when the attachment is
	// narrowed to some, else one for all.
	var narrow []string
	switch {
	case a.Route != nil:
		narrow = a.Route.Listeners
	case a.Listener != "":
		narrow = []string{a.Listener}
	}
	var ls []*Listener
	if len(narrow) > 0 {
		seen := map[int32]bool{}
		for _, l := range gw.listenersOf(narrow) {
			if !seen[l.Port] {
				seen[l.Port] = true
				ls = append(ls, &l)
			}
		}
	} else {
		ls = []*Listener{nil}
	}
	var out []any
	for _, l := range ls {
		if a.Route == nil {
			out = append(out, match(l, map[string]any{"route": route("")}))
			continue
		}
		for _, r := range a.Route.Rules {
			if r.Name == "" {
				name := fmt.Sprintf("%s.%s.%d", a.Route.Namespace, a.Route.Name, r.Index)
				out = append(out, match(l, map[string]any{"route": route(name)}))
				continue
			}
			hosts := a.Route.Hostnames
			if len(hosts) == 0 {
				hosts = []string{"*"}
			}
			for _, h := range hosts {
				out = append(out, match(l, map[string]any{"domainName": h, "route": route(r.Name)}))
			}
		}
	}
	return out
}
