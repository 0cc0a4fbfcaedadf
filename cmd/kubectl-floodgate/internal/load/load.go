// Package load reads the files kubectl floodgate is given: Kubernetes
// manifests (floodgate's RateLimitPolicies and CounterStores among other
// objects, several documents per file, v1 Lists expanded, as kubectl apply
// -f reads them), floodgate sidecar configs and envoyproxy/ratelimit
// configs.
package load

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
)

// Format is what a document is.
type Format int

// The formats.
const (
	// Manifest is a Kubernetes object (apiVersion and kind).
	Manifest Format = iota + 1
	// SidecarConfig is a floodgate sidecar config (apiVersion
	// floodgate.dev/sidecar-config/v1), the whole file.
	SidecarConfig
	// EnvoyConfig is an envoyproxy/ratelimit config, the whole file (one
	// domain per YAML document).
	EnvoyConfig
)

// String names the format.
func (f Format) String() string {
	switch f {
	case Manifest:
		return "Kubernetes manifest"
	case SidecarConfig:
		return "floodgate sidecar config"
	case EnvoyConfig:
		return "envoyproxy/ratelimit config"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Stdin is the source name of standard input, as kubectl names it.
const Stdin = "STDIN"

// Doc is one unit of input.
type Doc struct {
	// Source is the file it came from, or Stdin.
	Source string
	// Index is the document's position in its source, from 1; a List's
	// items share their List's index.
	Index  int
	Format Format
	// GVK, Name and Namespace identify a Manifest.
	GVK             schema.GroupVersionKind
	Name, Namespace string
	// JSON is a Manifest as JSON; Data is a config's bytes as written.
	JSON []byte
	Data []byte
}

// Where names the document for messages: the source, and the document's
// index when the source has several.
func (d *Doc) Where() string {
	if d.Index > 1 {
		return fmt.Sprintf("%s (document %d)", d.Source, d.Index)
	}
	return d.Source
}

// Read reads the given paths: files, directories (their *.yaml, *.yml and
// *.json files, in name order, not recursively, as kubectl apply -f does)
// or "-" for stdin.
func Read(paths []string, stdin io.Reader) ([]Doc, error) {
	var docs []Doc
	for _, p := range paths {
		if p == "-" {
			data, err := io.ReadAll(stdin)
			if err != nil {
				return nil, fmt.Errorf("reading stdin: %w", err)
			}
			ds, err := Parse(Stdin, data)
			if err != nil {
				return nil, err
			}
			docs = append(docs, ds...)
			continue
		}
		files, err := expand(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, err
			}
			ds, err := Parse(f, data)
			if err != nil {
				return nil, err
			}
			docs = append(docs, ds...)
		}
	}
	return docs, nil
}

func expand(p string) ([]string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{p}, nil
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		switch strings.ToLower(filepath.Ext(e.Name())) {
		case ".yaml", ".yml", ".json":
			if !e.IsDir() {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no .yaml, .yml or .json files", p)
	}
	return files, nil
}

// Parse splits one source into documents. A source whose first document
// is a floodgate sidecar config or an envoyproxy/ratelimit config is one
// Doc of that format; otherwise every non-empty YAML document is a
// Manifest.
func Parse(source string, data []byte) ([]Doc, error) {
	if len(data) > config.MaxDocumentSize {
		return nil, fmt.Errorf("%s: %d bytes, the limit is %d", source, len(data), config.MaxDocumentSize)
	}
	if f, ok := configFormat(data); ok {
		return []Doc{{Source: source, Index: 1, Format: f, Data: data}}, nil
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs []Doc
	for i := 1; ; i++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			i--
			continue
		}
		j, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("error parsing %s: error converting YAML to JSON: %w", source, err)
		}
		if string(bytes.TrimSpace(j)) == "null" {
			i--
			continue
		}
		ds, err := manifest(source, i, j)
		if err != nil {
			return nil, err
		}
		docs = append(docs, ds...)
	}
}

// configFormat tells a sidecar or envoyproxy/ratelimit config by the shape
// of its first document.
func configFormat(data []byte) (Format, bool) {
	f, err := rlsimport.Detect(data)
	if err != nil {
		return 0, false
	}
	switch f {
	case rlsimport.FormatEnvoy:
		return EnvoyConfig, true
	case rlsimport.FormatFloodgate:
		var tm metav1.TypeMeta
		if yaml.Unmarshal(data, &tm) == nil && tm.APIVersion == config.APIVersion {
			return SidecarConfig, true
		}
	}
	return 0, false
}

// manifest reads one Kubernetes document, expanding a List.
func manifest(source string, index int, j []byte) ([]Doc, error) {
	var head struct {
		metav1.TypeMeta
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(j, &head); err != nil {
		return nil, fmt.Errorf("%s: document %d is not an object: %w", source, index, err)
	}
	var missing []string
	if head.APIVersion == "" {
		missing = append(missing, "apiVersion not set")
	}
	if head.Kind == "" {
		missing = append(missing, "kind not set")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("error validating %q: error validating data: [%s]", source, strings.Join(missing, ", "))
	}
	gvk := head.GroupVersionKind()
	if gvk.Group == "" && gvk.Version == "v1" && strings.HasSuffix(gvk.Kind, "List") && head.Items != nil {
		var out []Doc
		for _, it := range head.Items {
			ds, err := manifest(source, index, it)
			if err != nil {
				return nil, err
			}
			out = append(out, ds...)
		}
		return out, nil
	}
	return []Doc{{Source: source, Index: index, Format: Manifest, GVK: gvk,
		Name: head.Metadata.Name, Namespace: head.Metadata.Namespace, JSON: j}}, nil
}
