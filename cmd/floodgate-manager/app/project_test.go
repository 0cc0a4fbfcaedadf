package app

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// project is the part of kubebuilder's PROJECT file that describes the
// tree.
type project struct {
	Domain     string   `json:"domain"`
	Layout     []string `json:"layout"`
	MultiGroup bool     `json:"multigroup"`
	Repo       string   `json:"repo"`
	Resources  []struct {
		API *struct {
			CRDVersion string `json:"crdVersion"`
			Namespaced bool   `json:"namespaced"`
		} `json:"api"`
		Controller bool   `json:"controller"`
		Core       bool   `json:"core"`
		Domain     string `json:"domain"`
		Group      string `json:"group"`
		Kind       string `json:"kind"`
		Path       string `json:"path"`
		Version    string `json:"version"`
		Webhooks   *struct {
			Defaulting     bool   `json:"defaulting"`
			DefaultingPath string `json:"defaultingPath"`
			Validation     bool   `json:"validation"`
			ValidationPath string `json:"validationPath"`
			WebhookVersion string `json:"webhookVersion"`
		} `json:"webhooks"`
	} `json:"resources"`
	Version string `json:"version"`
}

// webhookRule is one webhook as the tree has it: its kind, its path, and
// whether it mutates.
type webhookRule struct {
	group, version, resource, path string
	mutating                       bool
}

// TestProjectFile checks that PROJECT describes the tree: the CRDs that
// controller-gen generates into config/crd/bases, the webhooks it
// generates into config/webhook/manifests.yaml, the single-group api/
// layout, and a controller registered for each resource that claims one.
func TestProjectFile(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "..")
	raw, err := os.ReadFile(filepath.Join(root, "PROJECT"))
	if err != nil {
		t.Fatal(err)
	}
	var p project
	if err := yaml.Unmarshal(raw, &p); err != nil {
		t.Fatalf("PROJECT: %v", err)
	}
	if got, want := p.Layout, []string{"go.kubebuilder.io/v4"}; !slices.Equal(got, want) {
		t.Errorf("layout = %v, want %v", got, want)
	}
	if p.MultiGroup {
		t.Error("PROJECT says multigroup; the tree has one group under api/<version>")
	}
	if got, want := p.Repo, "github.com/floodgate-dev/floodgate"; got != want {
		t.Errorf("repo = %q, want the module %q", got, want)
	}

	crds := generatedCRDs(t, root)
	webhooks := generatedWebhooks(t, root)
	controllers := map[string]bool{}
	for _, c := range components {
		controllers[c.name] = true
	}
	seenCRD := map[string]bool{}
	seenWebhook := map[webhookRule]bool{}
	for _, r := range p.Resources {
		group := r.Group
		switch {
		case r.Core && group == "core":
			group = ""
		case !r.Core:
			group += "." + r.Domain
		}
		if r.API != nil {
			crd, ok := crds[r.Kind]
			seenCRD[r.Kind] = true
			switch {
			case !ok:
				t.Errorf("PROJECT has the API %s, but config/crd/bases has no CRD of that kind", r.Kind)
			case crd.Spec.Group != group:
				t.Errorf("%s: group %s in PROJECT, %s in its CRD", r.Kind, group, crd.Spec.Group)
			case !slices.ContainsFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == r.Version }):
				t.Errorf("%s: version %s in PROJECT, not in its CRD", r.Kind, r.Version)
			case r.API.Namespaced != (crd.Spec.Scope == apiextensionsv1.NamespaceScoped):
				t.Errorf("%s: namespaced %v in PROJECT, scope %s in its CRD", r.Kind, r.API.Namespaced, crd.Spec.Scope)
			}
			if want := p.Repo + "/api/" + r.Version; r.Path != want {
				t.Errorf("%s: path %s, want %s (single-group layout)", r.Kind, r.Path, want)
			}
			if _, err := os.Stat(filepath.Join(root, strings.TrimPrefix(r.Path, p.Repo+"/"))); err != nil {
				t.Errorf("%s: path %s: %v", r.Kind, r.Path, err)
			}
		}
		if r.Controller && !controllers[strings.ToLower(r.Kind)] {
			t.Errorf("PROJECT says %s has a controller, but the manager registers none named %q", r.Kind, strings.ToLower(r.Kind))
		}
		if r.Webhooks == nil {
			continue
		}
		resource := plural(strings.ToLower(r.Kind))
		kindPath := strings.ReplaceAll(group, ".", "-") + "-" + r.Version + "-" + strings.ToLower(r.Kind)
		for _, w := range []struct {
			on       bool
			mutating bool
			path     string
			prefix   string
		}{
			{r.Webhooks.Defaulting, true, r.Webhooks.DefaultingPath, "/mutate-"},
			{r.Webhooks.Validation, false, r.Webhooks.ValidationPath, "/validate-"},
		} {
			if !w.on {
				continue
			}
			if w.path == "" {
				w.path = w.prefix + kindPath // kubebuilder's default path
			}
			rule := webhookRule{group: group, version: r.Version, resource: resource, path: w.path, mutating: w.mutating}
			seenWebhook[rule] = true
			if !webhooks[rule] {
				t.Errorf("PROJECT has the webhook %+v, but config/webhook/manifests.yaml does not", rule)
			}
		}
	}
	for kind := range crds {
		if !seenCRD[kind] {
			t.Errorf("config/crd/bases has the CRD %s, which PROJECT does not list", kind)
		}
	}
	for rule := range webhooks {
		if !seenWebhook[rule] {
			t.Errorf("config/webhook/manifests.yaml has the webhook %+v, which PROJECT does not list", rule)
		}
	}
}

// plural is kubebuilder's plural of the resource names floodgate has.
func plural(s string) string {
	if base, ok := strings.CutSuffix(s, "y"); ok {
		return base + "ies"
	}
	return s + "s"
}

// generatedCRDs reads config/crd/bases, by kind.
func generatedCRDs(t *testing.T, root string) map[string]apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v): run make manifests", err)
	}
	out := map[string]apiextensionsv1.CustomResourceDefinition{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[crd.Spec.Names.Kind] = crd
	}
	return out
}

// generatedWebhooks reads the webhooks of config/webhook/manifests.yaml.
func generatedWebhooks(t *testing.T, root string) map[webhookRule]bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "config", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[webhookRule]bool{}
	add := func(mutating bool, path *string, rules []admissionregistrationv1.RuleWithOperations) {
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, v := range r.APIVersions {
					for _, res := range r.Resources {
						out[webhookRule{group: g, version: v, resource: res, path: *path, mutating: mutating}] = true
					}
				}
			}
		}
	}
	for doc := range strings.SplitSeq(string(raw), "\n---") {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("config/webhook/manifests.yaml: %v", err)
		}
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			var c admissionregistrationv1.MutatingWebhookConfiguration
			if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
				t.Fatal(err)
			}
			for _, w := range c.Webhooks {
				add(true, w.ClientConfig.Service.Path, w.Rules)
			}
		case "ValidatingWebhookConfiguration":
			var c admissionregistrationv1.ValidatingWebhookConfiguration
			if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
				t.Fatal(err)
			}
			for _, w := range c.Webhooks {
				add(false, w.ClientConfig.Service.Path, w.Rules)
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("config/webhook/manifests.yaml has no webhook: run make manifests")
	}
	return out
}
