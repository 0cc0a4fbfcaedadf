package gatewayloop

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/ratelimitservice"
)

var (
	envoyFilterGVK      = schema.FromAPIVersionAndKind(gatewayconfig.IstioAPIVersion, gatewayconfig.IstioKind)
	envoyPatchPolicyGVK = schema.FromAPIVersionAndKind(gatewayconfig.EnvoyGatewayAPIVersion, gatewayconfig.EnvoyGatewayKind)
)

// normalized is v as JSON decodes it, so that the numbers of an object
// read from the API server and of one decoded from YAML compare equal.
func normalized(v any) any {
	b, err := json.Marshal(v)
	Expect(err).NotTo(HaveOccurred())
	var out any
	Expect(json.Unmarshal(b, &out)).To(Succeed())
	return out
}

// The classes the suite's manager configures (--apply-gateway-classes).
var appliedClasses = []string{"fg-istio", "fg-eg"}

var _ = Describe("the gateways' objects the manager applies itself", Ordered, func() {
	const ns = "mesh"

	// gateway creates a Gateway of class, an HTTPRoute attached to it
	// and accepted, and a policy targeting the route.
	gateway := func(ctx context.Context, name, class string) {
		Expect(k8sClient.Create(ctx, &gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: gatewayv1.GatewaySpec{GatewayClassName: gatewayv1.ObjectName(class), Listeners: []gatewayv1.Listener{
				{Name: "http", Port: 80, Protocol: gatewayv1.HTTPProtocolType},
			}},
		})).To(Succeed())
		route := &gatewayv1.HTTPRoute{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-api", Namespace: ns},
			Spec: gatewayv1.HTTPRouteSpec{
				CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: gatewayv1.ObjectName(name)}}},
				Rules: []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{{
					BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "api", Port: ptr.To(gatewayv1.PortNumber(8080))}},
				}}}},
			},
		}
		Expect(k8sClient.Create(ctx, route)).To(Succeed())
		route.Status.Parents = []gatewayv1.RouteParentStatus{{
			ParentRef:      gatewayv1.ParentReference{Name: gatewayv1.ObjectName(name)},
			ControllerName: "example.com/gateway-controller",
			Conditions: []metav1.Condition{{Type: string(gatewayv1.RouteConditionAccepted), Status: metav1.ConditionTrue,
				Reason: "Accepted", Message: "accepted", LastTransitionTime: metav1.Now(), ObservedGeneration: route.Generation}},
		}}
		Expect(k8sClient.Status().Update(ctx, route)).To(Succeed())
		Expect(k8sClient.Create(ctx, &v1alpha1.RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.RateLimitPolicySpec{
				TargetRef: &v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindHTTPRoute, Name: name + "-api"},
				StoreRef:  &v1alpha1.StoreReference{Name: store},
				Rules: []v1alpha1.Rule{{
					Name:  "per-key",
					Key:   []v1alpha1.KeyPart{{Header: "X-Api-Key"}},
					Limit: v1alpha1.Limit{Requests: 5, Per: metav1.Duration{Duration: time.Minute}},
				}},
			},
		})).To(Succeed())
	}
	getPolicy := func(ctx context.Context, name string) *v1alpha1.RateLimitPolicy {
		var p v1alpha1.RateLimitPolicy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p)).To(Succeed())
		return &p
	}
	object := func(ctx context.Context, gvk schema.GroupVersionKind, gw string) (*unstructured.Unstructured, error) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: gatewayconfig.ObjectName(gw)}, u)
		return u, err
	}
	// published is the object of gw's flavor that the manager publishes
	// in its ConfigMap, as a user would apply it by hand.
	published := func(ctx context.Context, g Gomega, gw, flavor string) map[string]any {
		var cm corev1.ConfigMap
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: ratelimitservice.GatewayConfigMapName}, &cm)).To(Succeed())
		data, ok := cm.Data[ratelimitservice.GatewayConfigKey(ns, gw, flavor)]
		g.Expect(ok).To(BeTrue(), "the published configuration of %s/%s", ns, gw)
		var obj map[string]any
		g.Expect(yaml.Unmarshal([]byte(data), &obj)).To(Succeed())
		return obj
	}
	programmed := func(g Gomega, p *v1alpha1.RateLimitPolicy) metav1.Condition {
		c := condition(p, v1alpha1.ConditionProgrammed)
		g.Expect(c.ObservedGeneration).To(Equal(p.Generation))
		return c
	}
	appliedBy := func(u *unstructured.Unstructured) bool {
		for _, m := range u.GetManagedFields() {
			if m.Manager == ratelimitservice.ApplyFieldOwner && m.Operation == metav1.ManagedFieldsOperationApply {
				return true
			}
		}
		return false
	}

	BeforeAll(func(ctx SpecContext) {
		for name, controller := range map[string]string{
			"fg-istio":          ratelimitservice.IstioController,
			"fg-eg":             ratelimitservice.EnvoyGatewayController,
			"fg-istio-unlisted": ratelimitservice.IstioController,
			"fg-other":          "example.com/gateway-controller",
		} {
			Expect(k8sClient.Create(ctx, &gatewayv1.GatewayClass{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       gatewayv1.GatewayClassSpec{ControllerName: gatewayv1.GatewayController(controller)},
			})).To(Succeed())
		}
		gateway(ctx, "istio-gw", "fg-istio")
		gateway(ctx, "eg-gw", "fg-eg")
		gateway(ctx, "unlisted-gw", "fg-istio-unlisted")
		gateway(ctx, "other-gw", "fg-other")
		startReplica(ctx, "floodgate-ratelimit-apply")
	})
	AfterAll(func(ctx SpecContext) {
		// The suite's other specs count the central service's policies,
		// and name their own stores.
		var all v1alpha1.RateLimitPolicyList
		Expect(k8sClient.List(ctx, &all, client.InNamespace(ns))).To(Succeed())
		for i := range all.Items {
			deleteGatewayPolicy(ctx, ns, all.Items[i].Name)
		}
	})

	It("applies the Istio gateway's EnvoyFilter and the Envoy Gateway one's EnvoyPatchPolicy, as published, owned by the policy, and nothing for other classes", func(ctx SpecContext) {
		for gw, want := range map[string]schema.GroupVersionKind{"istio-gw": envoyFilterGVK, "eg-gw": envoyPatchPolicyGVK} {
			flavor := map[schema.GroupVersionKind]string{envoyFilterGVK: ratelimitservice.FlavorIstio, envoyPatchPolicyGVK: ratelimitservice.FlavorEnvoyGateway}[want]
			Eventually(func(g Gomega) {
				u, err := object(ctx, want, gw)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(normalized(u.Object["spec"])).To(Equal(normalized(published(ctx, g, gw, flavor)["spec"])),
					"the applied object is the one the manager publishes, validated by the installed CRD")
				g.Expect(u.GetLabels()).To(HaveKeyWithValue(ratelimitservice.AppliedLabel, ratelimitservice.AppliedLabelValue))
				g.Expect(appliedBy(u)).To(BeTrue(), "applied server-side by the manager's field manager")
				p := getPolicy(ctx, gw)
				g.Expect(u.GetOwnerReferences()).To(ConsistOf(metav1.OwnerReference{
					APIVersion: v1alpha1.GroupVersion.String(), Kind: "RateLimitPolicy", Name: p.Name, UID: p.UID,
				}))
			}).WithContext(ctx).WithTimeout(60 * time.Second).Should(Succeed())
		}
		// The other kind of object is not made for either gateway, and no
		// object for an unlisted class or another controller's.
		for gw, gvk := range map[string]schema.GroupVersionKind{
			"istio-gw": envoyPatchPolicyGVK, "eg-gw": envoyFilterGVK,
			"unlisted-gw": envoyFilterGVK, "other-gw": envoyFilterGVK,
		} {
			_, err := object(ctx, gvk, gw)
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s for %s: %v", gvk.Kind, gw, err)
		}
		for _, gw := range []string{"unlisted-gw", "other-gw"} {
			_, err := object(ctx, envoyPatchPolicyGVK, gw)
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "EnvoyPatchPolicy for %s: %v", gw, err)
		}

		Eventually(func(g Gomega) {
			p := getPolicy(ctx, "istio-gw")
			c := programmed(g, p)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
			g.Expect(c.Message).To(ContainSubstring("the manager applied EnvoyFilter mesh/floodgate-ratelimit-istio-gw"))
			g.Expect(p.Status.Target.AppliedObjects).To(Equal([]v1alpha1.AppliedObject{{
				Kind: "EnvoyFilter", Namespace: ns, Name: "floodgate-ratelimit-istio-gw", Gateway: ns + "/istio-gw", State: v1alpha1.AppliedStateApplied,
			}}))

			p = getPolicy(ctx, "eg-gw")
			c = programmed(g, p)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonGatewayConfigPending), "Envoy Gateway has not accepted the patches yet")
			g.Expect(p.Status.Target.AppliedObjects).To(HaveLen(1))
			g.Expect(p.Status.Target.AppliedObjects[0].State).To(Equal(v1alpha1.AppliedStateApplied))
			g.Expect(p.Status.Target.AppliedObjects[0].Message).To(ContainSubstring("Waiting for Envoy Gateway"))

			for _, name := range []string{"unlisted-gw", "other-gw"} {
				p = getPolicy(ctx, name)
				c = programmed(g, p)
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: the central service enforces it; its gateway is the user's to configure: %s", name, c.Message)
				g.Expect(p.Status.Target.AppliedObjects).To(BeEmpty())
			}
		}).WithContext(ctx).WithTimeout(60 * time.Second).Should(Succeed())
	})

	// envoyGatewayStatus writes the EnvoyPatchPolicy's status as Envoy
	// Gateway does, for its current generation.
	envoyGatewayStatus := func(ctx context.Context, programmedStatus metav1.ConditionStatus, reason, msg string) {
		Eventually(func(g Gomega) {
			u, err := object(ctx, envoyPatchPolicyGVK, "eg-gw")
			g.Expect(err).NotTo(HaveOccurred())
			now := metav1.Now().UTC().Format(time.RFC3339)
			cond := func(typ string, status metav1.ConditionStatus, reason, msg string) any {
				return map[string]any{"type": typ, "status": string(status), "reason": reason, "message": msg,
					"lastTransitionTime": now, "observedGeneration": u.GetGeneration()}
			}
			g.Expect(unstructured.SetNestedSlice(u.Object, []any{map[string]any{
				"ancestorRef":    map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "eg-gw", "namespace": ns},
				"controllerName": ratelimitservice.EnvoyGatewayController,
				"conditions": []any{
					cond("Accepted", metav1.ConditionTrue, "Accepted", "Policy has been accepted."),
					cond("Programmed", programmedStatus, reason, msg),
				},
			}}, "status", "ancestors")).To(Succeed())
			g.Expect(k8sClient.Status().Update(ctx, u)).To(Succeed())
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	}

	It("follows Envoy Gateway's status of the EnvoyPatchPolicy into Programmed", func(ctx SpecContext) {
		envoyGatewayStatus(ctx, metav1.ConditionTrue, "Programmed", "Patches have been successfully applied.")
		Eventually(func(g Gomega) {
			p := getPolicy(ctx, "eg-gw")
			c := programmed(g, p)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
			g.Expect(p.Status.Target.AppliedObjects[0].State).To(Equal(v1alpha1.AppliedStateProgrammed))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())

		envoyGatewayStatus(ctx, metav1.ConditionFalse, "ResourceNotFound", "Unable to find xds resource http-80")
		Eventually(func(g Gomega) {
			p := getPolicy(ctx, "eg-gw")
			c := programmed(g, p)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonGatewayConfigRejected))
			g.Expect(c.Message).To(ContainSubstring("Unable to find xds resource http-80"))
			g.Expect(p.Status.Target.AppliedObjects[0].State).To(Equal(v1alpha1.AppliedStateRejected))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		envoyGatewayStatus(ctx, metav1.ConditionTrue, "Programmed", "Patches have been successfully applied.")
	})

	It("updates the object when the policy changes, and puts back what others change", func(ctx SpecContext) {
		p := getPolicy(ctx, "istio-gw")
		p.Spec.Rules[0].Key = []v1alpha1.KeyPart{{Header: "X-Plan"}}
		Expect(k8sClient.Update(ctx, p)).To(Succeed())
		Eventually(func(g Gomega) {
			u, err := object(ctx, envoyFilterGVK, "istio-gw")
			g.Expect(err).NotTo(HaveOccurred())
			spec, err := yaml.Marshal(u.Object["spec"])
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(string(spec)).To(ContainSubstring("x-plan"))
			g.Expect(string(spec)).NotTo(ContainSubstring("x-api-key"))
			c := programmed(g, getPolicy(ctx, "istio-gw"))
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
		}).WithContext(ctx).WithTimeout(60 * time.Second).Should(Succeed())

		// Someone empties the patches with an update of their own.
		Eventually(func(g Gomega) {
			u, err := object(ctx, envoyFilterGVK, "istio-gw")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(unstructured.SetNestedSlice(u.Object, []any{}, "spec", "configPatches")).To(Succeed())
			g.Expect(k8sClient.Update(ctx, u, client.FieldOwner("someone"))).To(Succeed())
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			u, err := object(ctx, envoyFilterGVK, "istio-gw")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(normalized(u.Object["spec"])).To(Equal(normalized(published(ctx, g, "istio-gw", ratelimitservice.FlavorIstio)["spec"])))
		}).WithContext(ctx).WithTimeout(30*time.Second).Should(Succeed(), "the manager applies its object again")
	})

	It("leaves alone an object of the same name that it did not create, and says so", func(ctx SpecContext) {
		// A user applied the published EnvoyFilter of a new gateway by
		// hand before the manager configured it.
		Expect(k8sClient.Create(ctx, &gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Name: "hand-gw", Namespace: ns},
			Spec: gatewayv1.GatewaySpec{GatewayClassName: "fg-istio", Listeners: []gatewayv1.Listener{
				{Name: "http", Port: 80, Protocol: gatewayv1.HTTPProtocolType},
			}},
		})).To(Succeed())
		hand := &unstructured.Unstructured{}
		hand.SetGroupVersionKind(envoyFilterGVK)
		hand.SetNamespace(ns)
		hand.SetName(gatewayconfig.ObjectName("hand-gw"))
		hand.Object["spec"] = map[string]any{"configPatches": []any{}}
		Expect(k8sClient.Create(ctx, hand, client.FieldOwner("kubectl"))).To(Succeed())
		rv := hand.GetResourceVersion()

		p := getPolicy(ctx, "istio-gw")
		p.Spec.TargetRef = &v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindGateway, Name: "hand-gw"}
		Expect(k8sClient.Update(ctx, p)).To(Succeed())
		Eventually(func(g Gomega) {
			p := getPolicy(ctx, "istio-gw")
			c := programmed(g, p)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonGatewayConfigConflict))
			g.Expect(c.Message).To(ContainSubstring("was not created by floodgate-manager"))
			g.Expect(p.Status.Target.AppliedObjects).To(HaveLen(1))
			g.Expect(p.Status.Target.AppliedObjects[0].State).To(Equal(v1alpha1.AppliedStateConflict))
		}).WithContext(ctx).WithTimeout(60 * time.Second).Should(Succeed())
		// The manager's object of the gateway the policy left is gone.
		Eventually(func() bool {
			_, err := object(ctx, envoyFilterGVK, "istio-gw")
			return apierrors.IsNotFound(err)
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(BeTrue())
		u, err := object(ctx, envoyFilterGVK, "hand-gw")
		Expect(err).NotTo(HaveOccurred())
		Expect(u.GetResourceVersion()).To(Equal(rv), "the user's object is untouched")

		// Deleted by its owner, it makes way for the manager's.
		Expect(k8sClient.Delete(ctx, u)).To(Succeed())
		Eventually(func(g Gomega) {
			u, err := object(ctx, envoyFilterGVK, "hand-gw")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(appliedBy(u)).To(BeTrue())
			c := programmed(g, getPolicy(ctx, "istio-gw"))
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
		}).WithContext(ctx).WithTimeout(60 * time.Second).Should(Succeed())
	})

	It("deletes the object when its policy goes, with no garbage collector to rely on", func(ctx SpecContext) {
		// envtest runs no kube-controller-manager: owner references
		// delete nothing here, so what goes is what the manager deletes.
		for _, gw := range []string{"eg-gw", "istio-gw"} {
			Expect(k8sClient.Delete(ctx, getPolicy(ctx, gw))).To(Succeed())
		}
		Eventually(func(g Gomega) {
			_, err := object(ctx, envoyPatchPolicyGVK, "eg-gw")
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "EnvoyPatchPolicy of eg-gw: %v", err)
			_, err = object(ctx, envoyFilterGVK, "hand-gw")
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "EnvoyFilter of hand-gw: %v", err)
		}).WithContext(ctx).WithTimeout(60 * time.Second).Should(Succeed())
		var cm corev1.ConfigMap
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: ratelimitservice.GatewayConfigMapName}, &cm)).To(Succeed())
		for key := range cm.Data {
			Expect(strings.HasPrefix(key, ns+".eg-gw.") || strings.HasPrefix(key, ns+".hand-gw.")).To(BeFalse(), "published %s", key)
		}
	})
})
