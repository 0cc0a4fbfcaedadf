package ratelimitservice

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

// maxTargetGateways and maxTargetHostnames are the API's bounds on
// TargetStatus.Gateways and TargetStatus.Hostnames.
const (
	maxTargetGateways  = 32
	maxTargetHostnames = 64
)

// RouteTarget is the status of a targetRef that names HTTPRoute route,
// or a missing one when route is nil. The route's gateways are its
// parents that have accepted it (status.parents with Accepted True), as
// namespace/name; its hostnames are spec.hostnames. With a sectionName,
// the route must have a rule of that name to be Found.
func RouteTarget(ref v1alpha1.TargetReference, route *gatewayv1.HTTPRoute) v1alpha1.TargetStatus {
	if route == nil {
		return v1alpha1.TargetStatus{Ref: ref.String()}
	}
	return httpRoute(route).target(ref)
}

// GRPCRouteTarget is the status of a targetRef that names GRPCRoute
// route, or a missing one when route is nil, read as RouteTarget reads an
// HTTPRoute.
func GRPCRouteTarget(ref v1alpha1.TargetReference, route *gatewayv1.GRPCRoute) v1alpha1.TargetStatus {
	if route == nil {
		return v1alpha1.TargetStatus{Ref: ref.String()}
	}
	return grpcRoute(route).target(ref)
}

// routeView is what a policy's target and its attachments read of an
// HTTPRoute or a GRPCRoute, which the Gateway API shapes alike.
type routeView struct {
	kind, namespace, name string
	hostnames             []gatewayv1.Hostname
	// ruleNames are the rules' names, in spec order; "" for a rule
	// without one.
	ruleNames  []string
	parentRefs []gatewayv1.ParentReference
	parents    []gatewayv1.RouteParentStatus
}

func httpRoute(r *gatewayv1.HTTPRoute) *routeView {
	v := &routeView{kind: v1alpha1.KindHTTPRoute, namespace: r.Namespace, name: r.Name, hostnames: r.Spec.Hostnames,
		parentRefs: r.Spec.ParentRefs, parents: r.Status.Parents}
	for _, rule := range r.Spec.Rules {
		v.ruleNames = append(v.ruleNames, sectionName(rule.Name))
	}
	return v
}

func grpcRoute(r *gatewayv1.GRPCRoute) *routeView {
	v := &routeView{kind: v1alpha1.KindGRPCRoute, namespace: r.Namespace, name: r.Name, hostnames: r.Spec.Hostnames,
		parentRefs: r.Spec.ParentRefs, parents: r.Status.Parents}
	for _, rule := range r.Spec.Rules {
		v.ruleNames = append(v.ruleNames, sectionName(rule.Name))
	}
	return v
}

func sectionName(n *gatewayv1.SectionName) string {
	if n == nil {
		return ""
	}
	return string(*n)
}

// target is the status of ref, which names r.
func (r *routeView) target(ref v1alpha1.TargetReference) v1alpha1.TargetStatus {
	st := v1alpha1.TargetStatus{Ref: ref.String()}
	st.Found = ref.SectionName == "" || slices.Contains(r.ruleNames, ref.SectionName)
	st.Gateways = r.acceptedBy()
	for _, h := range r.hostnames {
		st.Hostnames = append(st.Hostnames, string(h))
	}
	return bounded(st)
}

// acceptedBy returns the Gateways, as namespace/name, among r's parents
// whose status says they accepted it.
func (r *routeView) acceptedBy() []string {
	var out []string
	for _, p := range r.parents {
		if p.ParentRef.Group != nil && string(*p.ParentRef.Group) != gatewayv1.GroupName {
			continue
		}
		if p.ParentRef.Kind != nil && string(*p.ParentRef.Kind) != v1alpha1.KindGateway {
			continue
		}
		if !meta.IsStatusConditionTrue(p.Conditions, string(gatewayv1.RouteConditionAccepted)) {
			continue
		}
		ns := r.namespace
		if p.ParentRef.Namespace != nil {
			ns = string(*p.ParentRef.Namespace)
		}
		out = append(out, ns+"/"+string(p.ParentRef.Name))
	}
	return out
}

// GatewayTarget is the status of a targetRef that names Gateway gw, or a
// missing one when gw is nil. Its hostnames are those of its listeners (or
// of the one listener sectionName names); a listener without a hostname
// takes any host, so then the list is empty.
func GatewayTarget(ref v1alpha1.TargetReference, gw *gatewayv1.Gateway) v1alpha1.TargetStatus {
	st := v1alpha1.TargetStatus{Ref: ref.String()}
	if gw == nil {
		return st
	}
	anyHost := false
	for _, l := range gw.Spec.Listeners {
		if ref.SectionName != "" && string(l.Name) != ref.SectionName {
			continue
		}
		st.Found = true
		if l.Hostname == nil {
			anyHost = true
			continue
		}
		st.Hostnames = append(st.Hostnames, string(*l.Hostname))
	}
	if ref.SectionName == "" {
		st.Found = true
	}
	if !st.Found {
		return st
	}
	st.Gateways = []string{gw.Namespace + "/" + gw.Name}
	if anyHost {
		st.Hostnames = nil
	}
	return bounded(st)
}

// bounded sorts and dedups the lists and cuts them to the API's bounds.
func bounded(st v1alpha1.TargetStatus) v1alpha1.TargetStatus {
	for _, l := range []*[]string{&st.Gateways, &st.Hostnames} {
		slices.Sort(*l)
		*l = slices.Compact(*l)
	}
	if len(st.Gateways) > maxTargetGateways {
		st.Gateways = st.Gateways[:maxTargetGateways]
	}
	if len(st.Hostnames) > maxTargetHostnames {
		st.Hostnames = st.Hostnames[:maxTargetHostnames]
	}
	if len(st.Hostnames) == 0 {
		st.Hostnames = nil
	}
	if len(st.Gateways) == 0 {
		st.Gateways = nil
	}
	return st
}
