package helmchart

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

// The wiring contract (notes/k8s-contract.md) fixes these.
const (
	injectWebhookName   = "inject.floodgate.dev"
	injectPath          = "/mutate-v1-pod"
	validateWebhookName = "validate.ratelimitpolicy.floodgate.dev"
	validatePath        = "/validate-ratelimit-floodgate-dev-v1alpha1-ratelimitpolicy"
	// The ClusterRateLimitPolicy validator's.
	validateClusterWebhookName = "validate.clusterratelimitpolicy.floodgate.dev"
	validateClusterPath        = "/validate-ratelimit-floodgate-dev-v1alpha1-clusterratelimitpolicy"
	optedInExpression          = "has(object.metadata.annotations) && 'floodgate.dev/inject' in object.metadata.annotations && object.metadata.annotations['floodgate.dev/inject'] == 'true'"
	defaultCertDir             = "/tmp/k8s-webhook-server/serving-certs"
)

func fromUnstructured(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		t.Fatalf("%s %s does not decode strictly as %T: %v", u.GetKind(), u.GetName(), into, err)
	}
}

func managerDeployment(t *testing.T, objs helmtest.Set) *appsv1.Deployment {
	t.Helper()
	deps := objs.OfKind("Deployment")
	if len(deps) != 1 {
		t.Fatalf("the chart renders %d Deployments, want 1: %v", len(deps), deps.Names())
	}
	var d appsv1.Deployment
	fromUnstructured(t, deps[0], &d)
	return &d
}

func managerPodSpec(t *testing.T, objs helmtest.Set) *corev1.PodSpec {
	t.Helper()
	return &managerDeployment(t, objs).Spec.Template.Spec
}

func managerContainer(t *testing.T, objs helmtest.Set) *corev1.Container {
	t.Helper()
	spec := managerPodSpec(t, objs)
	if len(spec.Containers) != 1 {
		t.Fatalf("the manager pod has %d containers, want 1", len(spec.Containers))
	}
	return &spec.Containers[0]
}

// flags parses the manager's args (all --name=value or --name) into a map,
// failing on anything else and on repeated flags.
func flags(t *testing.T, args []string) map[string]string {
	t.Helper()
	out := make(map[string]string, len(args))
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("manager arg %q is not a --flag", a)
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			value = "true"
		}
		if _, dup := out[name]; dup {
			t.Fatalf("manager flag --%s is passed twice", name)
		}
		out[name] = value
	}
	return out
}

