package ratelimitservice

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// GatewayConfigMapName is the ConfigMap, in the central service's
// namespace, where the manager publishes what each Gateway that enforces
// policies needs: under GatewayConfigKey, the Istio EnvoyFilter and the
// Envoy Gateway EnvoyPatchPolicy that send its requests' descriptors to
// the central service.
const GatewayConfigMapName = "floodgate-gateway-config"

// The kinds of generated configuration, the suffixes of the ConfigMap's
// keys.
const (
	// FlavorIstio is the Istio EnvoyFilter.
	FlavorIstio = "istio"
	// FlavorEnvoyGateway is Envoy Gateway's EnvoyPatchPolicy, for its
	// default xDS name scheme (V2, Envoy Gateway 1.10 and later).
	FlavorEnvoyGateway = "envoy-gateway"
)

// GatewayConfigKey is the key of the generated configuration of kind
// flavor for the Gateway namespace/name.
func GatewayConfigKey(namespace, name, flavor string) string {
	return namespace + "." + name + "." + flavor + ".yaml"
}

// attachment is one policy enforced at one Gateway.
type attachment struct {
	gateway types.NamespacedName
	gatewayconfig.Attachment
}

// routeAttachments are the attachments of a policy that targets route
// (an HTTPRoute or a GRPCRoute), at each Gateway that accepted it.
func routeAttachments(ref v1alpha1.TargetReference, pol gatewayconfig.Policy, route *routeView) []attachment {
	r := gatewayconfig.Route{Kind: route.kind, Namespace: route.namespace, Name: route.name}
	for _, h := range route.hostnames {
		r.Hostnames = append(r.Hostnames, string(h))
	}
	for i, name := range route.ruleNames {
		if ref.SectionName == "" || name == ref.SectionName {
			r.Rules = append(r.Rules, gatewayconfig.RouteRule{Index: i, Name: name})
		}
	}
	if len(r.Rules) == 0 {
		return nil
	}
	byGateway := map[types.NamespacedName][]string{}
	var order []types.NamespacedName
	whole := map[types.NamespacedName]bool{}
	for _, gw := range route.target(ref).Gateways {
		ns, name, _ := strings.Cut(gw, "/")
		key := types.NamespacedName{Namespace: ns, Name: name}
		order = append(order, key)
		for _, p := range route.parentRefs {
			pns := route.namespace
			if p.Namespace != nil {
				pns = string(*p.Namespace)
			}
			if pns != ns || string(p.Name) != name {
				continue
			}
			if p.SectionName == nil {
				whole[key] = true
			} else {
				byGateway[key] = append(byGateway[key], string(*p.SectionName))
			}
		}
	}
	var out []attachment
	for _, key := range order {
		rr := r
		rr.Rules = slices.Clone(r.Rules)
		if !whole[key] {
			rr.Listeners = byGateway[key]
		}
		out = append(out, attachment{gateway: key, Attachment: gatewayconfig.Attachment{Policy: pol, Route: &rr}})
	}
	return out
}

// listeners converts a Gateway's listeners.
func listeners(gw *gatewayv1.Gateway) []gatewayconfig.Listener {
	out := make([]gatewayconfig.Listener, 0, len(gw.Spec.Listeners))
	for _, l := range gw.Spec.Listeners {
		out = append(out, gatewayconfig.Listener{Name: string(l.Name), Port: l.Port, Protocol: string(l.Protocol)})
	}
	return out
}

// generateObjects fills in each Gateway's objects of every flavor. A
// Gateway the generators refuse is reported in the error and keeps no
// objects; the others are still generated.
func generateObjects(gens []generated, svc gatewayconfig.Service) error {
	var errs []string
	for i := range gens {
		gw := gens[i].gw
		ef, err := gatewayconfig.Istio(gw, svc)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		epp, err := gatewayconfig.EnvoyGateway(gw, svc, gatewayconfig.NameSchemeV2)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		gens[i].objects = map[string]*unstructured.Unstructured{FlavorIstio: ef, FlavorEnvoyGateway: epp}
	}
	if len(errs) > 0 {
		return fmt.Errorf("generate gateway configuration: %s", strings.Join(errs, "; "))
	}
	return nil
}

