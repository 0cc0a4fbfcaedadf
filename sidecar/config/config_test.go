package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/internal/message"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

const validYAML = `
apiVersion: floodgate.dev/sidecar-config/v1
revision: r1
store: {type: redis, addresses: ["127.0.0.1:7000", "[::1]:7001"]}
policies:
- name: checkout
  namespace: shop
  uid: 6f1c-uid
  replicas: 3
  trustedProxies: {cidrs: [10.0.0.0/8], hops: 1}
  jwt: {hmacSecretFile: /etc/secret}
  rules:
  - name: per-user
    match: {path: {type: Prefix, value: /api/}, methods: [GET, POST], headers: [{name: X-Tier, value: free}]}
    key: [{header: X-API-Key}, {clientIP: {}}, {jwtClaim: sub}]
    limit: {requests: 100, per: 1m, burst: 50, algorithm: GCRA}
    cost: {fromHeader: X-Cost, default: 1, max: 10}
    failureMode: Closed
    mode: Shadow
`

func TestParseYAMLAndJSON(t *testing.T) {
	t.Parallel()
	c, err := Load([]byte(validYAML))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	r := c.Policies[0].Rules[0]
	if got, want := r.Limit.Per.Duration, time.Minute; got != want {
		t.Errorf("per = %v, want %v", got, want)
	}
	if got, want := len(r.Key), 3; got != want {
		t.Fatalf("key parts = %d, want %d", got, want)
	}
	if r.Key[1].ClientIP == nil {
		t.Errorf("key[1].clientIP not set")
	}
	lim, err := r.Limit.Limiter()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := lim, (limiter.Limit{Algorithm: limiter.GCRA, Requests: 100, Period: time.Minute, Burst: 50}); got != want {
		t.Errorf("Limiter() = %+v, want %+v", got, want)
	}

	js := `{"apiVersion":"floodgate.dev/sidecar-config/v1","store":{"type":"memory"},
	"policies":[{"name":"p","uid":"u1","rules":[{"name":"r","key":[],"limit":{"requests":5,"per":"1s"}}]}]}`
	c, err = Load([]byte(js))
	if err != nil {
		t.Fatalf("Load(json): %v", err)
	}
	if !strings.HasPrefix(c.Revision, "sha256:") {
		t.Errorf("derived revision = %q, want a sha256: digest", c.Revision)
	}
	if got, want := c.Revision, Digest([]byte(js)); got != want {
		t.Errorf("revision = %q, want %q", got, want)
	}
}

func TestParseIsStrict(t *testing.T) {
	t.Parallel()
	for name, doc := range map[string]string{
		"unknown field":  "apiVersion: floodgate.dev/sidecar-config/v1\npolicies: []\nextra: 1\n",
		"typo in rule":   "apiVersion: floodgate.dev/sidecar-config/v1\npolicies:\n- name: p\n  uid: u\n  rules:\n  - name: r\n    limt: {requests: 1, per: 1s}\n",
		"duplicate key":  "apiVersion: a\napiVersion: b\n",
		"wrong type":     "apiVersion: floodgate.dev/sidecar-config/v1\npolicies: 3\n",
		"bad duration":   "apiVersion: floodgate.dev/sidecar-config/v1\npolicies:\n- name: p\n  uid: u\n  rules:\n  - name: r\n    limit: {requests: 1, per: 1d}\n",
		"not a document": "{{{",
	} {
		if _, err := Parse([]byte(doc)); err == nil {
			t.Errorf("%s: Parse succeeded, want an error", name)
		}
	}
	if _, err := Parse(make([]byte, MaxDocumentSize+1)); err == nil {
		t.Errorf("oversized document parsed, want an error")
	}
}

