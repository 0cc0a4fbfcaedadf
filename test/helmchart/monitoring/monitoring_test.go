// Package monitoring checks the chart's PrometheusRule and Grafana dashboard
// against the metrics floodgate really exports: every metric name, label and
// label value in their queries must exist in sidecar/metrics or among the
// manager's CounterStore metrics (controllers/counterstore), so that
// renaming a metric breaks this test instead of silently emptying an alert.
//
// It is a package of its own because it imports those packages: the chart's
// other tests do not depend on them building.
package monitoring

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

// targetLabels are the labels Prometheus Operator's PodMonitor adds to every
// sample it scrapes from a sidecar.
var targetLabels = []string{"namespace", "pod", "container", "endpoint", "job", "instance", "service"}

// knownValues are the values of labels that the queries match on. The
// decision results are the metrics package's constants; the store call
// results are set by the engine (sidecar/engine).
var knownValues = map[string]map[string][]string{
	"floodgate_sidecar_decisions_total": {
		"result": {metrics.ResultAllowed, metrics.ResultDenied, metrics.ResultShadowDenied, metrics.ResultUnavailable},
	},
	"floodgate_sidecar_fallback_decisions_total": {
		"result": {metrics.ResultAllowed, metrics.ResultDenied},
	},
	"floodgate_sidecar_store_operations_total": {
		"result": {"ok", "unavailable", "error"},
	},
	"floodgate_sidecar_shed_requests_total": {
		"priority": {metrics.PriorityCritical, metrics.PriorityDefault, metrics.PrioritySheddable},
		"mode":     {"enforce", "shadow"},
	},
	"floodgate_sidecar_shedder_admitted_requests_total": {
		"priority": {metrics.PriorityCritical, metrics.PriorityDefault, metrics.PrioritySheddable},
	},
}

// family is one exported metric.
type family struct {
	labels    []string
	histogram bool
}

// exportedFamilies registers the sidecar's metrics and the manager's
// CounterStore metrics on a recording registerer and reads back every
// metric's name and variable labels.
func exportedFamilies(t *testing.T) map[string]family {
	t.Helper()
	rec := &recorder{}
	metrics.NewMetrics(rec)
	counterstore.NewMetrics(rec)
	descRE := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	out := map[string]family{}
	for _, c := range rec.collectors {
		_, isHistogram := c.(prometheus.Histogram)
		if _, ok := c.(*prometheus.HistogramVec); ok {
			isHistogram = true
		}
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := descRE.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the metric description %s", d.String())
			}
			var labels []string
			for l := range strings.SplitSeq(m[2], ",") {
				if l = strings.TrimSpace(l); l != "" {
					labels = append(labels, strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"))
				}
			}
			out[m[1]] = family{labels: labels, histogram: isHistogram}
		}
	}
	if len(out) < 10 {
		t.Fatalf("read only %d sidecar metrics: %v", len(out), out)
	}
	return out
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

var (
	metricRE  = regexp.MustCompile(`\b(floodgate_(?:sidecar|counterstore)_[a-z0-9_]+)\b(\{[^}]*\})?`)
	matcherRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	groupRE   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	labelsFn  = regexp.MustCompile(`label_values\(\s*(floodgate_(?:sidecar|counterstore)_[a-z0-9_]+)(?:\{[^}]*\})?\s*,\s*([a-zA-Z_]+)\s*\)`)
)