func appVersion(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(helmtest.ChartDir(t), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		APIVersion string `json:"apiVersion"`
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if c.APIVersion != "v2" || c.Version != "0.1.0" || c.AppVersion == "" {
		t.Fatalf("Chart.yaml: apiVersion %q version %q appVersion %q, want v2, 0.1.0 and an appVersion", c.APIVersion, c.Version, c.AppVersion)
	}
	return c.AppVersion
}

func wantFlags(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	for name, v := range want {
		g, ok := got[name]
		switch {
		case !ok && v == "":
		case !ok:
			t.Errorf("manager flag --%s is missing, want %q", name, v)
		case v == "":
			t.Errorf("manager flag --%s = %q, want it absent", name, g)
		case g != v:
			t.Errorf("manager flag --%s = %q, want %q", name, g, v)
		}
	}
}

func TestManagerDeploymentDefaults(t *testing.T) {
	t.Parallel()
	objs := helmtest.Manifest(t)
	d := managerDeployment(t, objs)
	c := managerContainer(t, objs)
	spec := &d.Spec.Template.Spec
	version := appVersion(t)

	if got, want := *d.Spec.Replicas, int32(2); got != want {
		t.Errorf("replicas = %d, want %d", got, want)
	}
	if got, want := d.Namespace, helmtest.Namespace; got != want {
		t.Errorf("Deployment namespace = %q, want %q", got, want)
	}
	if got, want := c.Image, "ghcr.io/floodgate-dev/floodgate-manager:"+version; got != want {
		t.Errorf("image = %q, want %q (tag defaults to appVersion)", got, want)
	}
	wantFlags(t, flags(t, c.Args), map[string]string{
		"namespace":                 helmtest.Namespace,
		"sidecar-image":             "ghcr.io/floodgate-dev/floodgate-sidecar:" + version,
		"leader-elect":              "true",
		"health-probe-bind-address": ":8081",
		"metrics-bind-address":      ":8443",
		"metrics-secure":            "true",
		"webhook-port":              "9443",
		"webhook-cert-dir":          defaultCertDir,
		"webhook-cert-mode":         "self-managed",
		"webhook-cert-secret":       "floodgate-webhook-cert",
		"webhook-service-name":      "floodgate-webhook",
		"mutating-webhook-config":   "floodgate-sidecar-injector",
		"validating-webhook-config": "floodgate-policy-validator",
		"graceful-shutdown-timeout": "30s",
	})
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if got, want := env["POD_NAMESPACE"], "metadata.namespace"; got != want {
		t.Errorf("POD_NAMESPACE comes from %q, want the downward API %q", got, want)
	}

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if !reflect.DeepEqual(ports, map[string]int32{"webhook-server": 9443, "metrics": 8443, "health": 8081}) {
		t.Errorf("container ports = %v", ports)
	}
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		wantPath := map[string]string{"liveness": "/healthz", "readiness": "/readyz"}[name]
		if probe == nil || probe.HTTPGet == nil {
			t.Errorf("%s probe is not an HTTP probe", name)
			continue
		}
		if probe.HTTPGet.Path != wantPath || probe.HTTPGet.Port != intstr.FromString("health") {
			t.Errorf("%s probe = %s on port %s, want %s on the health port (8081)", name, probe.HTTPGet.Path, probe.HTTPGet.Port.String(), wantPath)
		}
	}

	// Restricted Pod Security.
	psc, sc := spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want runAsNonRoot and seccompProfile RuntimeDefault", psc)
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container securityContext = %+v, want the restricted profile", sc)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v, want cpu and memory requests and a memory limit", c.Resources)
	}

	// The self-managed certificate is written by the manager: a writable
	// volume at the cert dir.
	vol := volumeAt(t, spec, c, defaultCertDir)
	if vol.EmptyDir == nil {
		t.Errorf("volume at %s = %+v, want an emptyDir the manager writes", defaultCertDir, vol.VolumeSource)
	}

	podLabels := labels.Set(d.Spec.Template.Labels)
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Fatalf("Deployment selector %v does not match its pod labels %v (%v)", d.Spec.Selector, podLabels, err)
	}
	if len(spec.TopologySpreadConstraints) == 0 {
		t.Error("no topologySpreadConstraints")
	}
	for _, tsc := range spec.TopologySpreadConstraints {
		s, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
		if err != nil || !s.Matches(podLabels) || s.Empty() {
			t.Errorf("topology spread on %s selects %v, want this release's manager pods", tsc.TopologyKey, tsc.LabelSelector)
		}
	}

	var pdb policyv1.PodDisruptionBudget
	fromUnstructured(t, objs.Get(t, "PodDisruptionBudget", "floodgate-manager"), &pdb)
	if pdb.Spec.MinAvailable == nil || *pdb.Spec.MinAvailable != intstr.FromInt32(1) || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("PDB = %+v, want minAvailable 1", pdb.Spec)
	}
	if !reflect.DeepEqual(pdb.Spec.Selector, d.Spec.Selector) {
		t.Errorf("PDB selector %v, want the Deployment's %v", pdb.Spec.Selector, d.Spec.Selector)
	}

	var leader rbacv1.Role
	fromUnstructured(t, objs.Get(t, "Role", "floodgate-leader-election"), &leader)
	if !grants(leader.Rules, "coordination.k8s.io", "leases", "get", "create", "update") {
		t.Errorf("leader-election Role %+v does not grant get/create/update on leases", leader.Rules)
	}
	var leaderBinding rbacv1.RoleBinding
	fromUnstructured(t, objs.Get(t, "RoleBinding", "floodgate-leader-election"), &leaderBinding)
	if leaderBinding.RoleRef.Name != leader.Name || len(leaderBinding.Subjects) != 1 || leaderBinding.Subjects[0].Name != spec.ServiceAccountName {
		t.Errorf("leader-election RoleBinding %+v does not bind the Role to the manager's ServiceAccount %s", leaderBinding, spec.ServiceAccountName)
	}
	var metricsAuth rbacv1.ClusterRole
	fromUnstructured(t, objs.Get(t, "ClusterRole", "floodgate-metrics-auth"), &metricsAuth)
	if !grants(metricsAuth.Rules, "authentication.k8s.io", "tokenreviews", "create") || !grants(metricsAuth.Rules, "authorization.k8s.io", "subjectaccessreviews", "create") {
		t.Errorf("metrics auth ClusterRole %+v cannot review tokens and access", metricsAuth.Rules)
	}
	objs.Get(t, "ClusterRoleBinding", "floodgate-metrics-auth")
	objs.Get(t, "ClusterRole", "floodgate-metrics-reader")
}

