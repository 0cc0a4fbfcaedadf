package managerflags

import (
	"flag"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/floodgate-dev/floodgate/cmd/floodgate-manager/app"
	"github.com/floodgate-dev/floodgate/controllers/rlsidentity"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/runner"
	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

func convert(t *testing.T, s helmtest.Set, kind, name string, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(s.Get(t, kind, name).Object, into); err != nil {
		t.Fatal(err)
	}
}

// TestRateLimitServiceFollowsContract renders the chart with
// rateLimitService.enabled and checks the central rate-limit service: the
// sidecar binary accepts its command line and environment as Kubernetes
// mode watching floodgate-ratelimit-policies with the gRPC API on; its
// pods carry the label the manager reads them by; its Service and
// PodDisruptionBudget select them; its Role reads only its ConfigMap; and
// the manager runs with --ratelimit-service.
func TestRateLimitServiceFollowsContract(t *testing.T) {
	t.Parallel()
	s := helmtest.Manifest(t, "-f", filepath.Join(helmtest.RepoRoot(t), "test", "helmchart", "testdata", "values", "ratelimit-service.yaml"))
	const name = "floodgate-ratelimit"

	var d appsv1.Deployment
	convert(t, s, "Deployment", name, &d)
	if got, want := *d.Spec.Replicas, int32(3); got != want {
		t.Errorf("replicas = %d, want %d", got, want)
	}
	pod := d.Spec.Template
	if got := pod.Labels[config.RateLimitServicePodLabel]; got != "true" {
		t.Errorf("pod label %s = %q, want \"true\" (the manager finds the replicas by it)", config.RateLimitServicePodLabel, got)
	}
	c := pod.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = "floodgate-ratelimit-0"
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env[e.Name] = "floodgate-system"
		}
	}
	// The downward API file of the pod's labels, written where the test
	// can: the only argument moved.
	labelsFile := filepath.Join(t.TempDir(), "labels")
	if err := os.WriteFile(labelsFile, []byte(config.RateLimitServicePodLabel+"=\"true\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := slices.Clone(c.Args)
	moved := false
	for i, a := range args {
		if strings.HasPrefix(a, "--pod-labels-file=") {
			if got, want := a, "--pod-labels-file="+config.LabelsFile; got != want {
				t.Errorf("arg %q, want %q (the downward API volume's file)", got, want)
			}
			args[i], moved = "--pod-labels-file="+labelsFile, true
		}
	}
	if !moved {
		t.Errorf("no --pod-labels-file in %q", args)
	}
	var rc runner.Config
	fs := flag.NewFlagSet("floodgate-sidecar", flag.ContinueOnError)
	if err := rc.Parse(fs, args, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatalf("floodgate-sidecar refuses the chart's args %q: %v", c.Args, err)
	}
	if err := rc.Validate(); err != nil {
		t.Errorf("floodgate-sidecar refuses the chart's config: %v", err)
	}
	if !rc.Kubernetes || rc.ConfigMapName != config.RateLimitServiceConfigMapName || rc.GRPCListen != ":8082" || !rc.GRPCResponseHeaders {
		t.Errorf("kubernetes %v, configmap %q, grpc %q, response headers %v; want Kubernetes mode on %s, gRPC on :8082 with response headers",
			rc.Kubernetes, rc.ConfigMapName, rc.GRPCListen, rc.GRPCResponseHeaders, config.RateLimitServiceConfigMapName)
	}
	if c.ReadinessProbe == nil || c.LivenessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes: readiness %v, liveness %v; want /readyz and /healthz on the admin port", c.ReadinessProbe, c.LivenessProbe)
	}

	podLabels := labels.Set(pod.Labels)
	var svc corev1.Service
	convert(t, s, "Service", name, &svc)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, pod.Labels)
	}
	if i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "grpc" }); i < 0 || svc.Spec.Ports[i].Port != 8082 {
		t.Errorf("Service ports %v, want grpc on 8082", svc.Spec.Ports)
	}
	var pdb policyv1.PodDisruptionBudget
	convert(t, s, "PodDisruptionBudget", name, &pdb)
	if sel := labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels); !sel.Matches(podLabels) {
		t.Errorf("PodDisruptionBudget selector %v does not select the pods", pdb.Spec.Selector)
	}
	var role rbacv1.Role
	convert(t, s, "Role", name, &role)
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "configmaps") && !slices.Equal(r.ResourceNames, []string{config.RateLimitServiceConfigMapName}) {
			t.Errorf("Role reads ConfigMaps %v, want only %s", r.ResourceNames, config.RateLimitServiceConfigMapName)
		}
	}
	if pod.Spec.ServiceAccountName != name {
		t.Errorf("serviceAccountName %q, want %q (bound to the Role)", pod.Spec.ServiceAccountName, name)
	}

	var mgr appsv1.Deployment
	convert(t, s, "Deployment", "floodgate-manager", &mgr)
	if !slices.Contains(mgr.Spec.Template.Spec.Containers[0].Args, "--ratelimit-service") {
		t.Errorf("the manager runs without --ratelimit-service: %q", mgr.Spec.Template.Spec.Containers[0].Args)
	}

	// mTLS, on by default: the replicas serve the manager's serving
	// certificate from its Secret, and accept its CA's client
	// certificates; the manager keeps them, and a client certificate for
	// each listed gateway.
	files := map[string]string{}
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name != m.Name || v.Secret == nil || v.Secret.SecretName != rlsidentity.ServingSecretName {
				continue
			}
			if v.Secret.Optional != nil && *v.Secret.Optional {
				t.Errorf("the serving certificate's volume is optional: a replica would start without authenticating its callers")
			}
			for _, it := range v.Secret.Items {
				files[path.Join(m.MountPath, it.Path)] = it.Key
			}
		}
	}
	for file, want := range map[string]string{rc.GRPCTLSCertFile: rlsidentity.KeyTLSCert, rc.GRPCTLSKeyFile: rlsidentity.KeyTLSKey, rc.GRPCClientCAFile: rlsidentity.KeyCACert} {
		if file == "" || files[file] != want {
			t.Errorf("gRPC TLS file %q is not key %s of Secret %s (mounted: %v)", file, want, rlsidentity.ServingSecretName, files)
		}
	}
	o := app.DefaultOptions()
	fs = flag.NewFlagSet(app.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.BindFlags(fs)
	if err := fs.Parse(mgr.Spec.Template.Spec.Containers[0].Args); err != nil {
		t.Fatal(err)
	}
	if !o.RateLimitServiceTLS || o.RateLimitGateways.String() != "shop/public,shop/eg=envoy-gateway-system" {
		t.Errorf("manager: --ratelimit-service-tls %v, --ratelimit-gateways %q; want on, with the values' two gateways",
			o.RateLimitServiceTLS, o.RateLimitGateways.String())
	}

	// Off, the replicas are plaintext, and the manager keeps nothing.
	plain := helmtest.Manifest(t, "-f", filepath.Join(helmtest.RepoRoot(t), "test", "helmchart", "testdata", "values", "ratelimit-service.yaml"),
		"--set", "rateLimitService.mtls.enabled=false", "--set", "rateLimitService.gateways=null")
	convert(t, plain, "Deployment", name, &d)
	convert(t, plain, "Deployment", "floodgate-manager", &mgr)
	for _, a := range slices.Concat(d.Spec.Template.Spec.Containers[0].Args, mgr.Spec.Template.Spec.Containers[0].Args) {
		if strings.Contains(a, "tls") || strings.Contains(a, "ratelimit-gateways") {
			t.Errorf("with mtls.enabled=false: argument %q", a)
		}
	}
	// Gateways without mTLS would get nothing: refused.
	r := helmtest.Run(t, helmtest.TemplateArgs(t, "--set", "rateLimitService.enabled=true", "--set", "rateLimitService.mtls.enabled=false",
		"--set", "rateLimitService.gateways[0].namespace=shop", "--set", "rateLimitService.gateways[0].name=public")...)
	if r.Err == nil || !strings.Contains(r.Err.Error(), "rateLimitService.gateways needs rateLimitService.mtls.enabled") {
		t.Errorf("gateways without mTLS: %v, want the chart to refuse", r.Err)
	}
}

