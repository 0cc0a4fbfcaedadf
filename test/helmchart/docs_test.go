package helmchart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

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

// renderedAlerts renders the chart with the PrometheusRule on (every alert
// is on by default) and returns the alerts it holds, with whether each is
// computed from the sidecars' metrics alone.
func renderedAlerts(t *testing.T) (names []string, sidecarOnly int) {
	t.Helper()
	rules := helmtest.Manifest(t, "--set", "monitoring.prometheusRule.enabled=true").OfKind("PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules rendered, want 1", len(rules))
	}
	groups, _, err := unstructured.NestedSlice(rules[0].Object, "spec", "groups")
	if err != nil || len(groups) == 0 {
		t.Fatalf("PrometheusRule has no groups (%v)", err)
	}
	for _, g := range groups {
		rs, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rs {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			if name == "" {
				continue
			}
			names = append(names, name)
			expr, _ := rule["expr"].(string)
			if strings.Contains(expr, "floodgate_sidecar_") && !strings.Contains(expr, "floodgate_counterstore_") {
				sidecarOnly++
			}
		}
	}
	return names, sidecarOnly
}

// countWords are the numbers the docs spell out when they count alerts.
var countWords = []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"}

// spelledCount reads a count as the docs write it: a word or digits.
func spelledCount(s string) int {
	if i := slices.Index(countWords, strings.ToLower(s)); i >= 0 {
		return i
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// TestAlertsDocumented checks the docs against the alerts the chart
// renders: the chart README's alert table has a row for each and no
// other, README.md and docs/operations.md name each (the runbook a
// heading each), and every "N alerts" in README.md, the chart README and
// docs/ says how many there are, so that adding an alert without its
// documentation fails here.
func TestAlertsDocumented(t *testing.T) {
	t.Parallel()
	alerts, sidecarOnly := renderedAlerts(t)
	if len(alerts) < 5 {
		t.Fatalf("only %d alerts rendered (%v); the walk is broken", len(alerts), alerts)
	}
	slices.Sort(alerts)
	root := helmtest.RepoRoot(t)
	read := func(rel string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	chartREADME := read("charts/floodgate/README.md")
	_, monitoring, ok := strings.Cut(chartREADME, "\n## Monitoring\n")
	if !ok {
		t.Fatal("charts/floodgate/README.md has no \"## Monitoring\" section")
	}
	monitoring, _, _ = strings.Cut(monitoring, "\n## ")
	var rows []string
	for _, m := range regexp.MustCompile("(?m)^\\s*\\| `(Floodgate[A-Za-z]+)`").FindAllStringSubmatch(monitoring, -1) {
		rows = append(rows, m[1])
	}
	slices.Sort(rows)
	if !slices.Equal(rows, alerts) {
		t.Errorf("the alert table of charts/floodgate/README.md lists %v; the chart renders %v", rows, alerts)
	}

	readme := read("README.md")
	operations := read("docs/operations.md")
	var headings []string
	for _, m := range regexp.MustCompile(`(?m)^### (Floodgate[A-Za-z]+) \((warning|critical)\)$`).FindAllStringSubmatch(operations, -1) {
		headings = append(headings, m[1])
	}
	slices.Sort(headings)
	if !slices.Equal(headings, alerts) {
		t.Errorf("docs/operations.md has runbook headings for %v; the chart renders %v", headings, alerts)
	}
	for _, a := range alerts {
		if !strings.Contains(readme, "`"+a+"`") {
			t.Errorf("README.md does not name the alert %s", a)
		}
	}

	docs := []string{"README.md", "charts/floodgate/README.md"}
	for _, pattern := range []string{"docs/*.md", "docs/*/*.md"} {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range matches {
			rel, _ := filepath.Rel(root, m)
			docs = append(docs, rel)
		}
	}
	counted := regexp.MustCompile(`(?i)\b(` + strings.Join(countWords, "|") + `|\d+)\s+(?:floodgate\s+)?alerts\b`)
	found := 0
	for _, rel := range docs {
		for _, m := range counted.FindAllStringSubmatch(read(rel), -1) {
			found++
			if n := spelledCount(m[1]); n != len(alerts) {
				t.Errorf("%s says %q; the chart has %d alerts", rel, m[0], len(alerts))
			}
		}
	}
	if found < 3 {
		t.Errorf("found the alert count in %d places, want README.md, the chart README and docs/operations.md at least; the pattern is broken", found)
	}
	m := regexp.MustCompile(`(?i)\b(` + strings.Join(countWords, "|") + `) are computed from the sidecar metrics`).FindStringSubmatch(operations)
	if m == nil {
		t.Error("docs/operations.md no longer says how many alerts are computed from the sidecar metrics")
	} else if spelledCount(m[1]) != sidecarOnly {
		t.Errorf("docs/operations.md says %q; %d alerts read the sidecar metrics only", m[0], sidecarOnly)
	}
}
