package gatewayloop

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/ratelimitservice"
	"github.com/floodgate-dev/floodgate/controllers/rlsidentity"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/kubesource"
	"github.com/floodgate-dev/floodgate/sidecar/runner"
	"github.com/floodgate-dev/floodgate/test/envoyemu"
)

// startReplica runs one replica of the central rate-limit service as the
// chart's floodgate-ratelimit Deployment runs it: floodgate-sidecar in
// Kubernetes mode watching floodgate-ratelimit-policies, with Envoy's
// rate-limit API on --grpc-listen; listen addresses on loopback. It first
// creates the replica's Pod object, Running and Ready, as a kubelet would
// report it, so that its policy-loaded condition has a pod to go on.
func startReplica(ctx context.Context, name string) *runner.Runner {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: serviceNamespace,
			Labels: map[string]string{config.RateLimitServicePodLabel: "true"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ratelimit", Image: "floodgate-sidecar:test"}}},
	}
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()},
	}}
	Expect(k8sClient.Status().Update(ctx, pod)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pod))).To(Succeed()) })

	// The chart mounts the credentials the manager mirrors for the
	// service: the store's sidecar ACL user, as injected sidecars get.
	var auth corev1.Secret
	Eventually(func() error {
		return k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: config.RateLimitServiceStoreAuthSecret}, &auth)
	}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	dir := GinkgoT().TempDir()
	env := map[string]string{}
	for key, variable := range map[string]string{config.StoreAuthKey: config.EnvRedisPasswordFile, config.StoreAuthUserKey: config.EnvRedisUsernameFile} {
		file := filepath.Join(dir, key)
		Expect(os.WriteFile(file, auth.Data[key], 0o600)).To(Succeed())
		env[variable] = file
	}
	// And the serving certificate the manager keeps, with the bundle of
	// CAs whose gateways it serves.
	var serving corev1.Secret
	Eventually(func() error {
		return k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: rlsidentity.ServingSecretName}, &serving)
	}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	tlsDir := filepath.Join(dir, "grpc-tls")
	Expect(os.Mkdir(tlsDir, 0o700)).To(Succeed())
	for _, key := range []string{rlsidentity.KeyTLSCert, rlsidentity.KeyTLSKey, rlsidentity.KeyCACert} {
		Expect(os.WriteFile(filepath.Join(tlsDir, key), serving.Data[key], 0o600)).To(Succeed())
	}

	var rc runner.Config
	fs := flag.NewFlagSet("floodgate-sidecar", flag.ContinueOnError)
	Expect(rc.Parse(fs, []string{
		"--kubernetes", "--namespace", serviceNamespace, "--pod-name", name,
		"--configmap-name", config.RateLimitServiceConfigMapName,
		"--pod-labels", config.RateLimitServicePodLabel + "=true",
		"--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0", "--grpc-listen=127.0.0.1:0", "--drain-timeout=1s",
		"--grpc-tls-cert-file=" + filepath.Join(tlsDir, rlsidentity.KeyTLSCert), "--grpc-tls-key-file=" + filepath.Join(tlsDir, rlsidentity.KeyTLSKey),
		"--grpc-client-ca-file=" + filepath.Join(tlsDir, rlsidentity.KeyCACert),
		// A Redis call budget the busiest test machine meets: a replica's
		// first call to a shard (dial, AUTH, script load) can outrun the
		// default 50ms there, and the fail-closed rule then answers
		// OVER_LIMIT for it and, the shard marked failing, for the calls
		// after it. What the service does when Redis is slow or gone is
		// test/faults' and test/failopen's; here the store answers.
		"--redis-timeout=10s",
	}, func(k string) (string, bool) { v, ok := env[k]; return v, ok })).To(Succeed())
	Expect(rc.Validate()).To(Succeed())

	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	log := slog.New(slog.NewJSONHandler(GinkgoWriter, nil))
	src, err := kubesource.New(kubesource.Options{Client: cs, Namespace: serviceNamespace, PodName: name,
		ConfigMapName: rc.ConfigMapName, Log: log})
	Expect(err).NotTo(HaveOccurred())
	r, err := runner.New(rc, log, src)
	Expect(err).NotTo(HaveOccurred())
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	DeferCleanup(func() {
		cancel()
		Eventually(done, 20*time.Second).Should(Receive(BeNil()))
	})
	return r
}

