package ruleset

import (
	"errors"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

const conditionsDoc = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: floor
  uid: floor-uid
  rules:
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 1000, per: 1s}
    replacedBy: [team-uid]
  - name: global
    key: []
    limit: {requests: 100000, per: 1s}
- name: team
  uid: team-uid
  podSelector: {matchLabels: {app: api}}
  exempt: {sourceCIDRs: [10.0.0.0/8]}
  rules:
  - name: per-org
    match: {when: ["request.path.startsWith('/api/')"]}
    key: [{expression: "request.headers['x-org'] + '/' + request.method"}]
    onMissingKey: Reject
    limit: {requests: 10, per: 1s}
    exempt: {when: ["request.headers['x-probe'] == 'health'"]}
  - name: per-ip
    key: [{clientIP: {}}]
    limit: {requests: 500, per: 1s}
`

func compileDoc(t *testing.T, doc string, podLabels labels.Set) (*Set, *metrics.Metrics) {
	t.Helper()
	c, err := config.Load([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	s, err := Compile(c, podLabels, m)
	if err != nil {
		t.Fatal(err)
	}
	return s, m
}

// ruleNames names the rules of the hits, as "<policy>.<rule>".
func ruleNames(s *Set, sc *Scratch) []string {
	var out []string
	for _, i := range sc.Rules {
		out = append(out, s.Rules[i].PolicyName)
	}
	return out
}

func TestReplacedRulesApplyOnlyWhereTheirReplacementDoesNot(t *testing.T) {
	t.Parallel()
	api, _ := compileDoc(t, conditionsDoc, labels.Set{"app": "api"})
	if got, want := api.Replaced, []string{"floor.per-ip"}; !slices.Equal(got, want) {
		t.Errorf("replaced on an api pod = %v, want %v", got, want)
	}
	other, _ := compileDoc(t, conditionsDoc, labels.Set{"app": "web"})
	if len(other.Replaced) != 0 || len(other.Rules) != 2 {
		t.Errorf("a web pod: replaced %v, %d rules; want none replaced and the floor's 2 rules", other.Replaced, len(other.Rules))
	}
}

func TestEvaluate(t *testing.T) {
	t.Parallel()
	s, m := compileDoc(t, conditionsDoc, labels.Set{"app": "api"})
	eval := func(method, target, from string, h map[string]string) (*Scratch, error) {
		req := httptest.NewRequest(method, target, nil)
		req.RemoteAddr = from + ":1234"
		for k, v := range h {
			req.Header.Set(k, v)
		}
		sc := &Scratch{}
		sc.Request.Reset(req, match.CleanPath(req.URL.Path), s.Policies)
		return sc, s.Evaluate(sc)
	}

	sc, err := eval("GET", "/api/x", "192.0.2.1", map[string]string{"X-Org": "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ruleNames(s, sc), []string{"floor.global", "team.per-org", "team.per-ip"}; !slices.Equal(got, want) {
		t.Errorf("hits = %v, want %v", got, want)
	}
	keyGET := sc.Hits[1].Key
	sc, _ = eval("POST", "/api/x", "192.0.2.1", map[string]string{"X-Org": "acme"})
	if sc.Hits[1].Key == keyGET {
		t.Error("the key expression gave GET and POST one counter")
	}
	sc, _ = eval("GET", "/api/y", "192.0.2.9", map[string]string{"X-Org": "acme"})
	if sc.Hits[1].Key != keyGET {
		t.Error("the key expression gave two paths of one org and method two counters")
	}

	// The rule's exemption: the probe skips per-org only.
	sc, err = eval("GET", "/api/x", "192.0.2.1", map[string]string{"X-Probe": "health"})
	if err != nil {
		t.Fatalf("an exempt request was rejected for its missing key: %v", err)
	}
	if got, want := ruleNames(s, sc), []string{"floor.global", "team.per-ip"}; !slices.Equal(got, want) {
		t.Errorf("hits of a probe = %v, want %v", got, want)
	}
	// The policy's exemption: an internal caller skips every team rule.
	sc, _ = eval("GET", "/api/x", "10.1.2.3", map[string]string{"X-Org": "acme"})
	if got, want := ruleNames(s, sc), []string{"floor.global"}; !slices.Equal(got, want) {
		t.Errorf("hits of an internal caller = %v, want %v", got, want)
	}
	if got := counterValue(t, m.ExemptTotal.WithLabelValues("team", "per-org")); got != 2 {
		t.Errorf("exempt_total{team,per-org} = %v, want 2", got)
	}
	if got := counterValue(t, m.ExemptTotal.WithLabelValues("team", "per-ip")); got != 1 {
		t.Errorf("exempt_total{team,per-ip} = %v, want 1", got)
	}

	// A missing key part of a Reject rule rejects the request.
	_, err = eval("GET", "/api/x", "192.0.2.1", nil)
	var rej *RejectError
	var missing *descriptor.MissingError
	if !errors.As(err, &rej) || !errors.As(err, &missing) || rej.Rule.PolicyName != "team.per-org" {
		t.Errorf("Evaluate without X-Org = %v, want a RejectError of team.per-org for a missing part", err)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var out dto.Metric
	if err := c.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetCounter().GetValue()
}