// renderObjects renders the generated objects as YAML, keyed by
// GatewayConfigKey.
func renderObjects(gens []generated) (map[string]string, error) {
	data := map[string]string{}
	for _, g := range gens {
		for flavor, obj := range g.objects {
			b, err := yaml.Marshal(obj.Object)
			if err != nil {
				return nil, fmt.Errorf("render the %s configuration of Gateway %s/%s: %w", flavor, g.gw.Namespace, g.gw.Name, err)
			}
			data[GatewayConfigKey(g.gw.Namespace, g.gw.Name, flavor)] = string(b)
		}
	}
	return data, nil
}

// publishGatewayConfig generates the objects of every Gateway that
// enforces a compiled policy, writes them into GatewayConfigMapName, and
// returns them. A Gateway the generators refuse is returned without
// objects (and reported in the error); on any other error the result is
// nil, so that nothing is pruned on a partial view.
func (r *Reconciler) publishGatewayConfig(ctx context.Context, atts []attachment) ([]generated, error) {
	byGateway := map[types.NamespacedName]int{}
	var gens []generated
	for _, a := range atts {
		i, ok := byGateway[a.gateway]
		if !ok {
			var obj gatewayv1.Gateway
			switch err := r.Client.Get(ctx, a.gateway, &obj); {
			case apierrors.IsNotFound(err):
				continue
			case err != nil:
				return nil, fmt.Errorf("get Gateway %s: %w", a.gateway, err)
			}
			i = len(gens)
			byGateway[a.gateway] = i
			gens = append(gens, generated{
				gw:    &gatewayconfig.Gateway{Namespace: obj.Namespace, Name: obj.Name, Listeners: listeners(&obj)},
				class: string(obj.Spec.GatewayClassName),
			})
		}
		gens[i].gw.Attachments = append(gens[i].gw.Attachments, a.Attachment)
	}
	slices.SortFunc(gens, func(a, b generated) int {
		return cmp.Or(cmp.Compare(a.gw.Namespace, b.gw.Namespace), cmp.Compare(a.gw.Name, b.gw.Name))
	})
	genErr := generateObjects(gens, r.Service)
	data, err := renderObjects(gens)
	if err != nil {
		return nil, err
	}

	key := client.ObjectKey{Namespace: r.Namespace, Name: GatewayConfigMapName}
	var cm corev1.ConfigMap
	err = r.APIReader.Get(ctx, key, &cm)
	switch {
	case apierrors.IsNotFound(err) && len(data) == 0:
		return gens, genErr
	case err != nil && !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get ConfigMap %s: %w", key, err)
	case err == nil && len(data) == 0:
		if err := r.Client.Delete(ctx, &cm, client.Preconditions{UID: &cm.UID}); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("delete ConfigMap %s: %w", key, err)
		}
		return gens, genErr
	case err == nil && cm.DeletionTimestamp == nil && cm.Labels[policy.ManagedByLabel] == policy.ManagedByValue &&
		len(cm.BinaryData) == 0 && equalData(cm.Data, data):
		return gens, genErr
	}
	desired := corev1ac.ConfigMap(key.Name, key.Namespace).
		WithLabels(map[string]string{policy.ManagedByLabel: policy.ManagedByValue}).
		WithData(data)
	if err := r.Client.Apply(ctx, desired, client.FieldOwner(policy.FieldOwner), client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("apply ConfigMap %s: %w", key, err)
	}
	log.FromContext(ctx).Info("published the gateways' configuration", "gateways", len(gens))
	return gens, genErr
}

func equalData(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// gatewayConfigKeys are the keys of the configuration generated for the
// gateways, as namespace/name, in status.target.gateways.
func gatewayConfigKeys(gateways []string) []string {
	var keys []string
	for _, gw := range gateways {
		ns, name, _ := strings.Cut(gw, "/")
		keys = append(keys, GatewayConfigKey(ns, name, FlavorIstio), GatewayConfigKey(ns, name, FlavorEnvoyGateway))
	}
	if len(keys) > maxTargetGateways {
		keys = keys[:maxTargetGateways]
	}
	return keys
}

// compiledPolicy returns the gateway's view of the entry of ns/name in doc,
// or false when the document holds none.
func compiledPolicy(doc *config.Config, ns, name string) (gatewayconfig.Policy, bool) {
	if doc == nil {
		return gatewayconfig.Policy{}, false
	}
	for i := range doc.Policies {
		if p := &doc.Policies[i]; p.Namespace == ns && p.Name == name {
			return gatewayconfig.PolicyFor(p), true
		}
	}
	return gatewayconfig.Policy{}, false
}
