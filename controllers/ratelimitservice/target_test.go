package ratelimitservice

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

func TestRouteTarget(t *testing.T) {
	t.Parallel()
	route := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"},
		Spec: gatewayv1.HTTPRouteSpec{
			Hostnames: []gatewayv1.Hostname{"b.example.com", "a.example.com"},
			Rules:     []gatewayv1.HTTPRouteRule{{}, {Name: ptr.To(gatewayv1.SectionName("login"))}},
		},
		Status: gatewayv1.HTTPRouteStatus{RouteStatus: gatewayv1.RouteStatus{Parents: []gatewayv1.RouteParentStatus{
			{ParentRef: gatewayv1.ParentReference{Name: "public"}, Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue}}},
			{ParentRef: gatewayv1.ParentReference{Name: "edge", Namespace: ptr.To(gatewayv1.Namespace("infra"))}, Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue}}},
			{ParentRef: gatewayv1.ParentReference{Name: "refused"}, Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse}}},
			{ParentRef: gatewayv1.ParentReference{Name: "svc", Kind: ptr.To(gatewayv1.Kind("Service"))}, Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue}}},
		}}},
	}
	ref := v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindHTTPRoute, Name: "api"}
	for _, tc := range []struct {
		name    string
		section string
		route   *gatewayv1.HTTPRoute
		want    v1alpha1.TargetStatus
	}{
		{"whole route", "", route, v1alpha1.TargetStatus{Ref: "HTTPRoute/api", Found: true,
			Gateways: []string{"infra/edge", "shop/public"}, Hostnames: []string{"a.example.com", "b.example.com"}}},
		{"named rule", "login", route, v1alpha1.TargetStatus{Ref: "HTTPRoute/api/login", Found: true,
			Gateways: []string{"infra/edge", "shop/public"}, Hostnames: []string{"a.example.com", "b.example.com"}}},
		{"missing rule", "nope", route, v1alpha1.TargetStatus{Ref: "HTTPRoute/api/nope",
			Gateways: []string{"infra/edge", "shop/public"}, Hostnames: []string{"a.example.com", "b.example.com"}}},
		{"missing route", "", nil, v1alpha1.TargetStatus{Ref: "HTTPRoute/api"}},
	} {
		r := ref
		r.SectionName = tc.section
		if diff := cmp.Diff(tc.want, RouteTarget(r, tc.route)); diff != "" {
			t.Errorf("%s: RouteTarget (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestGatewayTarget(t *testing.T) {
	t.Parallel()
	gw := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: "infra", Name: "public"},
		Spec: gatewayv1.GatewaySpec{Listeners: []gatewayv1.Listener{
			{Name: "http"},
			{Name: "https", Hostname: ptr.To(gatewayv1.Hostname("*.example.com"))},
		}},
	}
	ref := v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindGateway, Name: "public"}
	for _, tc := range []struct {
		name    string
		section string
		gw      *gatewayv1.Gateway
		want    v1alpha1.TargetStatus
	}{
		{"every listener, one of them any host", "", gw, v1alpha1.TargetStatus{Ref: "Gateway/public", Found: true, Gateways: []string{"infra/public"}}},
		{"one listener", "https", gw, v1alpha1.TargetStatus{Ref: "Gateway/public/https", Found: true,
			Gateways: []string{"infra/public"}, Hostnames: []string{"*.example.com"}}},
		{"missing listener", "grpc", gw, v1alpha1.TargetStatus{Ref: "Gateway/public/grpc"}},
		{"missing gateway", "", nil, v1alpha1.TargetStatus{Ref: "Gateway/public"}},
	} {
		r := ref
		r.SectionName = tc.section
		if diff := cmp.Diff(tc.want, GatewayTarget(r, tc.gw)); diff != "" {
			t.Errorf("%s: GatewayTarget (-want +got):\n%s", tc.name, diff)
		}
	}
}
