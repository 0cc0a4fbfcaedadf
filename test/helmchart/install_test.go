package helmchart

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
	"github.com/floodgate-dev/floodgate/test/kubetest"
)

// installTimeoutSeconds is the webhook timeout the install test sets: no
// manager runs on envtest, so every call to a webhook fails, and a short
// timeout keeps those failures quick.
const installTimeoutSeconds = "3"

// TestInstallOnEnvtest installs the chart with the real helm into envtest's
// real kube-apiserver, with the CRDs coming from the chart's crds/
// directory, and checks that everything is created, that the webhook
// configurations behave as the contract says while no manager answers
// them, that an upgrade to cert-manager and monitoring works, and that an
// uninstall removes the release's objects and keeps the CRDs.
//
// envtest runs no controllers, so no pod ever starts: the release is
// installed without --wait and checked object by object. cert-manager and
// Prometheus Operator are stood in for by CRDs with their kinds and open
// schemas (testdata/crds).
func TestInstallOnEnvtest(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is unset: run the tests with `make test`, which builds the envtest binaries")
	}
	helmtest.Binary(t) // fail early and clearly without helm
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("testdata", "crds")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := kubetest.NewKubectl(env, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	chart := helmtest.ChartDir(t)
	kube := []string{"--kubeconfig", kubectl.Kubeconfig, "--namespace", helmtest.Namespace}
	installValues := []string{"--set", "webhook.timeoutSeconds=" + installTimeoutSeconds}

	// Install.
	install := helmtest.MustRun(t, append(append([]string{"install", helmtest.Release, chart, "--create-namespace", "--timeout", "2m"}, kube...), installValues...)...)
	assertNotes(t, install.Stdout,
		"kubectl -n floodgate-system rollout status deployment/floodgate-manager",
		"(Secret\n   floodgate-system/floodgate-webhook-cert)",
		"floodgate-sidecar-injector and floodgate-policy-validator",
		"kubectl get counterstore default",
		"Pods in kube-system, kube-public, kube-node-lease, floodgate-system are never injected.")
	status := helmtest.MustRun(t, append([]string{"status", helmtest.Release, "-o", "json"}, kube...)...)
	var st struct {
		Info struct {
			Status string `json:"status"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(status.Stdout), &st); err != nil || st.Info.Status != "deployed" {
		t.Fatalf("helm status = %q (%v), want deployed:\n%s", st.Info.Status, err, status.Stdout)
	}

	t.Run("CRDs from crds/ are established", func(t *testing.T) {
		for _, name := range []string{"counterstores.ratelimit.floodgate.dev", "ratelimitpolicies.ratelimit.floodgate.dev", "clusterratelimitpolicies.ratelimit.floodgate.dev"} {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
				t.Errorf("CRD %s: %v", name, err)
				continue
			}
			if !crdEstablished(&crd) {
				t.Errorf("CRD %s is not Established: %+v", name, crd.Status.Conditions)
			}
		}
	})

	rendered := helmtest.Manifest(t, installValues...)
	t.Run("every rendered object exists", func(t *testing.T) {
		assertLive(ctx, t, c, rendered)
		for _, kind := range []string{"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
			"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
			"PodDisruptionBudget", "CounterStore"} {
			if len(rendered.OfKind(kind)) == 0 {
				t.Errorf("the default install renders no %s", kind)
			}
		}
	})

	t.Run("the default CounterStore passes the CRD's validation", func(t *testing.T) {
		var cs v1alpha1.CounterStore
		if err := c.Get(ctx, client.ObjectKey{Name: "default"}, &cs); err != nil {
			t.Fatal(err)
		}
		if m := cs.Spec.Managed; m == nil || m.Shards != 3 || m.ReplicasPerShard != 1 || m.Image != "ghcr.io/floodgate-dev/floodgate-redis:0.1.0" {
			t.Errorf("stored spec = %+v", cs.Spec)
		}
	})

	t.Run("webhooks while no manager answers", func(t *testing.T) {
		app := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
		if err := c.Create(ctx, app); err != nil {
			t.Fatal(err)
		}
		for _, ns := range []string{"shop", helmtest.Namespace} {
			// No controller-manager creates the default ServiceAccount.
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
			if err := c.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
		// The API server calls a webhook once its own informer has the
		// configuration helm created, a moment after helm returned: wait,
		// with a dry run of what the injector intercepts, until it is in
		// force, so that what the pods below show is the configuration's
		// doing.
		waitIntercepted(ctx, t, `failed calling webhook "inject.floodgate.dev"`, func() error {
			return c.Create(ctx, testPod("shop", "probe", map[string]string{"floodgate.dev/inject": "true"}), client.DryRunAll)
		})
		// A pod that did not opt in never reaches the webhook
		// (matchConditions), so the outage does not block it.
		if err := c.Create(ctx, testPod("shop", "plain", nil)); err != nil {
			t.Errorf("a pod without floodgate.dev/inject was not admitted: %v", err)
		}
		if err := c.Create(ctx, testPod("shop", "opted-out", map[string]string{"floodgate.dev/inject": "false"})); err != nil {
			t.Errorf("a pod with floodgate.dev/inject=false was not admitted: %v", err)
		}
		// An opted-in pod is refused rather than run without its sidecar
		// (failurePolicy Fail).
		err := c.Create(ctx, testPod("shop", "opted-in", map[string]string{"floodgate.dev/inject": "true"}))
		if err == nil || !strings.Contains(err.Error(), `failed calling webhook "inject.floodgate.dev"`) {
			t.Errorf("an opted-in pod with no injector answering: err = %v, want a failed call to inject.floodgate.dev", err)
		}
		// The operator's own namespace is never injected.
		if err := c.Create(ctx, testPod(helmtest.Namespace, "opted-in", map[string]string{"floodgate.dev/inject": "true"})); err != nil {
			t.Errorf("an opted-in pod in %s reached the injector: %v", helmtest.Namespace, err)
		}
		// RateLimitPolicies go through the validating webhook.
		policy := &v1alpha1.RateLimitPolicy{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(map[string]any{
			"apiVersion": "ratelimit.floodgate.dev/v1alpha1", "kind": "RateLimitPolicy",
			"metadata": map[string]any{"name": "checkout", "namespace": "shop"},
			"spec": map[string]any{
				// Every pod. From Go, an empty selector needs a non-nil
				// MatchLabels: a zero LabelSelector is omitted, and a
				// policy must name a podSelector or a targetRef.
				"podSelector": map[string]any{"matchLabels": map[string]any{}},
				"rules": []any{map[string]any{
					"name": "per-client", "key": []any{map[string]any{"clientIP": map[string]any{}}},
					"limit": map[string]any{"requests": int64(10), "per": "1s"},
				}},
			},
		}, policy); err != nil {
			t.Fatal(err)
		}
		waitIntercepted(ctx, t, `failed calling webhook "validate.ratelimitpolicy.floodgate.dev"`, func() error {
			return c.Create(ctx, policy.DeepCopy(), client.DryRunAll)
		})
		err = c.Create(ctx, policy)
		if err == nil || !strings.Contains(err.Error(), `failed calling webhook "validate.ratelimitpolicy.floodgate.dev"`) {
			t.Errorf("a RateLimitPolicy with no validator answering: err = %v, want a failed call to validate.ratelimitpolicy.floodgate.dev", err)
		}
	})

	t.Run("labels a store's NetworkPolicy trusts are floodgate's only", func(t *testing.T) {
		// The policy reads the injector's configuration, which names
		// the release namespace as the manager's (its Service's) and
		// leaves out the namespaces the chart excludes.
		labelled := func(ns, name, label string) *corev1.Pod {
			pod := testPod(ns, name, nil)
			pod.Labels = map[string]string{label: "true"}
			return pod
		}
		waitIntercepted(ctx, t, "label floodgate.dev/injected is set only by floodgate's sidecar injector", func() error {
			return c.Create(ctx, labelled("shop", "forged", "floodgate.dev/injected"), client.DryRunAll)
		})
		err := c.Create(ctx, labelled("shop", "forged", "floodgate.dev/injected"))
		if err == nil || !strings.Contains(err.Error(), `the pod does not ask for injection (annotation floodgate.dev/inject: "true")`) {
			t.Errorf("a pod that labels itself floodgate.dev/injected: err = %v, want it refused, naming the label and why", err)
		}
		waitIntercepted(ctx, t, "label ratelimit.floodgate.dev/store-client is set only on floodgate's own pods", func() error {
			return c.Create(ctx, labelled("shop", "client", "ratelimit.floodgate.dev/store-client"), client.DryRunAll)
		})
		err = c.Create(ctx, labelled("shop", "client", "ratelimit.floodgate.dev/store-client"))
		if err == nil || !strings.Contains(err.Error(), "in the manager's namespace "+helmtest.Namespace+", and") {
			t.Errorf("a pod labelled store-client in shop: err = %v, want it refused, naming the label and the release namespace", err)
		}
		if err := c.Create(ctx, labelled(helmtest.Namespace, "client", "ratelimit.floodgate.dev/store-client")); err != nil {
			t.Errorf("a pod labelled store-client in the release namespace, as the manager's: %v", err)
		}
		// kubectl label on a running pod is an UPDATE.
		plain := &corev1.Pod{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "plain"}, plain); err != nil {
			t.Fatal(err)
		}
		patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"floodgate.dev/injected":"true"}}}`))
		err = c.Patch(ctx, plain, patch)
		if err == nil || !strings.Contains(err.Error(), "label floodgate.dev/injected cannot be added to or changed on an existing pod") {
			t.Errorf("labelling a running pod floodgate.dev/injected: err = %v, want it refused", err)
		}
	})

	// Upgrade to cert-manager and every monitoring object.
	upgradeValues := append([]string{"-f", filepath.Join("testdata", "values", "cert-manager.yaml"),
		"-f", filepath.Join("testdata", "values", "monitoring.yaml"),
		"--set", "monitoring.dashboard.namespace=", "--set", "replicaCount=3"}, installValues...)
	t.Run("upgrade to cert-manager and monitoring", func(t *testing.T) {
		upgrade := helmtest.MustRun(t, append(append([]string{"upgrade", helmtest.Release, chart, "--timeout", "2m"}, kube...), upgradeValues...)...)
		assertNotes(t, upgrade.Stdout,
			"kubectl -n floodgate-system get certificate floodgate-webhook",
			"PodMonitor floodgate-sidecars scrapes the fg-admin port",
			"Bind the ClusterRole floodgate-metrics-reader to Prometheus's ServiceAccount.",
			"PrometheusRule floodgate holds the floodgate alerts.",
			"ConfigMap floodgate-system/floodgate-dashboard holds the Grafana dashboard.")
		upgraded := helmtest.Manifest(t, upgradeValues...)
		assertLive(ctx, t, c, upgraded)
		for _, kind := range []string{"Certificate", "Issuer", "PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap"} {
			if len(upgraded.OfKind(kind)) == 0 {
				t.Errorf("the upgrade renders no %s", kind)
			}
		}
		var d appsv1.Deployment
		if err := c.Get(ctx, client.ObjectKey{Namespace: helmtest.Namespace, Name: "floodgate-manager"}, &d); err != nil {
			t.Fatal(err)
		}
		if got := *d.Spec.Replicas; got != 3 {
			t.Errorf("replicas after the upgrade = %d, want 3", got)
		}
		args := flags(t, d.Spec.Template.Spec.Containers[0].Args)
		if args["webhook-cert-mode"] != "external" {
			t.Errorf("--webhook-cert-mode after the upgrade = %q, want external", args["webhook-cert-mode"])
		}
		mwc := &unstructured.Unstructured{}
		mwc.SetAPIVersion("admissionregistration.k8s.io/v1")
		mwc.SetKind("MutatingWebhookConfiguration")
		if err := c.Get(ctx, client.ObjectKey{Name: "floodgate-sidecar-injector"}, mwc); err != nil {
			t.Fatal(err)
		}
		if got, want := mwc.GetAnnotations()["cert-manager.io/inject-ca-from"], helmtest.Namespace+"/floodgate-webhook"; got != want {
			t.Errorf("inject-ca-from after the upgrade = %q, want %q", got, want)
		}
	})

	t.Run("uninstall removes the release and keeps the CRDs", func(t *testing.T) {
		helmtest.MustRun(t, append([]string{"uninstall", helmtest.Release, "--wait", "--timeout", "2m"}, kube...)...)
		upgraded := helmtest.Manifest(t, upgradeValues...)
		for _, o := range upgraded {
			live := &unstructured.Unstructured{}
			live.SetGroupVersionKind(o.GroupVersionKind())
			err := c.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetName()}, live)
			if !apierrors.IsNotFound(err) {
				t.Errorf("%s %s/%s after uninstall: err = %v, want NotFound", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		}
		var crds apiextensionsv1.CustomResourceDefinitionList
		if err := c.List(ctx, &crds); err != nil {
			t.Fatal(err)
		}
		kept := map[string]bool{}
		for _, crd := range crds.Items {
			kept[crd.Name] = true
		}
		for _, name := range []string{"counterstores.ratelimit.floodgate.dev", "ratelimitpolicies.ratelimit.floodgate.dev", "clusterratelimitpolicies.ratelimit.floodgate.dev"} {
			if !kept[name] {
				t.Errorf("CRD %s was removed by helm uninstall; helm keeps crds/ CRDs so that stored policies survive", name)
			}
		}
	})
}