// TestApplyGatewayConfigFollowsContract renders the chart with
// rateLimitService.applyGatewayConfig on and off: on, the manager runs
// with --apply-gateway-config and the values' classes, which it accepts,
// and a ClusterRole grants exactly the kinds it applies and the
// GatewayClasses it reads; off, neither the flag nor the grant exists.
func TestApplyGatewayConfigFollowsContract(t *testing.T) {
	t.Parallel()
	values := filepath.Join(helmtest.RepoRoot(t), "test", "helmchart", "testdata", "values", "ratelimit-service.yaml")
	const role = "floodgate-gateway-config"

	off := helmtest.Manifest(t, "-f", values)
	if off.Find("ClusterRole", role) != nil || off.Find("ClusterRoleBinding", role) != nil {
		t.Errorf("ClusterRole %s rendered with applyGatewayConfig off", role)
	}
	var mgr appsv1.Deployment
	convert(t, off, "Deployment", "floodgate-manager", &mgr)
	for _, a := range mgr.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--apply-gateway") {
			t.Errorf("with applyGatewayConfig off: argument %q", a)
		}
	}

	on := helmtest.Manifest(t, "-f", values, "--set", "rateLimitService.applyGatewayConfig.enabled=true",
		"--set", "rateLimitService.applyGatewayConfig.gatewayClasses={istio,eg}")
	convert(t, on, "Deployment", "floodgate-manager", &mgr)
	o := app.DefaultOptions()
	fs := flag.NewFlagSet(app.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.BindFlags(fs)
	if err := fs.Parse(mgr.Spec.Template.Spec.Containers[0].Args); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("the manager refuses the chart's flags: %v", err)
	}
	if !o.ApplyGatewayConfig || !slices.Equal(o.ApplyGatewayClasses, []string{"istio", "eg"}) {
		t.Errorf("manager: --apply-gateway-config %v, --apply-gateway-classes %q; want on, with istio and eg", o.ApplyGatewayConfig, o.ApplyGatewayClasses)
	}
	var cr rbacv1.ClusterRole
	convert(t, on, "ClusterRole", role, &cr)
	granted := map[string][]string{}
	for _, r := range cr.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				granted[g+"/"+res] = r.Verbs
			}
		}
	}
	write := []string{"get", "list", "watch", "create", "patch", "delete"}
	want := map[string][]string{
		"gateway.networking.k8s.io/gatewayclasses": {"get", "list", "watch"},
		"networking.istio.io/envoyfilters":         write,
		"gateway.envoyproxy.io/envoypatchpolicies": write,
	}
	if len(granted) != len(want) {
		t.Errorf("ClusterRole %s grants %v, want %v", role, granted, want)
	}
	for res, verbs := range want {
		if !slices.Equal(granted[res], verbs) {
			t.Errorf("ClusterRole %s: %s verbs %v, want %v", role, res, granted[res], verbs)
		}
	}
	var crb rbacv1.ClusterRoleBinding
	convert(t, on, "ClusterRoleBinding", role, &crb)
	if crb.RoleRef.Name != role || len(crb.Subjects) != 1 || crb.Subjects[0].Name != mgr.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("ClusterRoleBinding %s binds %v to %v, want the manager's ServiceAccount %s", role, crb.RoleRef, crb.Subjects, mgr.Spec.Template.Spec.ServiceAccountName)
	}

	// Without the central service there is nothing to point gateways at.
	r := helmtest.Run(t, helmtest.TemplateArgs(t, "--set", "rateLimitService.applyGatewayConfig.enabled=true")...)
	if r.Err == nil || !strings.Contains(r.Err.Error(), "rateLimitService.applyGatewayConfig needs rateLimitService.enabled") {
		t.Errorf("applyGatewayConfig without the service: %v, want the chart to refuse", r.Err)
	}
}