// gatewayCreds are the TLS credentials of Gateway namespace/name, as its
// pods mount them from the Secret the manager writes in namespace.
func gatewayCreds(ctx context.Context, namespace, name string) credentials.TransportCredentials {
	var s corev1.Secret
	Eventually(func() error {
		return k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: rlsidentity.ClientSecretName}, &s)
	}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	certKey, keyKey, _ := rlsidentity.ClientKeys(rlsidentity.Gateway{Namespace: namespace, Name: name})
	pair, err := tls.X509KeyPair(s.Data[certKey], s.Data[keyKey])
	Expect(err).NotTo(HaveOccurred())
	roots := x509.NewCertPool()
	Expect(roots.AppendCertsFromPEM(s.Data[rlsidentity.KeyCACert])).To(BeTrue())
	return credentials.NewTLS(&tls.Config{
		ServerName: "floodgate-ratelimit." + serviceNamespace + ".svc.cluster.local",
		RootCAs:    roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12,
	})
}

// routeRateLimits returns the rate_limits of the HTTP_ROUTE patches of a
// generated EnvoyFilter, decoded into go-control-plane's type.
func routeRateLimits(envoyFilter string) []*routev3.RateLimit {
	var ef struct {
		Kind string `json:"kind"`
		Spec struct {
			ConfigPatches []struct {
				ApplyTo string `json:"applyTo"`
				Patch   struct {
					Value struct {
						Route json.RawMessage `json:"route"`
					} `json:"value"`
				} `json:"patch"`
			} `json:"configPatches"`
		} `json:"spec"`
	}
	Expect(yaml.Unmarshal([]byte(envoyFilter), &ef)).To(Succeed())
	Expect(ef.Kind).To(Equal("EnvoyFilter"))
	var out []*routev3.RateLimit
	for _, p := range ef.Spec.ConfigPatches {
		if p.ApplyTo != "HTTP_ROUTE" {
			continue
		}
		var action routev3.RouteAction
		Expect(protojson.Unmarshal(p.Patch.Value.Route, &action)).To(Succeed())
		// A MERGE patch carries only rate_limits; the route Istio builds
		// has the cluster. Each entry is validated on its own.
		for _, rl := range action.GetRateLimits() {
			Expect(rl.ValidateAll()).To(Succeed())
			out = append(out, rl)
		}
	}
	return out
}

