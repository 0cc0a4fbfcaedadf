package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// plugin is the part of krew's Plugin manifest (v1alpha2) that the
// release relies on.
type plugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Caveats          string `json:"caveats"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			Sha256 string `json:"sha256"`
			Bin    string `json:"bin"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

// TestKrewManifest renders the manifest template as hack/plugin-release.sh
// does and checks it against what the script builds: one platform per
// archive, each naming its archive, its sha256 and the binary in it.
func TestKrewManifest(t *testing.T) {
	t.Parallel()
	tmpl, err := os.ReadFile(filepath.Join("krew", "floodgate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join("..", "..", "hack", "plugin-release.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`PLATFORMS=\(([^)]*)\)`).FindSubmatch(script)
	if m == nil {
		t.Fatal("hack/plugin-release.sh has no PLATFORMS list")
	}
	platforms := strings.Fields(string(m[1]))
	const version = "v1.2.3"
	rendered := strings.ReplaceAll(string(tmpl), "${VERSION}", version)
	sums := map[string]string{}
	for i, p := range platforms {
		os, arch, _ := strings.Cut(p, "/")
		sum := strings.Repeat(string(rune('a'+i)), 64)
		sums[p] = sum
		rendered = strings.ReplaceAll(rendered, "${SHA256_"+os+"_"+arch+"}", sum)
	}
	if strings.Contains(rendered, "${") {
		t.Fatalf("placeholders the script does not fill:\n%s", rendered)
	}
	var pl plugin
	if err := yaml.UnmarshalStrict([]byte(rendered), &pl); err != nil {
		t.Fatal(err)
	}
	if pl.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || pl.Kind != "Plugin" || pl.Metadata.Name != "floodgate" {
		t.Errorf("apiVersion %q, kind %q, name %q", pl.APIVersion, pl.Kind, pl.Metadata.Name)
	}
	if pl.Spec.Version != version || pl.Spec.Homepage == "" || pl.Spec.ShortDescription == "" || pl.Spec.Description == "" {
		t.Errorf("spec is missing its version, homepage or descriptions: %+v", pl.Spec)
	}
	if got, want := len(pl.Spec.Platforms), len(platforms); got != want {
		t.Fatalf("%d platforms in the manifest, the script builds %d", got, want)
	}
	seen := map[string]bool{}
	for _, p := range pl.Spec.Platforms {
		key := p.Selector.MatchLabels["os"] + "/" + p.Selector.MatchLabels["arch"]
		if seen[key] {
			t.Errorf("platform %s twice", key)
		}
		seen[key] = true
		sum, ok := sums[key]
		if !ok {
			t.Errorf("platform %s is not one the script builds", key)
			continue
		}
		os, arch, _ := strings.Cut(key, "/")
		archive := "kubectl-floodgate_" + version + "_" + os + "_" + arch + ".tar.gz"
		if want := "https://github.com/floodgate-dev/floodgate/releases/download/" + version + "/" + archive; p.URI != want {
			t.Errorf("%s: uri %q, want %q", key, p.URI, want)
		}
		if p.Sha256 != sum {
			t.Errorf("%s: sha256 %q, want the archive's", key, p.Sha256)
		}
		bin := "kubectl-floodgate"
		if os == "windows" {
			bin += ".exe"
		}
		if p.Bin != bin {
			t.Errorf("%s: bin %q, want %q", key, p.Bin, bin)
		}
		var froms []string
		for _, f := range p.Files {
			froms = append(froms, f.From)
		}
		if strings.Join(froms, ",") != bin+",LICENSE" {
			t.Errorf("%s: files %v, want the archive's %s and LICENSE", key, froms, bin)
		}
	}
}