func grants(rules []rbacv1.PolicyRule, group, resource string, verbs ...string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) {
			ok := true
			for _, v := range verbs {
				ok = ok && slices.Contains(r.Verbs, v)
			}
			if ok {
				return true
			}
		}
	}
	return false
}

func volumeAt(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, path string) *corev1.Volume {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for i := range spec.Volumes {
			if spec.Volumes[i].Name == m.Name {
				return &spec.Volumes[i]
			}
		}
		t.Fatalf("mount %s names no volume %q", path, m.Name)
	}
	t.Fatalf("nothing is mounted at %s", path)
	return nil
}

// TestServicesFollowContract checks the webhook Service (named by
// --webhook-service-name, 443 -> 9443) and the metrics Service.
func TestServicesFollowContract(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{"default": nil, "custom": {"-f", "testdata/values/custom.yaml"}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			objs := helmtest.Manifest(t, args...)
			d := managerDeployment(t, objs)
			c := managerContainer(t, objs)
			f := flags(t, c.Args)
			podLabels := labels.Set(d.Spec.Template.Labels)

			var svc corev1.Service
			fromUnstructured(t, objs.Get(t, "Service", f["webhook-service-name"]), &svc)
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 {
				t.Fatalf("webhook Service ports = %+v, want one port 443", svc.Spec.Ports)
			}
			if got, want := containerPort(t, c, svc.Spec.Ports[0].TargetPort), f["webhook-port"]; got != want {
				t.Errorf("webhook Service targets container port %s, want --webhook-port %s", got, want)
			}
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
				t.Errorf("webhook Service selector %v does not select the manager pods %v", svc.Spec.Selector, podLabels)
			}

			metrics := objs.OfKind("Service")
			var found bool
			for _, u := range metrics {
				var s corev1.Service
				fromUnstructured(t, u, &s)
				if s.Name == svc.Name {
					continue
				}
				found = true
				if got, want := ":"+containerPort(t, c, s.Spec.Ports[0].TargetPort), f["metrics-bind-address"]; got != want {
					t.Errorf("metrics Service %s targets %s, want --metrics-bind-address %s", s.Name, got, want)
				}
				if !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
					t.Errorf("metrics Service selector %v does not select the manager pods", s.Spec.Selector)
				}
			}
			if !found {
				t.Error("no metrics Service")
			}
		})
	}
}