// checkQuery reports every metric, label and label value of a PromQL (or
// Grafana label_values) query that the sidecar does not export.
func checkQuery(fams map[string]family, where, q string) []string {
	var errs []string
	if strings.Count(q, "(") != strings.Count(q, ")") || strings.Count(q, "{") != strings.Count(q, "}") {
		errs = append(errs, fmt.Sprintf("%s: unbalanced brackets in %q", where, q))
	}
	allowed := slices.Clone(targetLabels)
	refs := metricRE.FindAllStringSubmatch(q, -1)
	if len(refs) == 0 {
		errs = append(errs, fmt.Sprintf("%s: query %q uses no floodgate metric", where, q))
	}
	for _, ref := range refs {
		name, base, ok := resolve(fams, ref[1])
		if !ok {
			errs = append(errs, fmt.Sprintf("%s: floodgate exports no metric %s", where, ref[1]))
			continue
		}
		own := append(slices.Clone(targetLabels), fams[base].labels...)
		if strings.HasSuffix(name, "_bucket") {
			own = append(own, "le")
		}
		allowed = append(allowed, own...)
		for _, m := range matcherRE.FindAllStringSubmatch(ref[2], -1) {
			label, op, value := m[1], m[2], m[3]
			if !slices.Contains(own, label) {
				errs = append(errs, fmt.Sprintf("%s: %s has no label %q", where, base, label))
				continue
			}
			values := knownValues[base][label]
			if values == nil || strings.Contains(value, "$") || op == "=~" || op == "!~" {
				continue
			}
			if !slices.Contains(values, value) {
				errs = append(errs, fmt.Sprintf("%s: %s{%s} never takes the value %q (it takes %v)", where, base, label, value, values))
			}
		}
	}
	for _, g := range groupRE.FindAllStringSubmatch(q, -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(allowed, l) {
				errs = append(errs, fmt.Sprintf("%s: groups by %q, a label none of its metrics has", where, l))
			}
		}
	}
	for _, lv := range labelsFn.FindAllStringSubmatch(q, -1) {
		if _, base, ok := resolve(fams, lv[1]); ok && !slices.Contains(append(slices.Clone(targetLabels), fams[base].labels...), lv[2]) {
			errs = append(errs, fmt.Sprintf("%s: label_values of %s by %q, a label it does not have", where, base, lv[2]))
		}
	}
	return errs
}

// resolve maps a series name to its metric: the name itself, or for a
// histogram series (_bucket, _sum, _count) the histogram.
func resolve(fams map[string]family, name string) (series, base string, ok bool) {
	if _, ok := fams[name]; ok {
		return name, name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		b := strings.TrimSuffix(name, suffix)
		if b != name && fams[b].histogram {
			return name, b, true
		}
	}
	return name, "", false
}

func render(t *testing.T) helmtest.Set {
	t.Helper()
	return helmtest.Manifest(t, "-f", helmtest.RepoRoot(t)+"/test/helmchart/testdata/values/monitoring.yaml")
}

