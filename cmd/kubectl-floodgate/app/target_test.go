package app

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/clusterstatus"
	"github.com/floodgate-dev/floodgate/controllers/ratelimitservice"
)

// gatewayPolicy is a policy with a targetRef as kubectl get -o yaml shows
// it: its status says what the manager found of the HTTPRoute and which
// gateway objects it applied.
const gatewayPolicy = `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: edge
  namespace: shop
  uid: 0b7c6f1e-3a8e-4f4e-9c43-1b1f0f6f9a11
  resourceVersion: "4242"
  generation: 3
  creationTimestamp: "2026-12-01T10:00:00Z"
spec:
  targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: api}
  rules:
  - name: per-key
    key: [{header: X-Api-Key}]
    limit: {requests: 5, per: 1h}
    onMissingKey: Reject
    failureMode: Closed
status:
  observedGeneration: 3
  enforcing: 2/2
  target:
    ref: HTTPRoute/api
    found: true
    gateways: [shop/eg, shop/public]
    hostnames: [api.example.com]
    gatewayConfig: [shop.eg.envoy-gateway.yaml, shop.public.istio.yaml]
    appliedObjects:
    - {kind: EnvoyPatchPolicy, namespace: shop, name: floodgate-eg, gateway: shop/eg, state: Rejected, message: patch path does not exist}
    - {kind: EnvoyFilter, namespace: shop, name: floodgate-public, gateway: shop/public, state: Applied}
`

func TestExplainGatewayPolicy(t *testing.T) {
	t.Parallel()
	code, out, errOut := run(t, gatewayPolicy+"---\n"+goodPolicy, "explain", "-")
	want := `
policy edge, namespace shop: enforced by the gateways of HTTPRoute/api (targetRef), asking the central rate-limit service
  target   HTTPRoute/api: found; Gateways shop/eg, shop/public; hostnames api.example.com
  config   keys shop.eg.envoy-gateway.yaml, shop.public.istio.yaml of ConfigMap floodgate-gateway-config
  applied  EnvoyPatchPolicy shop/floodgate-eg for Gateway shop/eg: Rejected: patch path does not exist
  applied  EnvoyFilter shop/floodgate-public for Gateway shop/public: Applied
  rule per-key
    limits   each X-Api-Key: 5 requests per hour, burst 5, TokenBucket; fails closed: denied (OVER_LIMIT, the gateway answers 429) while the store is unreachable
    applies  to all requests
    cost     1 per request
    missing  requests without X-Api-Key are denied (OVER_LIMIT, the gateway answers 429)
`
	if code != ExitOK || !strings.Contains(out, want) {
		t.Errorf("explain: exit %d, stdout\n%s\nwant it to hold\n%s%s", code, out, want, errOut)
	}
	if !strings.Contains(out, "\npolicy checkout, namespace shop: enforced by pods with app=checkout\n") {
		t.Errorf("explain left out the pods' policy:\n%s", out)
	}

	code, out, errOut = run(t, gatewayPolicy, "explain", "-", "-o", "json")
	if code != ExitOK {
		t.Fatalf("explain -o json: exit %d: %s", code, errOut)
	}
	var rep ExplainReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Policies) != 1 || rep.Policies[0].Target == nil || rep.Policies[0].Target.Status == nil {
		t.Fatalf("report %+v", rep.Policies)
	}
	if got := rep.Policies[0].Target.Status.AppliedObjects; len(got) != 2 || got[0].State != v1alpha1.AppliedStateRejected || got[1].Name != "floodgate-public" {
		t.Errorf("appliedObjects %+v", got)
	}

	// A policy as written has no status: explain says where to read it.
	written, _, _ := strings.Cut(gatewayPolicy, "status:\n")
	code, out, errOut = run(t, written, "explain", "-")
	want = "  target   HTTPRoute/api: no status in the input; to see what the manager found and applied, explain the policy as the cluster has it: kubectl get ratelimitpolicy edge -o yaml | kubectl floodgate explain -\n  rule per-key\n"
	if code != ExitOK || !strings.Contains(out, want) {
		t.Errorf("explain of a policy as written: exit %d, stdout\n%s\nwant it to hold\n%s%s", code, out, want, errOut)
	}

	code, _, errOut = run(t, written, "simulate", "-", "--rate", "1/s", "--for", "2s")
	if code != ExitError || !strings.Contains(errOut, "every RateLimitPolicy of the input has a targetRef") {
		t.Errorf("simulate of a gateway policy: exit %d, %q", code, errOut)
	}
}