func containerPort(t *testing.T, c *corev1.Container, target intstr.IntOrString) string {
	t.Helper()
	for _, p := range c.Ports {
		if (target.Type == intstr.String && p.Name == target.StrVal) || (target.Type == intstr.Int && p.ContainerPort == target.IntVal) {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	t.Fatalf("target port %s names no container port", target.String())
	return ""
}

// TestWebhookConfigurationsFollowContract checks both webhook
// configurations field by field against the contract, in self-managed and
// cert-manager mode and with custom names.
func TestWebhookConfigurationsFollowContract(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		args               []string
		certManager        bool
		extraExcludedNames []string
	}{
		"default":      {},
		"cert-manager": {args: []string{"-f", "testdata/values/cert-manager.yaml"}, certManager: true},
		"custom":       {args: []string{"-f", "testdata/values/custom.yaml"}, certManager: true, extraExcludedNames: []string{"monitoring", "istio-system"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			objs := helmtest.Manifest(t, tc.args...)
			c := managerContainer(t, objs)
			f := flags(t, c.Args)
			port := int32(443)
			fail, none, ifNeeded, equivalent := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.IfNeededReinvocationPolicy, admissionregistrationv1.Equivalent
			namespaced := admissionregistrationv1.NamespacedScope

			var mwc admissionregistrationv1.MutatingWebhookConfiguration
			fromUnstructured(t, objs.Get(t, "MutatingWebhookConfiguration", f["mutating-webhook-config"]), &mwc)
			if len(mwc.Webhooks) != 1 {
				t.Fatalf("%s has %d webhooks, want 1", mwc.Name, len(mwc.Webhooks))
			}
			m := mwc.Webhooks[0]
			timeout := m.TimeoutSeconds
			wantM := admissionregistrationv1.MutatingWebhook{
				Name:                    injectWebhookName,
				AdmissionReviewVersions: []string{"v1"},
				ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
					Namespace: helmtest.Namespace, Name: f["webhook-service-name"], Path: ptr(injectPath), Port: &port,
				}},
				FailurePolicy:      &fail,
				MatchPolicy:        &equivalent,
				ReinvocationPolicy: &ifNeeded,
				SideEffects:        &none,
				TimeoutSeconds:     timeout,
				Rules: []admissionregistrationv1.RuleWithOperations{{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: &namespaced},
				}},
				NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn,
					Values: append([]string{"kube-system", "kube-public", "kube-node-lease", helmtest.Namespace}, tc.extraExcludedNames...),
				}}},
				MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "opted-in", Expression: optedInExpression}},
			}
			if timeout == nil || *timeout < 1 || *timeout > 30 {
				t.Errorf("injector timeoutSeconds = %v, want 1-30", timeout)
			}
			if !reflect.DeepEqual(m, wantM) {
				t.Errorf("injector webhook differs from the contract:\n got: %s\nwant: %s", toYAML(t, m), toYAML(t, wantM))
			}
			// The pod labels policy reads which pods the injector labels
			// from this configuration: both its bindings name it.
			for _, b := range []string{"floodgate-pod-labels-injected", "floodgate-pod-labels-store-client"} {
				var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
				fromUnstructured(t, objs.Get(t, "ValidatingAdmissionPolicyBinding", b), &binding)
				if binding.Spec.PolicyName != "floodgate-pod-labels" || binding.Spec.ParamRef == nil || binding.Spec.ParamRef.Name != mwc.Name ||
					binding.Spec.ParamRef.ParameterNotFoundAction == nil || *binding.Spec.ParamRef.ParameterNotFoundAction != admissionregistrationv1.DenyAction {
					t.Errorf("ValidatingAdmissionPolicyBinding %s = %s, want policy floodgate-pod-labels with the param %s, required", b, toYAML(t, binding.Spec), mwc.Name)
				}
			}

			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			fromUnstructured(t, objs.Get(t, "ValidatingWebhookConfiguration", f["validating-webhook-config"]), &vwc)
			if len(vwc.Webhooks) != 2 {
				t.Fatalf("%s has %d webhooks, want 2", vwc.Name, len(vwc.Webhooks))
			}
			v := vwc.Webhooks[0]
			wantV := admissionregistrationv1.ValidatingWebhook{
				Name:                    validateWebhookName,
				AdmissionReviewVersions: []string{"v1"},
				ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
					Namespace: helmtest.Namespace, Name: f["webhook-service-name"], Path: ptr(validatePath), Port: &port,
				}},
				FailurePolicy:  &fail,
				MatchPolicy:    &equivalent,
				SideEffects:    &none,
				TimeoutSeconds: timeout,
				Rules: []admissionregistrationv1.RuleWithOperations{{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{v1alpha1.GroupVersion.Group}, APIVersions: []string{v1alpha1.GroupVersion.Version}, Resources: []string{"ratelimitpolicies"}, Scope: &namespaced},
				}},
			}
			if !reflect.DeepEqual(v, wantV) {
				t.Errorf("validator webhook differs from the contract:\n got: %s\nwant: %s", toYAML(t, v), toYAML(t, wantV))
			}
			cluster := admissionregistrationv1.ClusterScope
			wantCV := *wantV.DeepCopy()
			wantCV.Name = validateClusterWebhookName
			wantCV.ClientConfig.Service.Path = ptr(validateClusterPath)
			wantCV.Rules[0].Resources = []string{"clusterratelimitpolicies"}
			wantCV.Rules[0].Scope = &cluster
			if cv := vwc.Webhooks[1]; !reflect.DeepEqual(cv, wantCV) {
				t.Errorf("cluster policy validator webhook differs from the contract:\n got: %s\nwant: %s", toYAML(t, cv), toYAML(t, wantCV))
			}

			spec := managerPodSpec(t, objs)
			vol := volumeAt(t, spec, c, f["webhook-cert-dir"])
			if !tc.certManager {
				if f["webhook-cert-mode"] != "self-managed" {
					t.Errorf("--webhook-cert-mode = %q, want self-managed", f["webhook-cert-mode"])
				}
				for _, meta := range []metav1.ObjectMeta{mwc.ObjectMeta, vwc.ObjectMeta} {
					if len(meta.Annotations) != 0 {
						t.Errorf("%s has annotations %v; the manager injects the CA itself", meta.Name, meta.Annotations)
					}
				}
				if len(objs.OfKind("Certificate")) != 0 || len(objs.OfKind("Issuer")) != 0 {
					t.Error("cert-manager objects rendered in self-managed mode")
				}
				if m.ClientConfig.CABundle != nil || v.ClientConfig.CABundle != nil || vwc.Webhooks[1].ClientConfig.CABundle != nil {
					t.Error("the chart sets a caBundle that the manager owns")
				}
				return
			}

			// cert-manager mode.
			wantFlags(t, f, map[string]string{"webhook-cert-mode": "external", "webhook-cert-secret": ""})
			certs := objs.OfKind("Certificate")
			if len(certs) != 1 {
				t.Fatalf("%d Certificates rendered, want 1", len(certs))
			}
			cert := certs[0]
			wantInject := helmtest.Namespace + "/" + cert.GetName()
			for _, meta := range []metav1.ObjectMeta{mwc.ObjectMeta, vwc.ObjectMeta} {
				if got := meta.Annotations["cert-manager.io/inject-ca-from"]; got != wantInject {
					t.Errorf("%s inject-ca-from = %q, want %q", meta.Name, got, wantInject)
				}
			}
			secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
			if vol.Secret == nil || vol.Secret.SecretName != secretName {
				t.Errorf("volume at the cert dir = %+v, want Secret %q from the Certificate", vol.VolumeSource, secretName)
			}
			dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
			svc := f["webhook-service-name"]
			if want := []string{svc + "." + helmtest.Namespace + ".svc", svc + "." + helmtest.Namespace + ".svc.cluster.local"}; !reflect.DeepEqual(dnsNames, want) {
				t.Errorf("Certificate dnsNames = %v, want %v", dnsNames, want)
			}
			issuer, _, _ := unstructured.NestedStringMap(cert.Object, "spec", "issuerRef")
			issuers := objs.OfKind("Issuer")
			if name == "custom" {
				if len(issuers) != 0 || issuer["name"] != "platform-ca" || issuer["kind"] != "ClusterIssuer" {
					t.Errorf("issuerRef = %v with %d chart Issuers, want the given ClusterIssuer platform-ca and no Issuer", issuer, len(issuers))
				}
				return
			}
			if len(issuers) != 1 || issuer["name"] != issuers[0].GetName() || issuer["kind"] != "Issuer" {
				t.Fatalf("issuerRef = %v, want the chart's Issuer %v", issuer, issuers.Names())
			}
			if _, ok, _ := unstructured.NestedMap(issuers[0].Object, "spec", "selfSigned"); !ok {
				t.Errorf("Issuer %s is not self-signed", issuers[0].GetName())
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func toYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return "\n" + string(b)
}

