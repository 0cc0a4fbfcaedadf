package helmchart

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

// TestDefaultImagesAreWhatMakeImagesBuilds: the chart's default release
// runs exactly the images `make images` writes (hack/images), under the
// names a release publishes: ghcr.io/floodgate-dev/<name> tagged with the
// chart's appVersion, pulled only if not present. The CounterStore API's
// default Redis image is the chart's.
func TestDefaultImagesAreWhatMakeImagesBuilds(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(helmtest.ChartDir(t), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &chart); err != nil {
		t.Fatal(err)
	}
	release := func(name string) string { return "ghcr.io/floodgate-dev/" + name + ":" + chart.AppVersion }

	objs := helmtest.Manifest(t)
	manager := objs.Get(t, "Deployment", "floodgate-manager")
	containers, _, _ := unstructuredSlice(manager.Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("the manager Deployment has %d containers", len(containers))
	}
	c := containers[0].(map[string]any)
	if got, want := c["image"], release("floodgate-manager"); got != want {
		t.Errorf("manager image %v, want %v", got, want)
	}
	if got, want := c["imagePullPolicy"], "IfNotPresent"; got != want {
		t.Errorf("manager pull policy %v, want %v", got, want)
	}
	args, _ := c["args"].([]any)
	found := false
	for _, a := range args {
		found = found || a == "--sidecar-image="+release("floodgate-sidecar")
	}
	if !found {
		t.Errorf("the manager's args %v lack --sidecar-image=%s", args, release("floodgate-sidecar"))
	}
	store := objs.Get(t, "CounterStore", "default")
	managed, _ := store.Object["spec"].(map[string]any)["managed"].(map[string]any)
	if got, want := managed["image"], release("floodgate-redis"); got != want {
		t.Errorf("default store image %v, want %v", got, want)
	}
	if got, want := managed["imagePullPolicy"], "IfNotPresent"; got != want {
		t.Errorf("default store pull policy %v, want %v", got, want)
	}
	if got, want := counterstore.DefaultImage, release("floodgate-redis"); got != want {
		t.Errorf("the CounterStore API's default image %s, want %s", got, want)
	}
}

func unstructuredSlice(obj map[string]any, path ...string) ([]any, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[p]
	}
	s, ok := cur.([]any)
	return s, ok, nil
}
