package helmchart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

// documentedValues walks values.yaml and returns the paths of the values it
// documents: every key with a "# --" comment. A key without one must be a
// non-empty map, whose keys are documented in turn; anything else is an
// undocumented value.
func documentedValues(t *testing.T) (leaves, all []string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(helmtest.ChartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yamlv3.MappingNode {
		t.Fatal("values.yaml is not a mapping")
	}
	var walk func(prefix string, m *yamlv3.Node)
	walk = func(prefix string, m *yamlv3.Node) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			path := prefix + k.Value
			all = append(all, path)
			if strings.Contains(k.HeadComment, "# -- ") {
				leaves = append(leaves, path)
				continue
			}
			if v.Kind != yamlv3.MappingNode || len(v.Content) == 0 {
				t.Errorf("values.yaml: %s (line %d) has no \"# --\" comment describing it", path, k.Line)
				continue
			}
			walk(path+".", v)
		}
	}
	walk("", doc.Content[0])
	return leaves, all
}

// TestEveryValueDocumented checks that every value in values.yaml has a
// comment, a row in README.md's values table and a definition in
// values.schema.json, and that neither the README nor the schema describes
// values that do not exist.
func TestEveryValueDocumented(t *testing.T) {
	t.Parallel()
	leaves, all := documentedValues(t)
	if len(leaves) < 50 {
		t.Fatalf("only %d documented values found in values.yaml; the walk is broken", len(leaves))
	}

	readme, err := os.ReadFile(filepath.Join(helmtest.ChartDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "\n## Values\n")
	if !ok {
		t.Fatal("README.md has no \"## Values\" section")
	}
	rowKey := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")
	var rows []string
	for _, m := range rowKey.FindAllStringSubmatch(table, -1) {
		rows = append(rows, m[1])
	}
	for _, p := range leaves {
		if !slices.Contains(rows, p) {
			t.Errorf("README.md's values table has no row for %s", p)
		}
	}
	for _, r := range rows {
		if !slices.Contains(leaves, r) {
			t.Errorf("README.md's values table describes %s, which values.yaml does not have", r)
		}
	}

	schema := loadSchema(t)
	for _, p := range leaves {
		if schema.lookup(p) == nil {
			t.Errorf("values.schema.json does not define %s", p)
		}
	}
	for _, p := range schema.paths("") {
		if slices.Contains(all, p) || slices.ContainsFunc(leaves, func(l string) bool { return strings.HasPrefix(p, l+".") }) {
			continue
		}
		t.Errorf("values.schema.json defines %s, which values.yaml does not have", p)
	}
}

// jsonSchema is the part of a JSON schema the docs test reads.
type jsonSchema struct {
	Ref         string                 `json:"$ref"`
	AllOf       []*jsonSchema          `json:"allOf"`
	Properties  map[string]*jsonSchema `json:"properties"`
	Definitions map[string]*jsonSchema `json:"definitions"`
	Description string                 `json:"description"`

	root *jsonSchema
}

func loadSchema(t *testing.T) *jsonSchema {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(helmtest.ChartDir(t), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s jsonSchema
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	s.root = &s
	return &s
}

// resolved follows $ref and allOf wrappers to the schema with the
// properties.
func (s *jsonSchema) resolved() *jsonSchema {
	cur := s
	for range 8 {
		switch {
		case cur.Ref != "":
			name := strings.TrimPrefix(cur.Ref, "#/definitions/")
			next := s.root.Definitions[name]
			if next == nil {
				return cur
			}
			next.root = s.root
			cur = next
		case len(cur.AllOf) == 1 && cur.AllOf[0].Ref != "" && cur.Properties == nil:
			next := cur.AllOf[0]
			next.root = s.root
			cur = next
		default:
			return cur
		}
	}
	return cur
}

func (s *jsonSchema) lookup(path string) *jsonSchema {
	cur := s
	for part := range strings.SplitSeq(path, ".") {
		cur = cur.resolved()
		next := cur.Properties[part]
		if next == nil {
			return nil
		}
		next.root = s.root
		cur = next
	}
	return cur
}

func (s *jsonSchema) paths(prefix string) []string {
	var out []string
	for name, p := range s.resolved().Properties {
		p.root = s.root
		path := prefix + name
		out = append(out, path)
		out = append(out, p.paths(path+".")...)
	}
	return out
}
