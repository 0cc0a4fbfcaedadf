package gatewayloop

import (
	"context"
	"net/http"
	"net/netip"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/ratelimitservice"
	"github.com/floodgate-dev/floodgate/controllers/sidecaraccess"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/runner"
	"github.com/floodgate-dev/floodgate/test/envoyemu"
)

var _ = Describe("a RateLimitPolicy that targets a GRPCRoute rule", Ordered, func() {
	const (
		// The namespace and name of a Gateway whose client certificate
		// the manager keeps (the suite's --ratelimit-gateways).
		ns      = "other"
		gateway = "gw"
		store   = "grpc-store"
		limit   = 3
	)

	BeforeAll(func(ctx SpecContext) {
		startManagedStore(ctx, store, 1)

		gw := &gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: gateway, Namespace: ns},
			Spec: gatewayv1.GatewaySpec{GatewayClassName: "eg", Listeners: []gatewayv1.Listener{
				{Name: "h2c", Port: 8080, Protocol: gatewayv1.HTTPProtocolType},
			}},
		}
		Expect(k8sClient.Create(ctx, gw)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, gw))).To(Succeed()) })
		backend := []gatewayv1.GRPCBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
			Name: "orders", Port: ptr.To(gatewayv1.PortNumber(9000)),
		}}}}
		route := &gatewayv1.GRPCRoute{
			ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: ns},
			Spec: gatewayv1.GRPCRouteSpec{
				CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: gateway}}},
				Hostnames:       []gatewayv1.Hostname{"grpc.example.com"},
				Rules: []gatewayv1.GRPCRouteRule{
					{Name: ptr.To(gatewayv1.SectionName("health")), BackendRefs: backend, Matches: []gatewayv1.GRPCRouteMatch{
						{Method: &gatewayv1.GRPCMethodMatch{Service: ptr.To("grpc.health.v1.Health")}},
					}},
					{Name: ptr.To(gatewayv1.SectionName("orders")), BackendRefs: backend, Matches: []gatewayv1.GRPCRouteMatch{
						{Method: &gatewayv1.GRPCMethodMatch{Service: ptr.To("shop.v1.Orders")}},
					}},
				},
			},
		}
		Expect(k8sClient.Create(ctx, route)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, route))).To(Succeed()) })
		route.Status.Parents = []gatewayv1.RouteParentStatus{{
			ParentRef:      gatewayv1.ParentReference{Name: gateway},
			ControllerName: "gateway.envoyproxy.io/gatewayclass-controller",
			Conditions: []metav1.Condition{{Type: string(gatewayv1.RouteConditionAccepted), Status: metav1.ConditionTrue,
				Reason: "Accepted", Message: "accepted", LastTransitionTime: metav1.Now(), ObservedGeneration: route.Generation}},
		}}
		Expect(k8sClient.Status().Update(ctx, route)).To(Succeed())

		// One method of the service, by its path.
		Expect(k8sClient.Create(ctx, &v1alpha1.RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "orders-limits", Namespace: ns},
			Spec: v1alpha1.RateLimitPolicySpec{
				TargetRef: &v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindGRPCRoute, Name: "orders", SectionName: "orders"},
				StoreRef:  &v1alpha1.StoreReference{Name: store},
				Rules: []v1alpha1.Rule{{
					Name:        "create",
					Match:       &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchExact, Value: "/shop.v1.Orders/Create"}},
					Key:         []v1alpha1.KeyPart{{Header: "X-Api-Key"}},
					Limit:       v1alpha1.Limit{Requests: limit, Per: metav1.Duration{Duration: time.Hour}},
					FailureMode: v1alpha1.FailureModeClosed,
				}},
			},
		})).To(Succeed())
		DeferCleanup(deleteGatewayPolicy, ns, "orders-limits")
	})

	getPolicy := func(ctx context.Context) *v1alpha1.RateLimitPolicy {
		var p v1alpha1.RateLimitPolicy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orders-limits"}, &p)).To(Succeed())
		return &p
	}

	It("is Accepted, compiled for the Gateway that accepted the route, and reports the rule", func(ctx SpecContext) {
		Eventually(func(g Gomega) {
			var cm corev1.ConfigMap
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: config.RateLimitServiceConfigMapName}, &cm)).To(Succeed())
			doc, err := config.Parse([]byte(cm.Data[config.DataKey]))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(doc.Policies).To(HaveLen(1))
			g.Expect(doc.Policies[0].Name).To(Equal("orders-limits"))
			g.Expect(doc.Policies[0].Gateways).To(Equal([]string{ns + "/" + gateway}))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			p := getPolicy(ctx)
			g.Expect(condition(p, v1alpha1.ConditionAccepted).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(condition(p, v1alpha1.ConditionResolvedRefs).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(p.Status.Target).To(Equal(&v1alpha1.TargetStatus{
				Ref: "GRPCRoute/orders/orders", Found: true, Gateways: []string{ns + "/" + gateway}, Hostnames: []string{"grpc.example.com"},
				GatewayConfig: []string{"other.gw.istio.yaml", "other.gw.envoy-gateway.yaml"},
			}))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	})

	It("is Programmed, and the central service refuses the method exactly past its limit and leaves the others alone", func(ctx SpecContext) {
		// The replicas mount the credentials mirrored for this policy's
		// store.
		Eventually(func(g Gomega) {
			var auth corev1.Secret
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: config.RateLimitServiceStoreAuthSecret}, &auth)).To(Succeed())
			g.Expect(auth.Annotations).To(HaveKeyWithValue(sidecaraccess.StoreAnnotation, store))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		replicas := []*runner.Runner{startReplica(ctx, "floodgate-ratelimit-grpc-a"), startReplica(ctx, "floodgate-ratelimit-grpc-b")}
		Eventually(func(g Gomega) {
			p := getPolicy(ctx)
			prog := condition(p, v1alpha1.ConditionProgrammed)
			g.Expect(prog.Status).To(Equal(metav1.ConditionTrue), prog.Message)
			g.Expect(prog.ObservedGeneration).To(Equal(p.Generation))
			g.Expect(p.Status.Enforcing).To(Equal("2/2"))
		}).WithContext(ctx).WithTimeout(60 * time.Second).Should(Succeed())

		// What the manager publishes for the Gateway: Istio's route of
		// the named rule (by its name, on the route's host) and Envoy
		// Gateway's routes of the rule's index, named for a GRPCRoute.
		var published corev1.ConfigMap
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: ratelimitservice.GatewayConfigMapName}, &published)).To(Succeed())
			g.Expect(published.Data).To(HaveKey("other.gw.istio.yaml"))
			g.Expect(published.Data).To(HaveKey("other.gw.envoy-gateway.yaml"))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(published.Data["other.gw.istio.yaml"]).To(ContainSubstring("name: orders\n"))
		Expect(published.Data["other.gw.istio.yaml"]).To(ContainSubstring("domainName: grpc.example.com"))
		Expect(published.Data["other.gw.envoy-gateway.yaml"]).To(ContainSubstring("'^grpcroute/other/orders/rule/1/'"))
		Expect(published.Data["other.gw.envoy-gateway.yaml"]).To(ContainSubstring("rate_limited_as_resource_exhausted: true"))
		rls := routeRateLimits(published.Data["other.gw.istio.yaml"])
		Expect(rls).To(HaveLen(1))

		// The Gateway other/gw asks, alternately to both replicas, with
		// its client certificate, about gRPC calls as Envoy describes
		// them with the published route actions.
		creds := gatewayCreds(ctx, ns, gateway)
		clients := make([]rlsv3.RateLimitServiceClient, len(replicas))
		for i, r := range replicas {
			conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(creds))
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(conn.Close)
			clients[i] = rlsv3.NewRateLimitServiceClient(conn)
		}
		n := 0
		call := func(method, key string) string {
			req, err := envoyemu.Call(config.GatewayDomain, []*routev3.RateLimit{rls[0]}, gatewayconfig.Stage, &envoyemu.Request{
				Method: http.MethodPost, Target: method, Authority: "grpc.example.com", Scheme: "http",
				Headers: http.Header{"Content-Type": []string{"application/grpc"}, "Te": []string{"trailers"}, "X-Api-Key": []string{key}},
				Client:  netip.MustParseAddr("203.0.113.7"),
			})
			Expect(err).NotTo(HaveOccurred())
			resp, err := clients[n%len(clients)].ShouldRateLimit(ctx, req)
			n++
			Expect(err).NotTo(HaveOccurred())
			return resp.GetOverallCode().String()
		}
		var got []string
		for range limit + 2 {
			got = append(got, call("/shop.v1.Orders/Create", "key-1"))
		}
		Expect(got).To(Equal([]string{"OK", "OK", "OK", "OVER_LIMIT", "OVER_LIMIT"}),
			"3 calls of Create per hour for key-1, counted over both replicas")
		for range limit + 2 {
			Expect(call("/shop.v1.Orders/Get", "key-1")).To(Equal("OK"), "another method of the service is not limited")
		}
		Expect(call("/shop.v1.Orders/Create", "key-2")).To(Equal("OK"), "another key has its own count")
		Expect(call("/shop.v1.Orders/Create", "key-1")).To(Equal("OVER_LIMIT"), "key-1 stays refused")
	})
})