// TestCustomValues checks that scheduling, image and naming values reach
// the objects.
func TestCustomValues(t *testing.T) {
	t.Parallel()
	objs := helmtest.Manifest(t, "-f", "testdata/values/custom.yaml")
	d := managerDeployment(t, objs)
	c := managerContainer(t, objs)
	spec := &d.Spec.Template.Spec
	if d.Name != "ratelimit-manager" || *d.Spec.Replicas != 3 {
		t.Errorf("Deployment %s with %d replicas, want ratelimit-manager with 3", d.Name, *d.Spec.Replicas)
	}
	if got, want := c.Image, "registry.example.com/floodgate/manager@sha256:4b825dc642cb6eb9a060e54bf8d69288fbee4904aaaaaaaaaaaaaaaaaaaaaaaa"; got != want {
		t.Errorf("image = %q, want the digest %q", got, want)
	}
	if c.ImagePullPolicy != corev1.PullAlways || len(spec.ImagePullSecrets) != 1 {
		t.Errorf("pull policy %s, pull secrets %v", c.ImagePullPolicy, spec.ImagePullSecrets)
	}
	wantFlags(t, flags(t, c.Args), map[string]string{
		"sidecar-image":             "registry.example.com/floodgate/sidecar:0.1.0-rc.1",
		"webhook-port":              "10443",
		"webhook-service-name":      "ratelimit-webhook",
		"mutating-webhook-config":   "platform-floodgate-injector",
		"validating-webhook-config": "platform-floodgate-validator",
		"metrics-secure":            "false",
		"zap-log-level":             "debug",
		"zap-encoder":               "console",
		"policy-concurrency":        "8",
		"enable-http2":              "true",
	})
	if spec.ServiceAccountName != "floodgate-operator" || spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("serviceAccountName %q priorityClassName %q", spec.ServiceAccountName, spec.PriorityClassName)
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" || len(spec.Tolerations) != 1 || spec.Affinity == nil || spec.Affinity.NodeAffinity == nil {
		t.Errorf("scheduling not applied: nodeSelector %v tolerations %v affinity %v", spec.NodeSelector, spec.Tolerations, spec.Affinity)
	}
	if len(spec.TopologySpreadConstraints) != 1 || spec.TopologySpreadConstraints[0].WhenUnsatisfiable != corev1.DoNotSchedule {
		t.Errorf("topologySpreadConstraints = %+v", spec.TopologySpreadConstraints)
	}
	if d.Spec.Template.Labels["tier"] != "control-plane" || d.Labels["team"] != "platform" {
		t.Errorf("podLabels/commonLabels not applied: pod %v deployment %v", d.Spec.Template.Labels, d.Labels)
	}
	var pdb policyv1.PodDisruptionBudget
	fromUnstructured(t, objs.Get(t, "PodDisruptionBudget", "ratelimit-manager"), &pdb)
	if pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromInt32(1) || pdb.Spec.MinAvailable != nil {
		t.Errorf("PDB = %+v, want maxUnavailable 1 only", pdb.Spec)
	}
	if objs.Find("ClusterRole", "ratelimit-metrics-auth") != nil {
		t.Error("metrics auth ClusterRole rendered with metrics.secure false")
	}
	// The manager may patch its own webhook configurations only, by the
	// names the values give them.
	var role rbacv1.ClusterRole
	fromUnstructured(t, objs.Get(t, "ClusterRole", "ratelimit-manager"), &role)
	webhookRules := 0
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, "admissionregistration.k8s.io") {
			webhookRules++
			if !slices.Equal(r.ResourceNames, []string{"platform-floodgate-injector", "platform-floodgate-validator"}) {
				t.Errorf("webhook configuration rule %+v, want it limited to the configured names", r)
			}
		}
	}
	if webhookRules != 1 {
		t.Errorf("%d rules on webhook configurations, want 1", webhookRules)
	}
	if d.Spec.Template.Labels["ratelimit.floodgate.dev/store-client"] != "true" {
		t.Errorf("the manager pods lack the label the stores' NetworkPolicies admit: %v", d.Spec.Template.Labels)
	}
	for _, o := range objs {
		if o.GetLabels()["team"] != "platform" {
			t.Errorf("%s %s lacks the commonLabels", o.GetKind(), o.GetName())
		}
	}
}

