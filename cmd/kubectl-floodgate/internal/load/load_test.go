package load

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseManifests(t *testing.T) {
	t.Parallel()
	docs, err := Parse("f.yaml", []byte(`---
# an empty document and comments are skipped
---
apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: a, namespace: shop}
---
apiVersion: v1
kind: List
items:
- apiVersion: ratelimit.floodgate.dev/v1alpha1
  kind: CounterStore
  metadata: {name: default}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range docs {
		got = append(got, d.Where()+" "+d.GVK.Kind+"/"+d.Name+" ns="+d.Namespace)
	}
	want := []string{"f.yaml RateLimitPolicy/a ns=shop", "f.yaml (document 2) CounterStore/default ns=", "f.yaml (document 2) Deployment/web ns="}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("docs %q, want %q", got, want)
	}
	if !strings.Contains(string(docs[0].JSON), `"kind":"RateLimitPolicy"`) {
		t.Errorf("JSON of the first document: %s", docs[0].JSON)
	}
}

func TestParseConfigs(t *testing.T) {
	t.Parallel()
	sidecar := "apiVersion: floodgate.dev/sidecar-config/v1\npolicies: []\n"
	envoy := "domain: edge\ndescriptors:\n- key: remote_address\n  rate_limit: {unit: second, requests_per_unit: 5}\n---\ndomain: other\n"
	for data, want := range map[string]Format{sidecar: SidecarConfig, envoy: EnvoyConfig} {
		docs, err := Parse("c.yaml", []byte(data))
		if err != nil {
			t.Fatal(err)
		}
		if len(docs) != 1 || docs[0].Format != want || string(docs[0].Data) != data {
			t.Errorf("Parse(%q) = %+v, want one %v document holding the whole file", data, docs, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for data, want := range map[string]string{
		"kind: RateLimitPolicy\nmetadata: {name: a}\n": `error validating "f.yaml": error validating data: [apiVersion not set]`,
		"apiVersion: v1\n": "[kind not set]",
		"a: [b\n":          "error parsing f.yaml: error converting YAML to JSON",
		"- 1\n- 2\n":       "document 1 is not an object",
	} {
		_, err := Parse("f.yaml", []byte(data))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) error %v, want one containing %q", data, err, want)
		}
	}
}

func TestReadDirectoriesAndStdin(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, data := range map[string]string{
		"b.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n",
		"a.json": `{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}`,
		"c.txt":  "not read",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	docs, err := Read([]string{dir, "-"}, strings.NewReader("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range docs {
		names = append(names, filepath.Base(d.Source)+":"+d.Name)
	}
	if got, want := strings.Join(names, ","), "a.json:a,b.yaml:b,STDIN:s"; got != want {
		t.Errorf("read %s, want %s", got, want)
	}
	if _, err := Read([]string{filepath.Join(dir, "nope.yaml")}, nil); err == nil {
		t.Error("a missing file was read")
	}
}
