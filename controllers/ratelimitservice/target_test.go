package ratelimitservice

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
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

// grpcFixture is GRPCRoute shop/orders: two rules, the second named
// "create", attached to the https listener of Gateway shop/public (which
// accepted it) and to Gateway infra/edge (which did not).
func grpcFixture() *gatewayv1.GRPCRoute {
	return &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{
				{Name: "public", SectionName: ptr.To(gatewayv1.SectionName("https"))},
				{Name: "edge", Namespace: ptr.To(gatewayv1.Namespace("infra"))},
			}},
			Hostnames: []gatewayv1.Hostname{"grpc.example.com"},
			Rules:     []gatewayv1.GRPCRouteRule{{}, {Name: ptr.To(gatewayv1.SectionName("create"))}},
		},
		Status: gatewayv1.GRPCRouteStatus{RouteStatus: gatewayv1.RouteStatus{Parents: []gatewayv1.RouteParentStatus{
			{ParentRef: gatewayv1.ParentReference{Name: "public", SectionName: ptr.To(gatewayv1.SectionName("https"))},
				Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue}}},
			{ParentRef: gatewayv1.ParentReference{Name: "edge", Namespace: ptr.To(gatewayv1.Namespace("infra"))},
				Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse}}},
		}}},
	}
}

func TestGRPCRouteTarget(t *testing.T) {
	t.Parallel()
	route := grpcFixture()
	ref := v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindGRPCRoute, Name: "orders"}
	for _, tc := range []struct {
		name    string
		section string
		route   *gatewayv1.GRPCRoute
		want    v1alpha1.TargetStatus
	}{
		{"whole route", "", route, v1alpha1.TargetStatus{Ref: "GRPCRoute/orders", Found: true,
			Gateways: []string{"shop/public"}, Hostnames: []string{"grpc.example.com"}}},
		{"named rule", "create", route, v1alpha1.TargetStatus{Ref: "GRPCRoute/orders/create", Found: true,
			Gateways: []string{"shop/public"}, Hostnames: []string{"grpc.example.com"}}},
		{"missing rule", "delete", route, v1alpha1.TargetStatus{Ref: "GRPCRoute/orders/delete",
			Gateways: []string{"shop/public"}, Hostnames: []string{"grpc.example.com"}}},
		{"missing route", "", nil, v1alpha1.TargetStatus{Ref: "GRPCRoute/orders"}},
	} {
		r := ref
		r.SectionName = tc.section
		if diff := cmp.Diff(tc.want, GRPCRouteTarget(r, tc.route)); diff != "" {
			t.Errorf("%s: GRPCRouteTarget (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestGRPCRouteAttachments: a policy on a GRPCRoute rule is attached to
// the Gateways that accepted the route, on the listeners its parentRef
// names, to the rule sectionName names, as a GRPCRoute.
func TestGRPCRouteAttachments(t *testing.T) {
	t.Parallel()
	pol := gatewayconfig.Policy{Namespace: "shop", Name: "orders-limits"}
	ref := v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindGRPCRoute, Name: "orders", SectionName: "create"}
	got := routeAttachments(ref, pol, grpcRoute(grpcFixture()))
	want := []attachment{{
		gateway: types.NamespacedName{Namespace: "shop", Name: "public"},
		Attachment: gatewayconfig.Attachment{Policy: pol, Route: &gatewayconfig.Route{
			Kind: gatewayconfig.KindGRPCRoute, Namespace: "shop", Name: "orders", Hostnames: []string{"grpc.example.com"},
			Rules: []gatewayconfig.RouteRule{{Index: 1, Name: "create"}}, Listeners: []string{"https"},
		}},
	}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(attachment{})); diff != "" {
		t.Errorf("routeAttachments (-want +got):\n%s", diff)
	}
	ref.SectionName = "delete"
	if got := routeAttachments(ref, pol, grpcRoute(grpcFixture())); got != nil {
		t.Errorf("routeAttachments of a missing rule = %v, want none", got)
	}
}

// TestGRPCRoutesNotServed: on a cluster that serves HTTPRoutes and
// Gateways but not GRPCRoutes, the manager still starts, and a policy
// that targets a GRPCRoute reports it missing instead of failing its
// reconcile.
func TestGRPCRoutesNotServed(t *testing.T) {
	t.Parallel()
	gv := schema.GroupVersion{Group: gatewayv1.GroupName, Version: gatewayv1.GroupVersion.Version}
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{gv})
	for _, kind := range []string{v1alpha1.KindHTTPRoute, v1alpha1.KindGateway} {
		m.Add(gv.WithKind(kind), meta.RESTScopeNamespace)
	}
	if ok, err := servesGatewayAPI(m, v1alpha1.KindHTTPRoute, v1alpha1.KindGateway); !ok || err != nil {
		t.Errorf("servesGatewayAPI(HTTPRoute, Gateway) = %v, %v, want true", ok, err)
	}
	if ok, err := servesGatewayAPI(m, v1alpha1.KindGRPCRoute); ok || err != nil {
		t.Errorf("servesGatewayAPI(GRPCRoute) = %v, %v, want false and no error", ok, err)
	}

	scheme := runtime.NewScheme()
	if err := gatewayv1.Install(scheme); err != nil {
		t.Fatal(err)
	}
	// The API server's answer for a kind it does not serve, as the
	// manager's client gives it.
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(scheme).Build(), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*gatewayv1.GRPCRoute); ok {
				return &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: gatewayv1.GroupName, Kind: v1alpha1.KindGRPCRoute}}
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	r := &Reconciler{Client: c, GatewayAPI: true}
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders-limits"},
		Spec: v1alpha1.RateLimitPolicySpec{TargetRef: &v1alpha1.TargetReference{
			Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindGRPCRoute, Name: "orders"}},
	}
	obj, err := r.observeTarget(t.Context(), p)
	if err != nil {
		t.Fatalf("observeTarget: %v, want the target reported missing", err)
	}
	st, atts := r.target(p, obj, gatewayconfig.Policy{Namespace: "shop", Name: "orders-limits"})
	if diff := cmp.Diff(v1alpha1.TargetStatus{Ref: "GRPCRoute/orders"}, st); diff != "" || atts != nil {
		t.Errorf("target = %v, %v, want missing and no attachments (-want +got):\n%s", st, atts, diff)
	}
}

// TestTargetChanged: a route's update passes when its spec or the
// Gateways that accepted it change, for GRPCRoutes as for HTTPRoutes.
func TestTargetChanged(t *testing.T) {
	t.Parallel()
	pred := targetChanged()
	old := grpcFixture()
	statusOnly := old.DeepCopy()
	statusOnly.Status.Parents[0].Conditions[0].Message = "reworded"
	if pred.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: statusOnly}) {
		t.Error("an update that changes no accepting Gateway passed")
	}
	accepted := old.DeepCopy()
	accepted.Status.Parents[1].Conditions[0].Status = metav1.ConditionTrue
	if !pred.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: accepted}) {
		t.Error("a GRPCRoute newly accepted by a Gateway did not pass")
	}
	spec := old.DeepCopy()
	spec.Generation++
	if !pred.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: spec}) {
		t.Error("a GRPCRoute's spec change did not pass")
	}
}
