package helmchart

import (
	"os"
	"path"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

// TestRateLimitServiceMountsTheStoreCredentials: the central rate-limit
// service's replicas read what the manager mirrors into
// floodgate-ratelimit-store-auth where the compiled document and the
// sidecar's variables expect it, as injected sidecars do: the password,
// a managed store's user and an external store's TLS CA bundle
// (config.StoreCAFile, the document's store.tls.caFile).
func TestRateLimitServiceMountsTheStoreCredentials(t *testing.T) {
	t.Parallel()
	objs := helmtest.Manifest(t, "-f", "testdata/values/ratelimit-service.yaml")
	var d appsv1.Deployment
	fromUnstructured(t, objs.Get(t, "Deployment", "floodgate-ratelimit"), &d)
	var vol *corev1.Volume
	for i, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == config.RateLimitServiceStoreAuthSecret {
			vol = &d.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatalf("no volume of the Secret %s in %+v", config.RateLimitServiceStoreAuthSecret, d.Spec.Template.Spec.Volumes)
	}
	if vol.Secret.Optional == nil || !*vol.Secret.Optional {
		t.Errorf("the credentials volume is not optional: the replicas start before the manager mirrors the Secret")
	}
	files := map[string]bool{}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name != vol.Name {
				continue
			}
			for _, it := range vol.Secret.Items {
				files[path.Join(m.MountPath, it.Path)] = it.Key == it.Path
			}
		}
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		for name, want := range map[string]string{config.EnvRedisPasswordFile: config.StoreAuthFile, config.EnvRedisUsernameFile: config.StoreAuthUserFile} {
			if env[name] != want {
				t.Errorf("container %s: %s = %q, want %q", c.Name, name, env[name], want)
			}
		}
	}
	for _, f := range []string{config.StoreAuthFile, config.StoreAuthUserFile, config.StoreCAFile} {
		if !files[f] {
			t.Errorf("the replicas have no %s from the key of the same name (they have %v)", f, files)
		}
	}
}

// TestRateLimitServiceNetworkPolicy: with the chart's NetworkPolicies on,
// the central rate-limit service's gRPC port is closed to every pod but
// the gateways named in rateLimitService.allowedGateways (none by
// default), and its admin port stays open to the kubelet's probes and the
// scrapers, which a NetworkPolicy cannot name.
func TestRateLimitServiceNetworkPolicy(t *testing.T) {
	t.Parallel()
	get := func(t *testing.T, args ...string) (*networkingv1.NetworkPolicy, *appsv1.Deployment) {
		t.Helper()
		objs := helmtest.Manifest(t, args...)
		var np networkingv1.NetworkPolicy
		fromUnstructured(t, objs.Get(t, "NetworkPolicy", "floodgate-ratelimit"), &np)
		var d appsv1.Deployment
		fromUnstructured(t, objs.Get(t, "Deployment", "floodgate-ratelimit"), &d)
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("the NetworkPolicy selects %v (%v), not the service's pods %v", np.Spec.PodSelector, err, d.Spec.Template.Labels)
		}
		return &np, &d
	}
	port := func(p int) []networkingv1.NetworkPolicyPort {
		tcp := corev1.ProtocolTCP
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromInt(p))}}
	}
	admin := networkingv1.NetworkPolicyIngressRule{Ports: port(9090)}

	t.Run("default: no caller", func(t *testing.T) {
		t.Parallel()
		np, _ := get(t, "--set", "rateLimitService.enabled=true")
		if want := []networkingv1.NetworkPolicyIngressRule{admin}; !reflect.DeepEqual(np.Spec.Ingress, want) {
			t.Errorf("ingress = %s, want the admin port only:\n%s", toYAML(t, np.Spec.Ingress), toYAML(t, want))
		}
	})
	t.Run("the gateways named", func(t *testing.T) {
		t.Parallel()
		np, _ := get(t, "-f", "testdata/values/ratelimit-service.yaml")
		want := []networkingv1.NetworkPolicyIngressRule{admin, {
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "shop"}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"gateway.networking.k8s.io/gateway-name": "public"}},
			}, {
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "envoy-gateway-system"}},
				PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: "gateway.envoyproxy.io/owning-gateway-name", Operator: metav1.LabelSelectorOpExists,
				}}},
			}},
			Ports: port(8082),
		}}
		if !reflect.DeepEqual(np.Spec.Ingress, want) {
			t.Errorf("ingress = %s, want the admin port, and the gRPC port from the two gateways only:\n%s", toYAML(t, np.Spec.Ingress), toYAML(t, want))
		}
	})
	t.Run("NetworkPolicies off", func(t *testing.T) {
		t.Parallel()
		objs := helmtest.Manifest(t, "-f", "testdata/values/ratelimit-service.yaml", "--set", "networkPolicy.enabled=false")
		if len(objs.OfKind("NetworkPolicy")) != 0 {
			t.Errorf("networkPolicy.enabled=false renders NetworkPolicies %v", objs.OfKind("NetworkPolicy").Names())
		}
	})
}

// TestGatewaysDocValuesRender renders the chart with the values that
// docs/gateways.md gives for naming a gateway: the schema accepts them and
// the gRPC port is open to that gateway.
func TestGatewaysDocValuesRender(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join(helmtest.RepoRoot(t), "docs", "gateways.md"))
	if err != nil {
		t.Fatal(err)
	}
	var values string
	for _, block := range strings.Split(string(doc), "```yaml\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if strings.Contains(block, "allowedGateways:") {
			values = block
		}
	}
	if values == "" {
		t.Fatal("docs/gateways.md has no YAML block with rateLimitService.allowedGateways")
	}
	objs := helmtest.Manifest(t, "--set", "rateLimitService.enabled=true", "-f", writeValues(t, values))
	var np networkingv1.NetworkPolicy
	fromUnstructured(t, objs.Get(t, "NetworkPolicy", "floodgate-ratelimit"), &np)
	if len(np.Spec.Ingress) != 2 || len(np.Spec.Ingress[1].From) != 1 || np.Spec.Ingress[1].Ports[0].Port.IntValue() != 8082 {
		t.Errorf("with the values of docs/gateways.md, ingress = %s, want the gRPC port open to its one gateway", toYAML(t, np.Spec.Ingress))
	}
}
