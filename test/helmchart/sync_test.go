package helmchart

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

const syncHint = "run `make manifests` and then hack/sync-chart-crds.sh"

// TestChartCRDsMatchGenerated fails when charts/floodgate/crds differs from
// what controller-gen wrote to config/crd/bases: a changed, missing or
// stale CRD.
func TestChartCRDsMatchGenerated(t *testing.T) {
	t.Parallel()
	root := helmtest.RepoRoot(t)
	gen := filepath.Join(root, "config", "crd", "bases")
	chart := filepath.Join(helmtest.ChartDir(t), "crds")
	generated := yamlFiles(t, gen)
	inChart := yamlFiles(t, chart)
	if len(generated) == 0 {
		t.Fatalf("no CRDs in %s: %s", gen, syncHint)
	}
	for name := range generated {
		want, err := os.ReadFile(filepath.Join(gen, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(chart, name))
		if err != nil {
			t.Errorf("the chart lacks CRD %s: %s", name, syncHint)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("charts/floodgate/crds/%s differs from config/crd/bases/%s: %s", name, name, syncHint)
		}
	}
	for name := range inChart {
		if !generated[name] {
			t.Errorf("charts/floodgate/crds/%s is not generated any more: %s", name, syncHint)
		}
	}
}

func yamlFiles(t *testing.T, dir string) map[string]bool {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]bool, len(matches))
	for _, m := range matches {
		out[filepath.Base(m)] = true
	}
	return out
}

// TestClusterRoleMatchesGenerated checks that the ClusterRoles in the
// rendered chart grant exactly the rules controller-gen generated from the
// +kubebuilder:rbac markers into config/rbac/role.yaml: the manager's, and
// the metrics ones (the reviews behind --metrics-secure, and the scrapers'
// reader role), and that the manager's is bound to the ServiceAccount the
// manager Deployment runs as.
func TestClusterRoleMatchesGenerated(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(helmtest.RepoRoot(t), "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := helmtest.Objects(string(raw))
	if err != nil {
		t.Fatalf("config/rbac/role.yaml: %v", err)
	}
	// The chart's name of each generated ClusterRole.
	chartName := map[string]string{
		"floodgate-manager":              "floodgate-manager",
		"floodgate-manager-metrics-auth": "floodgate-metrics-auth",
		"floodgate-metrics-reader":       "floodgate-metrics-reader",
	}
	wantCluster := map[string][]rbacv1.PolicyRule{}
	var wantNamespaced []rbacv1.PolicyRule
	for _, d := range docs {
		var r rbacv1.ClusterRole // Role has the same rules field
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object, &r); err != nil {
			t.Fatalf("config/rbac/role.yaml: %v", err)
		}
		switch d.GetKind() {
		case "ClusterRole":
			if _, ok := chartName[r.Name]; !ok {
				t.Errorf("config/rbac/role.yaml has a ClusterRole %s that the chart does not render", r.Name)
			}
			wantCluster[r.Name] = append(wantCluster[r.Name], r.Rules...)
		case "Role":
			wantNamespaced = append(wantNamespaced, r.Rules...)
		default:
			t.Fatalf("config/rbac/role.yaml: unexpected kind %s", d.GetKind())
		}
	}

	objs := helmtest.Manifest(t)
	for generated, name := range chartName {
		if len(wantCluster[generated]) == 0 {
			t.Errorf("config/rbac/role.yaml has no rules for the ClusterRole %s", generated)
			continue
		}
		var role rbacv1.ClusterRole
		fromUnstructured(t, objs.Get(t, "ClusterRole", name), &role)
		if !reflect.DeepEqual(role.Rules, wantCluster[generated]) {
			t.Errorf("the chart's ClusterRole %s rules differ from %s in config/rbac/role.yaml (%s):\n got: %+v\nwant: %+v",
				name, generated, syncHint, role.Rules, wantCluster[generated])
		}
	}
	if nsRole := objs.Find("Role", "floodgate-manager"); (nsRole != nil) != (len(wantNamespaced) > 0) {
		t.Errorf("the chart renders a namespaced manager Role: %v; config/rbac/role.yaml has namespaced rules: %v", nsRole != nil, len(wantNamespaced) > 0)
	} else if nsRole != nil {
		var r rbacv1.Role
		fromUnstructured(t, nsRole, &r)
		if !reflect.DeepEqual(r.Rules, wantNamespaced) {
			t.Errorf("the chart's Role floodgate-manager rules differ from config/rbac/role.yaml's Role rules (%s)", syncHint)
		}
	}

	var binding rbacv1.ClusterRoleBinding
	fromUnstructured(t, objs.Get(t, "ClusterRoleBinding", "floodgate-manager"), &binding)
	if got, want := binding.RoleRef, (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "floodgate-manager"}); got != want {
		t.Errorf("ClusterRoleBinding roleRef = %+v, want %+v", got, want)
	}
	sa := managerPodSpec(t, objs).ServiceAccountName
	want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: helmtest.Namespace}}
	if !reflect.DeepEqual(binding.Subjects, want) {
		t.Errorf("ClusterRoleBinding subjects = %+v, want the manager's ServiceAccount %+v", binding.Subjects, want)
	}
	objs.Get(t, "ServiceAccount", sa)
}

// TestChartRoleFileMatchesGenerated checks the chart's copy of the generated
// RBAC, which the ClusterRole template reads.
func TestChartRoleFileMatchesGenerated(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile(filepath.Join(helmtest.RepoRoot(t), "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(helmtest.ChartDir(t), "files", "manager-role.yaml"))
	if err != nil {
		t.Fatalf("%v: %s", err, syncHint)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("charts/floodgate/files/manager-role.yaml differs from config/rbac/role.yaml: %s", syncHint)
	}
}

// TestChartPolicyFilesMatchConfig checks the chart's copies of the
// ValidatingAdmissionPolicies written by hand under config/, which the
// chart's templates read.
func TestChartPolicyFilesMatchConfig(t *testing.T) {
	t.Parallel()
	for src, dst := range map[string]string{
		filepath.Join("config", "rbac", "sidecar_pod_status_policy.yaml"): "sidecar-pod-status-policy.yaml",
		filepath.Join("config", "webhook", "pod_labels_policy.yaml"):      "pod-labels-policy.yaml",
	} {
		want, err := os.ReadFile(filepath.Join(helmtest.RepoRoot(t), src))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(helmtest.ChartDir(t), "files", dst))
		if err != nil {
			t.Errorf("%v: %s", err, syncHint)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("charts/floodgate/files/%s differs from %s: %s", dst, src, syncHint)
		}
	}
}