func TestPrintStatusGatewayPolicy(t *testing.T) {
	t.Parallel()
	p := v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "shop", Generation: 3},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetRef: &v1alpha1.TargetReference{Group: v1alpha1.GatewayAPIGroup, Kind: v1alpha1.KindHTTPRoute, Name: "api"},
		},
		Status: v1alpha1.RateLimitPolicyStatus{ObservedGeneration: 3, Enforcing: "2/2", Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionAccepted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAccepted},
			{Type: v1alpha1.ConditionResolvedRefs, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonResolvedRefs},
			{Type: v1alpha1.ConditionProgrammed, Status: metav1.ConditionTrue, Reason: "Programmed", Message: "Generation 3 is loaded by 2 of 2 replicas of the central rate-limit service."},
		}},
	}
	withObjects := p.DeepCopy()
	withObjects.Status.Target = &v1alpha1.TargetStatus{
		Ref: "HTTPRoute/api", Found: true, Gateways: []string{"shop/eg", "shop/public"}, Hostnames: []string{"api.example.com"},
		GatewayConfig: []string{"shop.eg.envoy-gateway.yaml", "shop.public.istio.yaml"},
		AppliedObjects: []v1alpha1.AppliedObject{
			{Kind: "EnvoyPatchPolicy", Namespace: "shop", Name: "floodgate-eg", Gateway: "shop/eg", State: v1alpha1.AppliedStateProgrammed},
			{Kind: "EnvoyFilter", Namespace: "shop", Name: "floodgate-public", Gateway: "shop/public", State: v1alpha1.AppliedStateConflict, Message: "an EnvoyFilter of that name exists that floodgate did not create"},
		},
	}
	byHand := p.DeepCopy()
	byHand.Status.Target = &v1alpha1.TargetStatus{Ref: "HTTPRoute/api", Found: true, Gateways: []string{"shop/public"}, GatewayConfig: []string{"shop.public.istio.yaml"}}
	store := &v1alpha1.CounterStore{Status: v1alpha1.CounterStoreStatus{Conditions: []metav1.Condition{
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue},
		{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionFalse},
	}}}

	for _, tc := range []struct {
		name   string
		policy *v1alpha1.RateLimitPolicy
		want   string
	}{
		{"applied by the manager", withObjects, `RateLimitPolicy shop/edge (generation 3)
  Accepted        True  Accepted
  ResolvedRefs    True  ResolvedRefs
  Programmed      True  Programmed: Generation 3 is loaded by 2 of 2 replicas of the central rate-limit service.
  store                 default: Ready True, Degraded False
  target                HTTPRoute/api: found; Gateways shop/eg, shop/public; hostnames api.example.com
  enforced by           2/2 replicas of the central rate-limit service have loaded it
  gateway config        keys shop.eg.envoy-gateway.yaml, shop.public.istio.yaml of ConfigMap floodgate-gateway-config

  APPLIED                             GATEWAY      STATE       MESSAGE
  EnvoyPatchPolicy shop/floodgate-eg  shop/eg      Programmed  
  EnvoyFilter shop/floodgate-public   shop/public  Conflict    an EnvoyFilter of that name exists that floodgate did not create

problems:
  - edge: EnvoyFilter shop/floodgate-public for Gateway shop/public is Conflict: an EnvoyFilter of that name exists that floodgate did not create
`},
		{"applied by hand", byHand, `RateLimitPolicy shop/edge (generation 3)
  Accepted        True  Accepted
  ResolvedRefs    True  ResolvedRefs
  Programmed      True  Programmed: Generation 3 is loaded by 2 of 2 replicas of the central rate-limit service.
  store                 default: Ready True, Degraded False
  target                HTTPRoute/api: found; Gateways shop/public; any host
  enforced by           2/2 replicas of the central rate-limit service have loaded it
  gateway config        keys shop.public.istio.yaml of ConfigMap floodgate-gateway-config
  applied               none reported
`},
	} {
		rep := clusterstatus.Build(clusterstatus.Input{Namespace: "shop", Policies: []v1alpha1.RateLimitPolicy{*tc.policy},
			Stores: map[string]*v1alpha1.CounterStore{"default": store}})
		var out bytes.Buffer
		printStatus(&options{streams: Streams{Out: &out}}, rep)
		if out.String() != tc.want {
			t.Errorf("%s: status printed\n%s\nwant\n%s", tc.name, out.String(), tc.want)
		}
	}
}

// The plugin names the ConfigMap the manager publishes the gateways'
// config in without importing the manager's controllers.
func TestGatewayConfigMapName(t *testing.T) {
	t.Parallel()
	if gatewayConfigMap != ratelimitservice.GatewayConfigMapName {
		t.Errorf("gatewayConfigMap %q, the manager's %q", gatewayConfigMap, ratelimitservice.GatewayConfigMapName)
	}
}