func TestValidateReportsEveryProblemWithPaths(t *testing.T) {
	t.Parallel()
	doc := `
apiVersion: floodgate.dev/sidecar-config/v2
store: {type: etcd}
policies:
- name: "bad name!"
  uid: "a{b}"
  replicas: -1
  trustedProxies: {cidrs: [not-a-cidr], hops: 99}
  rules:
  - name: r
    match: {path: {type: Regex, value: x}, methods: [get], headers: [{name: "bad header"}]}
    key: [{header: X-A, query: q}, {jwtClaim: sub}]
    onMissingKey: Maybe
    limit: {requests: 0, per: 10ms, burst: 3, algorithm: FixedWindow}
    cost: {default: -1}
    failureMode: Sideways
    mode: Loud
  - name: r
    match: {path: {type: RegularExpression, value: "("}}
    key: []
    limit: {requests: 10, per: 1s, algorithm: Leaky}
    cost: {default: 20}
- name: ok
  uid: "a{b}"
  rules: []
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	err = c.Validate()
	if err == nil {
		t.Fatal("Validate succeeded, want errors")
	}
	wantPaths := []string{
		"apiVersion",
		"store.type",
		"policies[0].name",
		"policies[0].uid",
		"policies[0].replicas",
		"policies[0].trustedProxies.cidrs[0]",
		"policies[0].trustedProxies.hops",
		"policies[0].rules[0].match.path.type",
		"policies[0].rules[0].match.methods[0]",
		"policies[0].rules[0].match.headers[0].name",
		"policies[0].rules[0].key[0]",
		"policies[0].rules[0].key[1].jwtClaim",
		"policies[0].rules[0].onMissingKey",
		"policies[0].rules[0].limit.requests",
		"policies[0].rules[0].limit.per",
		"policies[0].rules[0].limit.burst",
		"policies[0].rules[0].cost.default",
		"policies[0].rules[0].failureMode",
		"policies[0].rules[0].mode",
		"policies[0].rules[1].name",
		"policies[0].rules[1].match.path.value",
		"policies[0].rules[1].limit.algorithm",
		"policies[1].uid",
		"policies[1].rules",
	}
	got := map[string]bool{}
	for _, e := range message.Unjoin(err) {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Errorf("error %q is not a *FieldError", e)
			continue
		}
		got[fe.Path] = true
	}
	for _, p := range wantPaths {
		if !got[p] {
			t.Errorf("no error reported at %s; errors:\n%v", p, err)
		}
	}
}

func TestValidateCostAgainstCapacity(t *testing.T) {
	t.Parallel()
	c := &Config{APIVersion: APIVersion, Policies: []Policy{{
		Name: "p", UID: "u",
		Rules: []Rule{{Name: "r", Limit: Limit{Requests: 10}, Cost: Cost{Default: 20}}},
	}}}
	c.Policies[0].Rules[0].Limit.Per.Duration = time.Second
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "policies[0].rules[0].cost.default") {
		t.Fatalf("Validate = %v, want an error at policies[0].rules[0].cost.default", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(validYAML))
	f.Add([]byte(`{"apiVersion":"floodgate.dev/sidecar-config/v1","policies":[{"name":"p","uid":"u","rules":[{"name":"r","key":[{"clientIP":{}}],"limit":{"requests":5,"per":"1s"}}]}]}`))
	f.Add([]byte("policies: [{rules: [{match: {path: {type: RegularExpression, value: '(a+)+$'}}}]}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		// Validate must never panic, and a valid document must convert.
		if c.Validate() == nil {
			for _, p := range c.Policies {
				for _, r := range p.Rules {
					if _, err := r.Limit.Limiter(); err != nil {
						t.Fatalf("validated limit does not convert: %v", err)
					}
				}
			}
		}
	})
}

// Check names the field of the limit at fault, as the sidecar's and the
// API's validation report it.
func TestLimitCheck(t *testing.T) {
	t.Parallel()
	lim, problems := Limit{Requests: 10, Per: metav1.Duration{Duration: time.Minute}, Burst: 5, Algorithm: "GCRA"}.Check()
	if len(problems) != 0 || lim.Algorithm != limiter.GCRA || lim.Requests != 10 || lim.Burst != 5 || lim.Period != time.Minute {
		t.Errorf("a valid limit: %+v, %v", lim, problems)
	}
	for _, tc := range []struct {
		l     Limit
		paths []string
	}{
		{Limit{Requests: 0, Per: metav1.Duration{Duration: time.Minute}}, []string{"requests"}},
		{Limit{Requests: 1, Per: metav1.Duration{Duration: time.Millisecond}}, []string{"per"}},
		{Limit{Requests: 1, Per: metav1.Duration{Duration: time.Minute}, Algorithm: "Leaky"}, []string{"algorithm"}},
		{Limit{Requests: 1, Per: metav1.Duration{Duration: time.Minute}, Burst: 3, Algorithm: "FixedWindow"}, []string{"burst"}},
		{Limit{Requests: 0, Per: metav1.Duration{}, Burst: -1}, []string{"requests", "per", "burst"}},
		{Limit{Requests: 100_001, Per: metav1.Duration{Duration: time.Hour}, Algorithm: "SlidingLog"}, []string{"requests"}},
		{Limit{Requests: 1, Per: metav1.Duration{Duration: 8784 * time.Hour}, Burst: 1000}, []string{"burst"}},
	} {
		_, problems := tc.l.Check()
		var paths []string
		for _, p := range problems {
			paths = append(paths, p.Path)
			if p.Msg == "" || strings.HasPrefix(p.Msg, p.Path+":") {
				t.Errorf("%+v: problem %+v: the message must be the reason alone", tc.l, p)
			}
		}
		if strings.Join(paths, ",") != strings.Join(tc.paths, ",") {
			t.Errorf("%+v: problems on %v, want %v", tc.l, paths, tc.paths)
		}
	}
}

func TestPartialMessage(t *testing.T) {
	t.Parallel()
	rev, failed, complete := ParsePartialMessage(PartialMessage("r1", []string{"a", "b"}))
	if rev != "r1" || strings.Join(failed, ",") != "a,b" || !complete {
		t.Errorf("round trip: %q %v %v", rev, failed, complete)
	}
	long := make([]string, 100)
	for i := range long {
		long[i] = fmt.Sprintf("policy-with-a-long-name-%02d", i)
	}
	msg := PartialMessage("r2", long)
	if len(msg) > MaxPartialMessage {
		t.Errorf("message of %d bytes, over %d", len(msg), MaxPartialMessage)
	}
	rev, failed, complete = ParsePartialMessage(msg)
	if rev != "r2" || complete || len(failed) == 0 || !strings.HasPrefix(failed[0], "policy-with") || !strings.HasPrefix(failed[len(failed)-1], "policy-with") {
		t.Errorf("cut list: %q %v %v", rev, failed, complete)
	}
	if _, _, ok := ParsePartialMessage("r1"); ok {
		t.Errorf("a Loaded message parsed as partial")
	}
}

func TestPeekStore(t *testing.T) {
	t.Parallel()
	redis := Store{Name: "orders", Type: StoreRedis, Addresses: []string{"10.0.0.1:6379"}, AuthSecretName: StoreAuthSecret}
	for _, tc := range []struct {
		name, doc string
		want      Store
		wantErr   bool
	}{
		{"the manager's order", `{"apiVersion":"v","revision":"r","store":{"name":"orders","type":"redis","addresses":["10.0.0.1:6379"],"authSecretName":"floodgate-store-auth"},"policies":[]}`, redis, false},
		// What follows the store is not read: a truncated or broken tail
		// costs nothing and fails nothing.
		{"not read past the store", `{"apiVersion":"v","store":{"name":"orders","type":"redis","addresses":["10.0.0.1:6379"],"authSecretName":"floodgate-store-auth"},"policies":[{"na`, redis, false},
		{"store last", `{"policies":[{"name":"a","rules":[{"name":"b"}]}],"pods":["x"],"store":{"name":"orders","type":"redis","addresses":["10.0.0.1:6379"],"authSecretName":"floodgate-store-auth"}}`, redis, false},
		{"no store", `{"apiVersion":"v","policies":[]}`, Store{}, false},
		{"not an object", `["store"]`, Store{}, true},
		{"not JSON", "store: {name: orders}", Store{}, true},
		{"a store that is not an object", `{"store":"orders"}`, Store{}, true},
	} {
		got, err := PeekStore([]byte(tc.doc))
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: PeekStore error = %v, want error %v", tc.name, err, tc.wantErr)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: PeekStore = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
