package ratelimitservice

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
)

// envoyPatchPolicy is an EnvoyPatchPolicy of generation 2 whose status
// has one ancestor, gateway, with the conditions conds (type, status,
// observed generation).
func envoyPatchPolicy(gateway string, conds ...[3]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGeneration(2)
	var cs []any
	for _, c := range conds {
		cs = append(cs, map[string]any{"type": c[0], "status": c[1], "observedGeneration": c[2], "reason": "R", "message": "m-" + c[0].(string)})
	}
	u.Object["status"] = map[string]any{"ancestors": []any{map[string]any{
		"ancestorRef": map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway},
		"conditions":  cs,
	}}}
	return u
}

func TestEnvoyGatewayAccepted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		obj         *unstructured.Unstructured
		ok, known   bool
		whyContains string
	}{
		{"no status yet", &unstructured.Unstructured{Object: map[string]any{}}, false, false, "Waiting for Envoy Gateway"},
		{"accepted and programmed", envoyPatchPolicy("gw", [3]any{"Accepted", "True", int64(2)}, [3]any{"Programmed", "True", int64(2)}), true, true, ""},
		{"accepted, not yet programmed", envoyPatchPolicy("gw", [3]any{"Accepted", "True", int64(2)}), false, false, "Waiting"},
		{"programmed False", envoyPatchPolicy("gw", [3]any{"Accepted", "True", int64(2)}, [3]any{"Programmed", "False", int64(2)}), false, true, "Programmed False (R): m-Programmed"},
		{"not accepted", envoyPatchPolicy("gw", [3]any{"Accepted", "False", int64(2)}), false, true, "Accepted False"},
		{"a status of the previous generation", envoyPatchPolicy("gw", [3]any{"Accepted", "True", int64(1)}, [3]any{"Programmed", "False", int64(1)}), false, false, "Waiting"},
		{"another gateway's ancestor", envoyPatchPolicy("other", [3]any{"Accepted", "True", int64(2)}, [3]any{"Programmed", "True", int64(2)}), false, false, "Waiting"},
	} {
		ok, known, why := envoyGatewayAccepted(tc.obj, "gw")
		if ok != tc.ok || known != tc.known || !strings.Contains(why, tc.whyContains) {
			t.Errorf("%s: ok %v known %v why %q, want %v %v containing %q", tc.name, ok, known, why, tc.ok, tc.known, tc.whyContains)
		}
	}
}

func TestGatewayObjectsPending(t *testing.T) {
	t.Parallel()
	obj := func(kind, state string) v1alpha1.AppliedObject {
		return v1alpha1.AppliedObject{Kind: kind, Namespace: "shop", Name: "floodgate-ratelimit-gw", Gateway: "shop/gw", State: state, Message: "m"}
	}
	ef, epp := gatewayconfig.IstioKind, gatewayconfig.EnvoyGatewayKind
	for _, tc := range []struct {
		name   string
		objs   []v1alpha1.AppliedObject
		reason string
	}{
		{"nothing applied", nil, ""},
		{"an applied EnvoyFilter is in place", []v1alpha1.AppliedObject{obj(ef, v1alpha1.AppliedStateApplied)}, ""},
		{"a programmed EnvoyPatchPolicy is in place", []v1alpha1.AppliedObject{obj(epp, v1alpha1.AppliedStateProgrammed)}, ""},
		{"an EnvoyPatchPolicy not yet accepted", []v1alpha1.AppliedObject{obj(epp, v1alpha1.AppliedStateApplied)}, v1alpha1.ReasonGatewayConfigPending},
		{"a kind not installed", []v1alpha1.AppliedObject{obj(ef, v1alpha1.AppliedStateNotInstalled)}, v1alpha1.ReasonGatewayConfigPending},
		{"rejected wins over pending", []v1alpha1.AppliedObject{obj(epp, v1alpha1.AppliedStateApplied), obj(epp, v1alpha1.AppliedStateRejected)}, v1alpha1.ReasonGatewayConfigRejected},
		{"conflict wins over rejected", []v1alpha1.AppliedObject{obj(epp, v1alpha1.AppliedStateRejected), obj(ef, v1alpha1.AppliedStateConflict)}, v1alpha1.ReasonGatewayConfigConflict},
	} {
		reason, msg := gatewayObjectsPending(tc.objs)
		if reason != tc.reason {
			t.Errorf("%s: reason %q, want %q (%s)", tc.name, reason, tc.reason, msg)
		}
		if reason != "" && !strings.Contains(msg, "shop/floodgate-ratelimit-gw of Gateway shop/gw: m") {
			t.Errorf("%s: message %q names no object", tc.name, msg)
		}
	}
}

func TestOwnerReferences(t *testing.T) {
	t.Parallel()
	pol := func(ns, name, uid string) *v1alpha1.RateLimitPolicy {
		return &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	}
	owners := map[types.NamespacedName]*v1alpha1.RateLimitPolicy{
		{Namespace: "shop", Name: "b"}:  pol("shop", "b", "u-b"),
		{Namespace: "shop", Name: "a"}:  pol("shop", "a", "u-a"),
		{Namespace: "other", Name: "c"}: pol("other", "c", "u-c"),
	}
	att := func(ns, name string) gatewayconfig.Attachment {
		return gatewayconfig.Attachment{Policy: gatewayconfig.Policy{Namespace: ns, Name: name}}
	}
	gw := &gatewayconfig.Gateway{Namespace: "shop", Name: "gw", Attachments: []gatewayconfig.Attachment{
		att("shop", "b"), att("other", "c"), att("shop", "a"), att("shop", "b"), att("shop", "gone"),
	}}
	refs := ownerReferences(gw, owners)
	var got []string
	for _, r := range refs {
		if r.APIVersion != v1alpha1.GroupVersion.String() || r.Kind != "RateLimitPolicy" || r.Controller != nil || r.BlockOwnerDeletion != nil {
			t.Errorf("owner reference %+v: want a plain reference to a RateLimitPolicy", r)
		}
		got = append(got, r.Name+"="+string(r.UID))
	}
	if strings.Join(got, ",") != "a=u-a,b=u-b" {
		t.Errorf("owners %v, want the Gateway namespace's policies once each, sorted: a=u-a,b=u-b", got)
	}
}
