package ruleset

import (
	"errors"
	"fmt"
	"math/rand/v2"
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
// that is not listed takes one from its name, and one without a name the
// place of every other.
func TestReplicaShare(t *testing.T) {
	t.Parallel()
	c := &config.Config{Pods: []string{"a-0", "b-0", "b-1", "b-2"}}
	p := &config.Policy{Replicas: 3, ReplicaPods: []int32{1, 2, 3}}
	for pod, want := range map[string]int32{"b-0": 0, "b-1": 1, "b-2": 2} {
		if got, placed := replicaShare(c, p, pod); got.Of != 3 || got.Index != want || placed != PlacedListed {
			t.Errorf("pod %s: share %+v, %v; want index %d of 3, listed", pod, got, placed, want)
		}
	}
	if got, placed := replicaShare(c, p, "new-pod"); got.Of != 3 || got.Index < 0 || got.Index > 2 || placed != PlacedByName {
		t.Errorf("an unlisted pod: share %+v, %v; want an index of 3, by name", got, placed)
	}
	if got, placed := replicaShare(c, p, "a-0"); placed != PlacedByName {
		t.Errorf("a pod in pods but not in the policy's replicaPods: share %+v, %v; want by name", got, placed)
	}
	if got, placed := replicaShare(c, p, ""); placed != PlacedUnnamed {
		t.Errorf("no pod name: share %+v, %v; want unnamed", got, placed)
	}
	if got, _ := replicaShare(c, &config.Policy{Replicas: 1}, "x"); got.Of > 1 {
		t.Errorf("one replica: share %+v, want the whole limit", got)
	}
}

// Places from a hash of the pod names are not places of their own: a
// fleet of 10 named replicas that replicaPods does not list usually has
// two in one place, so two of its replicas spend the same tokens while the
// store is down. With random names (a Deployment's pods) that is a
// birthday collision, all 10 apart having the chance 10!/10^10, 0.04%;
// sequential names (a StatefulSet's) are apart a little more often. Unnamed
// replicas all stand in one place. This is why a standalone sidecar
// refuses both (runner.placeShares): only replicaPods places replicas
// apart.
func TestReplicaShareByNameCollides(t *testing.T) {
	t.Parallel()
	c := &config.Config{}
	p := &config.Policy{Replicas: 10}
	apart := func(names []string) bool {
		seen := map[int32]bool{}
		for _, n := range names {
			sh, _ := replicaShare(c, p, n)
			seen[sh.Index] = true
		}
		return len(seen) == len(names)
	}
	const fleets = 1000
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	randomApart, sequentialApart := 0, 0
	for range fleets {
		// A Deployment's pods: its name, a template hash, then five
		// random characters.
		var random, sequential []string
		for range 10 {
			random = append(random, "checkout-7d9f8b6c5d-"+word(5))
		}
		// A StatefulSet's pods: its name, then the ordinal.
		prefix := word(3 + rng.IntN(10))
		for i := range 10 {
			sequential = append(sequential, fmt.Sprintf("%s-%d", prefix, i))
		}
		if apart(random) {
			randomApart++
		}
		if apart(sequential) {
			sequentialApart++
		}
	}
	t.Logf("fleets of 10 named replicas, unlisted, with every replica in a place of its own: %d of %d with random names, %d of %d with sequential names",
		randomApart, fleets, sequentialApart, fleets)
	if randomApart > fleets/100 {
		t.Errorf("%d of %d fleets of 10 random names are all apart, want about 0.04%%", randomApart, fleets)
	}
	if sequentialApart > fleets/2 {
		t.Errorf("%d of %d fleets of 10 sequential names are all apart, want most to collide", sequentialApart, fleets)
	}
	if apart([]string{"", ""}) {
		t.Errorf("two unnamed replicas in two places, want one")
	}
}

// Set.Shares lists the policies in force whose rules fail open on this
// replica's share, with how the pod found its place: what a sidecar needs
// to refuse a place that is not its own.
func TestCompileReportsShares(t *testing.T) {
	t.Parallel()
	c, err := config.Load([]byte(`apiVersion: floodgate.dev/sidecar-config/v1
pods: [api-0, api-1, api-2]
policies:
- name: listed
  namespace: shop
  uid: u1
  replicas: 3
  replicaPods: [0, 1, 2]
  rules:
  - {name: r, limit: {requests: 3, per: 1m}}
- name: unlisted
  uid: u2
  replicas: 10
  rules:
  - {name: closed, failureMode: Closed, limit: {requests: 3, per: 1m}}
  - {name: open, limit: {requests: 3, per: 1m}}
- name: closed-only
  uid: u3
  replicas: 10
  rules:
  - {name: r, failureMode: Closed, limit: {requests: 3, per: 1m}}
- name: shadow-only
  uid: u4
  replicas: 10
  rules:
  - {name: r, mode: Shadow, limit: {requests: 3, per: 1m}}
- name: concurrency-only
  uid: u5
  replicas: 10
  rules:
  - {name: r, concurrency: {max: 10}}
- name: one-replica
  uid: u6
  replicas: 1
  rules:
  - {name: r, limit: {requests: 3, per: 1m}}
- name: descriptors
  uid: u7
  replicas: 4
  rules:
  - {name: d, match: {descriptors: {domain: edge, entries: [{key: remote_address}]}}, limit: {requests: 3, per: 1m}}
- name: elsewhere
  uid: u8
  replicas: 10
  podSelector: {matchLabels: {app: other}}
  rules:
  - {name: r, limit: {requests: 3, per: 1m}}
- name: broken
  uid: u9
  replicas: 10
  jwt: {hmacSecretFile: /nonexistent/secret}
  rules:
  - {name: r, key: [{jwtClaim: sub}], limit: {requests: 3, per: 1m}}
`))
	if err != nil {
		t.Fatal(err)
	}
	shares := func(pod string) string {
		s, err := CompileFor(c, Pod{Labels: labels.Set{"app": "api"}, Name: pod}, metrics.NewMetrics(prometheus.NewRegistry()))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sh := range s.Shares {
			out = append(out, fmt.Sprintf("%s %v of %d", sh.ID(), sh.Placement, sh.Share.Of))
		}
		return strings.Join(out, ", ")
	}
	for _, tc := range []struct{ pod, want string }{
		{"api-1", "shop/listed listed of 3, unlisted by-name of 10, descriptors by-name of 4"},
		{"stray", "shop/listed by-name of 3, unlisted by-name of 10, descriptors by-name of 4"},
		{"", "shop/listed unnamed of 3, unlisted unnamed of 10, descriptors unnamed of 4"},
	} {
		if got := shares(tc.pod); got != tc.want {
			t.Errorf("pod %q: shares %q, want %q", tc.pod, got, tc.want)
		}
	}
}
