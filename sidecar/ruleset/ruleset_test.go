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
	s, err = Compile(bad, nil, metrics.NewMetrics(prometheus.NewRegistry()))
	if err != nil || len(s.Failed) != 1 || !strings.Contains(s.Failed[0].Error(), "policy a: jwt: read hmac secret") {
		t.Errorf("Compile with a missing secret file: %v, failed %v; want policy a reported failed, naming its jwt", err, s.Failed)
	}
}

// One policy that cannot compile (its JWT key Secret was never mounted)
// leaves the others of the document in force, and is reported on its own
// (the bypass of issue 18: the whole document was rejected, so a valid
// login limit beside it was dropped too).
func TestCompileIsolatesPolicies(t *testing.T) {
	t.Parallel()
	c, err := config.Load([]byte(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: broken
  namespace: shop
  uid: u1
  jwt: {hmacSecretFile: /nonexistent/secret}
  rules:
  - {name: per-user, key: [{jwtClaim: sub}], limit: {requests: 10, per: 1s}}
  - {name: envoy, match: {descriptors: {domain: d, entries: [{key: k}]}}, limit: {requests: 1, per: 1s}}
- name: login
  namespace: shop
  uid: u2
  rules:
  - {name: per-ip, match: {path: {type: Exact, value: /login}}, key: [{clientIP: {}}], limit: {requests: 3, per: 1m}}
  - {name: envoy, match: {descriptors: {domain: d, entries: [{key: k}]}}, limit: {requests: 1, per: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Compile(c, nil, metrics.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatalf("Compile = %v, want the login policy in force", err)
	}
	if len(s.Rules) != 1 || s.Rules[0].PolicyName != "login.per-ip" || s.Policies != 1 {
		t.Errorf("rules in force: %d (%v), want only login.per-ip", len(s.Rules), s.Rules)
	}
	if got := len(s.Descriptors.Rules()); got != 1 || s.Descriptors.Rules()[0].Policy != "login" {
		t.Errorf("descriptor rules in force: %d, want only login's", got)
	}
	if len(s.Failed) != 1 || s.Failed[0].ID() != "shop/broken" || s.Failed[0].Index != 0 ||
		!strings.Contains(s.Failed[0].Err.Error(), "jwt: read hmac secret") {
		t.Errorf("failed %v, want shop/broken with its jwt error", s.Failed)
	}
}

// A pod's replica index is its position in the policy's replicaPods; a pod
// that is not listed takes one from its name.
func TestReplicaShare(t *testing.T) {
	t.Parallel()
	c := &config.Config{Pods: []string{"a-0", "b-0", "b-1", "b-2"}}
	p := &config.Policy{Replicas: 3, ReplicaPods: []int32{1, 2, 3}}
	for pod, want := range map[string]int32{"b-0": 0, "b-1": 1, "b-2": 2} {
		if got := replicaShare(c, p, pod); got.Of != 3 || got.Index != want {
			t.Errorf("pod %s: share %+v, want index %d of 3", pod, got, want)
		}
	}
	if got := replicaShare(c, p, "new-pod"); got.Of != 3 || got.Index < 0 || got.Index > 2 {
		t.Errorf("an unlisted pod: share %+v, want an index of 3", got)
	}
	if got := replicaShare(c, &config.Policy{Replicas: 1}, "x"); got.Of > 1 {
		t.Errorf("one replica: share %+v, want the whole limit", got)
	}
}
