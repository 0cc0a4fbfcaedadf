package gatewayconfig

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Gateway is one Gateway API Gateway and the policies enforced at it.
type Gateway struct {
	// Namespace and Name identify the Gateway.
	Namespace, Name string
	// Listeners are its listeners, in spec order.
	Listeners []Listener
	// Attachments are the policies enforced at it and where.
	Attachments []Attachment
}

// Listener is one listener of a Gateway.
type Listener struct {
	// Name is the listener's name.
	Name string
	// Port is its port.
	Port int32
	// Protocol is HTTP, HTTPS, TLS, TCP or UDP; only HTTP and HTTPS
	// listeners route HTTP requests.
	Protocol string
}

func (l Listener) http() bool { return l.Protocol == "HTTP" || l.Protocol == "HTTPS" }

// Attachment is one policy enforced at a Gateway: on the routes Envoy
// builds from the rules of one HTTPRoute or GRPCRoute, or on every route
// of the Gateway.
type Attachment struct {
	// Policy is the policy.
	Policy Policy
	// Route, when set, is the HTTPRoute or GRPCRoute whose rules the
	// policy applies to.
	Route *Route
	// Listener, for a policy that targets the Gateway itself, names the
	// one listener it applies to; empty means every listener.
	Listener string
}

// The kinds of Route, as the Gateway API names them.
const (
	KindHTTPRoute = "HTTPRoute"
	KindGRPCRoute = "GRPCRoute"
)

// Route is an HTTPRoute or a GRPCRoute attached to the Gateway. Envoy
// builds the routes of a GRPCRoute rule as it builds those of an
// HTTPRoute rule (a gRPC call is an HTTP/2 POST to
// /<package>.<Service>/<Method>), so both are patched alike; only Envoy
// Gateway's route names tell the kinds apart.
type Route struct {
	// Kind is KindHTTPRoute or KindGRPCRoute; empty means KindHTTPRoute.
	Kind string
	// Namespace and Name identify the route.
	Namespace, Name string
	// Hostnames are its hostnames; empty means any.
	Hostnames []string
	// Rules are the rules the policy applies to.
	Rules []RouteRule
	// Listeners are the Gateway listeners the route attaches to (its
	// parentRef's sectionName); empty means every listener.
	Listeners []string
}

// kind returns r's kind, KindHTTPRoute when unset.
func (r *Route) kind() string {
	if r.Kind == "" {
		return KindHTTPRoute
	}
	return r.Kind
}

// RouteRule is one rule of an HTTPRoute or a GRPCRoute.
type RouteRule struct {
	// Index is the rule's position in the route's rules.
	Index int
	// Name is the rule's name, or empty.
	Name string
}

// Validate reports what the generators cannot work with.
func (g *Gateway) Validate() error {
	if g.Namespace == "" || g.Name == "" {
		return fmt.Errorf("a gateway needs a namespace and a name, got %q and %q", g.Namespace, g.Name)
	}
	names := map[string]bool{}
	for _, l := range g.Listeners {
		if names[l.Name] {
			return fmt.Errorf("gateway %s/%s: duplicate listener %q", g.Namespace, g.Name, l.Name)
		}
		names[l.Name] = true
	}
	for _, a := range g.Attachments {
		if a.Listener != "" && !names[a.Listener] {
			return fmt.Errorf("gateway %s/%s has no listener %q (policy %s/%s)", g.Namespace, g.Name, a.Listener, a.Policy.Namespace, a.Policy.Name)
		}
		if a.Route == nil {
			continue
		}
		if k := a.Route.kind(); k != KindHTTPRoute && k != KindGRPCRoute {
			return fmt.Errorf("route %s/%s of policy %s/%s: kind %q is neither %s nor %s",
				a.Route.Namespace, a.Route.Name, a.Policy.Namespace, a.Policy.Name, k, KindHTTPRoute, KindGRPCRoute)
		}
		for _, l := range a.Route.Listeners {
			if !names[l] {
				return fmt.Errorf("gateway %s/%s has no listener %q (%s %s/%s)", g.Namespace, g.Name, l, a.Route.kind(), a.Route.Namespace, a.Route.Name)
			}
		}
	}
	return nil
}

// listenersOf returns the HTTP listeners of g that names selects (all when
// names is empty), in spec order.
func (g *Gateway) listenersOf(names []string) []Listener {
	var out []Listener
	for _, l := range g.Listeners {
		if l.http() && (len(names) == 0 || slices.Contains(names, l.Name)) {
			out = append(out, l)
		}
	}
	return out
}

// ObjectNamePrefix begins the name of every generated object.
const ObjectNamePrefix = "floodgate-ratelimit-"

// ObjectName is the name of the object generated for gateway name: the
// gateway's name behind a fixed prefix, cut to the 253 characters of a
// name.
func ObjectName(gateway string) string {
	n := ObjectNamePrefix + gateway
	if len(n) > 253 {
		n = n[:253]
	}
	return n
}

// Labels are the labels of every object the generators write.
func Labels() map[string]any {
	return map[string]any{"app.kubernetes.io/managed-by": "floodgate-manager", "app.kubernetes.io/part-of": "floodgate"}
}

// toMap renders m as JSON with Envoy's (proto) field names, decoded into
// generic values.
func toMap(m proto.Message) (map[string]any, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal %T: %w", m, err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("decode %T: %w", m, err)
	}
	return out, nil
}

// toList renders each of ms as toMap does.
func toList[M proto.Message](ms []M) ([]any, error) {
	out := make([]any, 0, len(ms))
	for _, m := range ms {
		v, err := toMap(m)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func port(p int32) string { return strconv.Itoa(int(p)) }