// TestSingleReplicaHasNoPDB: a PodDisruptionBudget over one replica would
// block every node drain.
func TestSingleReplicaHasNoPDB(t *testing.T) {
	t.Parallel()
	objs := helmtest.Manifest(t, "--set", "replicaCount=1")
	if pdbs := objs.OfKind("PodDisruptionBudget"); len(pdbs) != 0 {
		t.Errorf("PDB rendered with one replica: %v", pdbs.Names())
	}
	if got := *managerDeployment(t, objs).Spec.Replicas; got != 1 {
		t.Errorf("replicas = %d, want 1", got)
	}
}

// TestDefaultCounterStore checks the CounterStore against the API types
// (strict decoding) and the values.
func TestDefaultCounterStore(t *testing.T) {
	t.Parallel()
	t.Run("managed", func(t *testing.T) {
		t.Parallel()
		objs := helmtest.Manifest(t)
		var cs v1alpha1.CounterStore
		fromUnstructured(t, objs.Get(t, "CounterStore", "default"), &cs)
		if cs.Namespace != "" {
			t.Errorf("CounterStore is cluster-scoped but rendered in namespace %q", cs.Namespace)
		}
		m := cs.Spec.Managed
		if m == nil || cs.Spec.External != nil {
			t.Fatalf("spec = %+v, want managed only", cs.Spec)
		}
		if m.Shards != 3 || m.ReplicasPerShard != 1 || m.Image != "ghcr.io/floodgate-dev/floodgate-redis:0.1.0" || m.PodAntiAffinity != v1alpha1.AntiAffinityPreferred ||
			m.NodeTimeout == nil || m.NodeTimeout.Duration.String() != "5s" || m.MaxMemory == nil || m.MaxMemory.String() != "256Mi" ||
			m.Resources == nil || m.Resources.Limits.Memory().String() != "300Mi" {
			t.Errorf("managed spec = %s", toYAML(t, m))
		}
	})
	t.Run("custom", func(t *testing.T) {
		t.Parallel()
		objs := helmtest.Manifest(t, "-f", "testdata/values/custom.yaml")
		var cs v1alpha1.CounterStore
		fromUnstructured(t, objs.Get(t, "CounterStore", "shared"), &cs)
		m := cs.Spec.Managed
		if m.Shards != 6 || m.ReplicasPerShard != 2 || m.PodAntiAffinity != v1alpha1.AntiAffinityRequired || len(m.Tolerations) != 1 || m.PriorityClassName != "floodgate-store" {
			t.Errorf("managed spec = %s", toYAML(t, m))
		}
	})
	t.Run("external", func(t *testing.T) {
		t.Parallel()
		objs := helmtest.Manifest(t, "-f", "testdata/values/external-store.yaml")
		var cs v1alpha1.CounterStore
		fromUnstructured(t, objs.Get(t, "CounterStore", "default"), &cs)
		e := cs.Spec.External
		if e == nil || cs.Spec.Managed != nil {
			t.Fatalf("spec = %+v, want external only", cs.Spec)
		}
		want := v1alpha1.ExternalStore{
			Addresses:         []v1alpha1.HostPort{"redis-0.redis.data.svc:6379", "redis-1.redis.data.svc:6379"},
			PasswordSecretRef: &v1alpha1.SecretKeySelector{Namespace: "data", Name: "redis-auth", Key: "password"},
			TLS: &v1alpha1.StoreTLS{
				CASecretRef: &v1alpha1.SecretKeySelector{Namespace: "data", Name: "redis-ca", Key: "ca.crt"},
				ServerName:  "redis.data.svc",
			},
		}
		if !reflect.DeepEqual(*e, want) {
			t.Errorf("external spec = %s, want %s", toYAML(t, e), toYAML(t, want))
		}
	})
	t.Run("tls without settings", func(t *testing.T) {
		t.Parallel()
		objs := helmtest.Manifest(t, "--set", "defaultStore.mode=External", "--set", "defaultStore.external.addresses={redis:6379}", "--set", "defaultStore.external.tls.enabled=true")
		var cs v1alpha1.CounterStore
		fromUnstructured(t, objs.Get(t, "CounterStore", "default"), &cs)
		if cs.Spec.External == nil || cs.Spec.External.TLS == nil {
			t.Errorf("external spec = %s, want tls: {} (TLS with the system roots)", toYAML(t, cs.Spec))
		}
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		objs := helmtest.Manifest(t, "-f", "testdata/values/store-off.yaml")
		if got := objs.OfKind("CounterStore"); len(got) != 0 {
			t.Errorf("CounterStore rendered with defaultStore.enabled false: %v", got.Names())
		}
	})
}