// waitIntercepted waits until create, a dry run, fails with want: the
// API server calls the webhook of a configuration only once its informer
// has the configuration, some time after it was created.
func waitIntercepted(ctx context.Context, t *testing.T, want string, create func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		last = create()
		return last != nil && strings.Contains(last.Error(), want), nil
	})
	if err != nil {
		t.Fatalf("waiting for the API server to call the webhook (%s): %v; last answer: %v", want, err, last)
	}
}

// assertNotes checks that helm printed the chart's NOTES.txt with the
// given lines (a "\n" in want matches a line break and the indentation).
func assertNotes(t *testing.T, out string, want ...string) {
	t.Helper()
	_, notes, ok := strings.Cut(out, "NOTES:\n")
	if !ok {
		t.Errorf("helm printed no NOTES:\n%s", out)
		return
	}
	for _, w := range want {
		if !strings.Contains(notes, w) {
			t.Errorf("NOTES lack %q:\n%s", w, notes)
		}
	}
}

func crdEstablished(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// assertLive checks that every object of the rendered release exists in the
// API server with the rendered labels and the release's owner annotations.
func assertLive(ctx context.Context, t *testing.T, c client.Client, rendered helmtest.Set) {
	t.Helper()
	for _, o := range rendered {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(o.GroupVersionKind())
		key := client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetName()}
		if err := c.Get(ctx, key, live); err != nil {
			t.Errorf("%s %s: %v", o.GetKind(), key, err)
			continue
		}
		if got := live.GetAnnotations()["meta.helm.sh/release-name"]; got != helmtest.Release {
			t.Errorf("%s %s belongs to release %q, want %q", o.GetKind(), key, got, helmtest.Release)
		}
		for k, v := range o.GetLabels() {
			if live.GetLabels()[k] != v {
				t.Errorf("%s %s label %s = %q, want %q", o.GetKind(), key, k, live.GetLabels()[k], v)
			}
		}
		// The manager's args are what the whole contract hangs on.
		if o.GetKind() == "Deployment" {
			want, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			got, _, _ := unstructured.NestedSlice(live.Object, "spec", "template", "spec", "containers")
			if len(got) != len(want) || !reflect.DeepEqual(got[0].(map[string]any)["args"], want[0].(map[string]any)["args"]) {
				t.Errorf("live Deployment %s containers differ from the rendered ones", key)
			}
		}
	}
}

func testPod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "app", Image: "registry.example.com/app:1"}},
		},
	}
}