func condition(p *v1alpha1.RateLimitPolicy, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(p.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

var _ = Describe("a RateLimitPolicy that targets an HTTPRoute", Ordered, func() {
	const ns = "shop"

	BeforeAll(func(ctx SpecContext) {
		Expect(k8sClient.Create(ctx, &gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: "public", Namespace: ns},
			Spec: gatewayv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gatewayv1.Listener{
				{Name: "http", Port: 80, Protocol: gatewayv1.HTTPProtocolType},
			}},
		})).To(Succeed())
		route := &gatewayv1.HTTPRoute{
			ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns},
			Spec: gatewayv1.HTTPRouteSpec{
				CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "public"}}},
				Hostnames:       []gatewayv1.Hostname{"api.example.com"},
				Rules: []gatewayv1.HTTPRouteRule{{Name: ptr.To(gatewayv1.SectionName("api")), BackendRefs: []gatewayv1.HTTPBackendRef{{
					BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "api", Port: ptr.To(gatewayv1.PortNumber(8080))}},
				}}}},
			},
		}
		Expect(k8sClient.Create(ctx, route)).To(Succeed())
		// What the gateway's controller reports once it has taken the
		// route: Accepted by its parent.
		route.Status.Parents = []gatewayv1.RouteParentStatus{{
			ParentRef:      gatewayv1.ParentReference{Name: "public"},
			ControllerName: "istio.io/gateway-controller",
			Conditions: []metav1.Condition{{Type: string(gatewayv1.RouteConditionAccepted), Status: metav1.ConditionTrue,
				Reason: "Accepted", Message: "accepted", LastTransitionTime: metav1.Now(), ObservedGeneration: route.Generation}},
		}}
		Expect(k8sClient.Status().Update(ctx, route)).To(Succeed())

		Expect(k8sClient.Create(ctx, &v1alpha1.RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: ns},
			Spec: v1alpha1.RateLimitPolicySpec{
				TargetRef: &v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindHTTPRoute, Name: "api"},
				StoreRef:  &v1alpha1.StoreReference{Name: store},
				// Requests from the monitoring network are exempt.
				Exempt: &v1alpha1.Exempt{SourceCIDRs: []v1alpha1.CIDR{"198.51.100.0/24"}},
				Rules: []v1alpha1.Rule{{
					Name: "per-key",
					Match: &v1alpha1.RuleMatch{
						Path:  &v1alpha1.PathMatch{Type: v1alpha1.PathMatchPrefix, Value: "/api"},
						Hosts: []v1alpha1.Hostname{"api.example.com"},
					},
					Key:         []v1alpha1.KeyPart{{Header: "X-Api-Key"}},
					Limit:       v1alpha1.Limit{Requests: 5, Per: metav1.Duration{Duration: time.Hour}},
					FailureMode: v1alpha1.FailureModeClosed,
				}},
			},
		})).To(Succeed())
		DeferCleanup(deleteGatewayPolicy, ns, "edge")
	})

	getPolicy := func(ctx context.Context) *v1alpha1.RateLimitPolicy {
		var p v1alpha1.RateLimitPolicy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "edge"}, &p)).To(Succeed())
		return &p
	}

	It("is Accepted, compiled into the central service's ConfigMap, and reports its target", func(ctx SpecContext) {
		Eventually(func(g Gomega) {
			var cm corev1.ConfigMap
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: config.RateLimitServiceConfigMapName}, &cm)).To(Succeed())
			doc, err := config.Parse([]byte(cm.Data[config.DataKey]))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(doc.Policies).To(HaveLen(1))
			g.Expect(doc.Policies[0].Namespace).To(Equal(ns))
			g.Expect(doc.Policies[0].Name).To(Equal("edge"))
			g.Expect(doc.Policies[0].Gateways).To(Equal([]string{ns + "/public"}),
				"only the Gateway that accepted the targeted route may ask about the policy")
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())

		var auth corev1.Secret
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: config.RateLimitServiceStoreAuthSecret}, &auth)
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(string(auth.Data[config.StoreAuthUserKey])).To(Equal(counterstore.NamespaceUser(serviceNamespace)))
		Expect(string(auth.Data[config.StoreAuthKey])).To(Equal(sidecarPassword),
			"the central service gets its namespace's store user, never the store's admin password")

		var sidecarDoc corev1.ConfigMap
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: config.ConfigMapName}, &sidecarDoc)).
			To(MatchError(ContainSubstring("not found")), "a policy with a targetRef is not in its namespace's sidecar document")

		Eventually(func(g Gomega) {
			p := getPolicy(ctx)
			g.Expect(condition(p, v1alpha1.ConditionAccepted).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(condition(p, v1alpha1.ConditionResolvedRefs).Status).To(Equal(metav1.ConditionTrue))
			prog := condition(p, v1alpha1.ConditionProgrammed)
			g.Expect(prog.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(prog.Reason).To(Equal(v1alpha1.ReasonWaitingForRateLimitService))
			g.Expect(prog.Message).To(ContainSubstring("no replica"))
			g.Expect(p.Status.TargetedPods).To(BeZero())
			g.Expect(p.Status.Target).To(Equal(&v1alpha1.TargetStatus{
				Ref: "HTTPRoute/api", Found: true, Gateways: []string{ns + "/public"}, Hostnames: []string{"api.example.com"},
				GatewayConfig: []string{"shop.public.istio.yaml", "shop.public.envoy-gateway.yaml"},
			}))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	})

	It("is Programmed once the central service's replicas load it, and they answer the gateway's descriptors exactly, sharing Redis", func(ctx SpecContext) {
		replicas := []*runner.Runner{startReplica(ctx, "floodgate-ratelimit-a"), startReplica(ctx, "floodgate-ratelimit-b")}

		Eventually(func(g Gomega) {
			p := getPolicy(ctx)
			prog := condition(p, v1alpha1.ConditionProgrammed)
			g.Expect(prog.Status).To(Equal(metav1.ConditionTrue), prog.Message)
			g.Expect(prog.ObservedGeneration).To(Equal(p.Generation))
			g.Expect(p.Status.EnforcingPods).To(Equal(int32(2)))
			g.Expect(p.Status.Enforcing).To(Equal("2/2"), "kubectl get's ENFORCING: replicas loaded over running")
			g.Expect(p.Status.Store).To(Equal(store))
		}).WithContext(ctx).WithTimeout(60 * time.Second).Should(Succeed())

		// The route actions of the EnvoyFilter the manager generates for
		// the Gateway, turned into descriptors by the model of Envoy's
		// filter.
		var published corev1.ConfigMap
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: ratelimitservice.GatewayConfigMapName}, &published)).To(Succeed())
			g.Expect(published.Data).To(HaveKey("shop.public.istio.yaml"))
			g.Expect(published.Data).To(HaveKey("shop.public.envoy-gateway.yaml"))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		Eventually(func() []string {
			if t := getPolicy(ctx).Status.Target; t != nil {
				return t.GatewayConfig
			}
			return nil
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal([]string{"shop.public.istio.yaml", "shop.public.envoy-gateway.yaml"}))
		rls := routeRateLimits(published.Data["shop.public.istio.yaml"])
		Expect(rls).To(HaveLen(1), "one policy on the route: one rate_limits entry")

		// The route's Gateway, shop/public, calls with the client
		// certificate the manager wrote into its namespace.
		dial := func(r *runner.Runner, creds credentials.TransportCredentials) rlsv3.RateLimitServiceClient {
			conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(creds))
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(conn.Close)
			return rlsv3.NewRateLimitServiceClient(conn)
		}
		creds := gatewayCreds(ctx, ns, "public")
		clients := make([]rlsv3.RateLimitServiceClient, len(replicas))
		for i, r := range replicas {
			clients[i] = dial(r, creds)
		}
		n := 0
		askAs := func(host, client, path, key string) rlsv3.RateLimitResponse_Code {
			h := http.Header{}
			if key != "" {
				h.Set("X-Api-Key", key)
			}
			call, err := envoyemu.Call(config.GatewayDomain, rls, gatewayconfig.Stage, &envoyemu.Request{
				Method: http.MethodGet, Target: path, Authority: host, Headers: h,
				Client: netip.MustParseAddr(client),
			})
			Expect(err).NotTo(HaveOccurred())
			Expect(call).NotTo(BeNil())
			// Alternate replicas: the count is the store's, not a replica's.
			resp, err := clients[n%len(clients)].ShouldRateLimit(ctx, call)
			n++
			Expect(err).NotTo(HaveOccurred())
			return resp.GetOverallCode()
		}
		ask := func(path, key string) rlsv3.RateLimitResponse_Code {
			return askAs("api.example.com", "203.0.113.7", path, key)
		}

		// Another tenant's gateway, with a certificate of the same CA,
		// may not spend the route's counters; a caller without a
		// certificate is not served at all.
		intruder := dial(replicas[0], gatewayCreds(ctx, "other", "gw"))
		plaintext := dial(replicas[1], insecure.NewCredentials())
		for range 10 {
			call, err := envoyemu.Call(config.GatewayDomain, rls, gatewayconfig.Stage, &envoyemu.Request{
				Method: http.MethodGet, Target: "/api/items", Authority: "api.example.com",
				Headers: http.Header{"X-Api-Key": []string{"key-1"}}, Client: netip.MustParseAddr("203.0.113.7"),
			})
			Expect(err).NotTo(HaveOccurred())
			_, err = intruder.ShouldRateLimit(ctx, call)
			Expect(status.Code(err)).To(Equal(codes.PermissionDenied), "another gateway asking about shop/edge")
			_, err = plaintext.ShouldRateLimit(ctx, call)
			Expect(status.Code(err)).To(Equal(codes.Unavailable), "a caller without a client certificate")
		}

		var got []string
		for range 7 {
			got = append(got, ask("/api/items?page=2", "key-1").String())
		}
		Expect(got).To(Equal([]string{"OK", "OK", "OK", "OK", "OK", "OVER_LIMIT", "OVER_LIMIT"}),
			"5 per hour for key-1, counted over both replicas; the refused calls counted nothing")
		Expect(ask("/api/items", "key-2")).To(Equal(rlsv3.RateLimitResponse_OK), "another key has its own count")
		for range 3 {
			Expect(ask("/health", "key-1")).To(Equal(rlsv3.RateLimitResponse_OK), "a path the rule does not match is not limited")
			Expect(askAs("www.example.com:443", "203.0.113.7", "/api/items", "key-1")).To(Equal(rlsv3.RateLimitResponse_OK),
				"a host the rule does not match is not limited")
			Expect(askAs("api.example.com", "198.51.100.9", "/api/items", "key-1")).To(Equal(rlsv3.RateLimitResponse_OK),
				"a client of the exempt network is not limited")
		}
		Expect(askAs("API.example.com:443", "203.0.113.7", "/api/items", "key-1")).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT),
			"the host is compared without its port and case")

	})
})