// TestAlertsUseRealMetrics checks every alert expression of the
// PrometheusRule, and that the alerts the chart promises are there.
func TestAlertsUseRealMetrics(t *testing.T) {
	t.Parallel()
	fams := exportedFamilies(t)
	rules := render(t).OfKind("PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules rendered, want 1", len(rules))
	}
	groups, _, err := unstructured.NestedSlice(rules[0].Object, "spec", "groups")
	if err != nil || len(groups) == 0 {
		t.Fatalf("PrometheusRule has no groups (%v)", err)
	}
	exprs := map[string]string{}
	for _, g := range groups {
		rs, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rs {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			expr, _ := rule["expr"].(string)
			exprs[name] = expr
			labels, _, _ := unstructured.NestedStringMap(rule, "labels")
			if labels["severity"] == "" {
				t.Errorf("alert %s has no severity", name)
			}
			if summary, _, _ := unstructured.NestedString(rule, "annotations", "summary"); summary == "" {
				t.Errorf("alert %s has no summary", name)
			}
		}
	}
	want := []string{"FloodgateDecisionLatencyHigh", "FloodgateFallbackActive", "FloodgateDenyRatioSpike", "FloodgateCounterStoreUnavailable", "FloodgateCounterStoreNotReady", "FloodgateSidecarConfigRejected", "FloodgateCriticalShed"}
	var got []string
	for name := range exprs {
		got = append(got, name)
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("alerts = %v, want %v", got, want)
	}
	for name, expr := range exprs {
		for _, e := range checkQuery(fams, "alert "+name, expr) {
			t.Error(e)
		}
	}
	for name, want := range map[string]string{
		"FloodgateDecisionLatencyHigh":     "histogram_quantile(0.99,",
		"FloodgateDenyRatioSpike":          `result="denied"`,
		"FloodgateCounterStoreUnavailable": `result!="ok"`,
		"FloodgateFallbackActive":          "floodgate_sidecar_fallback_active",
		"FloodgateCounterStoreNotReady":    "floodgate_counterstore_ready",
		"FloodgateCriticalShed":            `floodgate_sidecar_shed_requests_total{priority="Critical",mode="enforce"}`,
	} {
		if !strings.Contains(exprs[name], want) {
			t.Errorf("alert %s = %q, want it to use %s", name, exprs[name], want)
		}
	}
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		GridPos *struct {
			H, W, X, Y int
		} `json:"gridPos"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboardUsesRealMetrics checks the Grafana dashboard ConfigMap: the
// label the Grafana sidecar looks for, valid JSON, every query against the
// sidecar's metrics, and the panels the dashboard is built around.
func TestDashboardUsesRealMetrics(t *testing.T) {
	t.Parallel()
	fams := exportedFamilies(t)
	cms := render(t).OfKind("ConfigMap")
	if len(cms) != 1 {
		t.Fatalf("%d ConfigMaps rendered, want the dashboard only", len(cms))
	}
	cm := cms[0]
	if cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetNamespace() != "monitoring" {
		t.Errorf("dashboard ConfigMap %s/%s labels %v, want namespace monitoring and grafana_dashboard=1", cm.GetNamespace(), cm.GetName(), cm.GetLabels())
	}
	raw, _, _ := unstructured.NestedString(cm.Object, "data", "floodgate.json")
	var d dashboard
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		t.Fatalf("the dashboard is not valid JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q title %q", d.UID, d.Title)
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)["query"].(string)
		for _, e := range checkQuery(fams, "variable "+v.Name, q) {
			t.Error(e)
		}
	}
	ids := map[int]bool{}
	var all strings.Builder
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q has no usable gridPos", p.Title)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the datasource variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for i, tg := range p.Targets {
			all.WriteString(tg.Expr + "\n")
			for _, e := range checkQuery(fams, fmt.Sprintf("panel %q query %d", p.Title, i), tg.Expr) {
				t.Error(e)
			}
		}
	}
	queries := all.String()
	for what, want := range map[string]string{
		"deny ratio":              `floodgate_sidecar_decisions_total{namespace=~"$namespace", policy=~"$policy", result="denied"}`,
		"p99 decision latency":    "histogram_quantile(0.99, sum by (le) (rate(floodgate_sidecar_decision_duration_seconds_bucket",
		"store ops/s per shard":   "sum by (store, shard) (rate(floodgate_sidecar_store_operations_total",
		"fallback state":          "floodgate_sidecar_fallback_active",
		"store latency per shard": "floodgate_sidecar_store_operation_duration_seconds_bucket",
		"concurrency in flight":   "floodgate_sidecar_concurrency_in_flight",
		"adaptive limit":          "floodgate_sidecar_shedding_limit",
		"shed per priority":       "sum by (priority, mode) (rate(floodgate_sidecar_shed_requests_total",
	} {
		if !strings.Contains(queries, want) {
			t.Errorf("the dashboard has no %s query (%s)", what, want)
		}
	}
}

// TestCheckQueryCatchesMistakes makes sure the checker itself rejects what
// it must, so that the tests above cannot pass vacuously.
func TestCheckQueryCatchesMistakes(t *testing.T) {
	t.Parallel()
	fams := exportedFamilies(t)
	for q, want := range map[string]string{
		`sum(rate(floodgate_sidecar_decision_total[5m]))`:                         "exports no metric floodgate_sidecar_decision_total",
		`sum by (status) (rate(floodgate_sidecar_requests_total[5m]))`:            `groups by "status"`,
		`rate(floodgate_sidecar_decisions_total{result="rejected"}[5m])`:          `never takes the value "rejected"`,
		`rate(floodgate_sidecar_store_operations_total{shard_addr="a"}[5m])`:      `has no label "shard_addr"`,
		`sum(floodgate_sidecar_fallback_active_bucket)`:                           "exports no metric floodgate_sidecar_fallback_active_bucket",
		`histogram_quantile(0.99, rate(floodgate_sidecar_decisions_total[5m])`:    "unbalanced brackets",
		`label_values(floodgate_sidecar_decisions_total, shard)`:                  `label_values of floodgate_sidecar_decisions_total by "shard"`,
		`sum by (le) (rate(floodgate_sidecar_store_operations_total_bucket[5m]))`: "exports no metric",
	} {
		errs := strings.Join(checkQuery(fams, "q", q), "\n")
		if !strings.Contains(errs, want) {
			t.Errorf("checkQuery(%q) = %q, want an error containing %q", q, errs, want)
		}
	}
	if errs := checkQuery(fams, "q", `histogram_quantile(0.99, sum by (namespace, le) (rate(floodgate_sidecar_decision_duration_seconds_bucket{namespace="a"}[5m])))`); len(errs) != 0 {
		t.Errorf("a correct query was rejected: %v", errs)
	}
}
