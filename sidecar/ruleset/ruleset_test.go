package ruleset

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

func TestCost(t *testing.T) {
	t.Parallel()
	c := Cost{header: "X-Cost", def: 2, maximum: 10}
	for _, tc := range []struct {
		h    http.Header
		want int64
		bad  bool
	}{
		{nil, 2, false},
		{http.Header{"X-Cost": {"7"}}, 7, false},
		{http.Header{"X-Cost": {"10"}}, 10, false},
		{http.Header{"X-Cost": {"11"}}, 0, true},
		{http.Header{"X-Cost": {"0"}}, 0, true},
		{http.Header{"X-Cost": {"-3"}}, 0, true},
		{http.Header{"X-Cost": {"1e3"}}, 0, true},
		{http.Header{"X-Cost": {"1", "1"}}, 0, true},
	} {
		got, err := c.Of(tc.h)
		var ce *CostError
		if tc.bad != errors.As(err, &ce) || got != tc.want {
			t.Errorf("Of(%v) = %d, %v; want %d, bad=%v", tc.h, got, err, tc.want, tc.bad)
		}
	}
}

func TestCompile(t *testing.T) {
	t.Parallel()
	c, err := config.Load([]byte(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: a
  uid: ua
  podSelector: {matchLabels: {app: web}}
  rules:
  - {name: r1, limit: {requests: 10, per: 1s}, cost: {fromHeader: x-cost}}
  - {name: r2, limit: {requests: 10, per: 1s, burst: 4}}
- name: b
  uid: ub
  podSelector: {matchLabels: {app: db}}
  rules:
  - {name: r, limit: {requests: 1, per: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Compile(c, labels.Set{"app": "web"}, metrics.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Rules) != 2 || s.Policies != 1 || s.Matcher.Len() != 2 || strings.Join(s.Ignored, ",") != "b" {
		t.Fatalf("set: %d rules, %d policies, ignored %v", len(s.Rules), s.Policies, s.Ignored)
	}
	if s.Rules[0].PolicyName != "a.r1" || s.Rules[1].Cost.maximum != 4 || s.Rules[0].Cost.header != "X-Cost" {
		t.Errorf("rules %+v", s.Rules)
	}

	bad, err := config.Load([]byte(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: a
  uid: ua
  jwt: {hmacSecretFile: /nonexistent/secret}
  rules:
  - {name: r, key: [{jwtClaim: sub}], limit: {requests: 10, per: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Compile(bad, nil, metrics.NewMetrics(prometheus.NewRegistry()))
	if err == nil || !strings.Contains(err.Error(), "policies[0]: jwt: read hmac secret") {
		t.Errorf("Compile with a missing secret file: %v, want an error naming policies[0].jwt", err)
	}
}
