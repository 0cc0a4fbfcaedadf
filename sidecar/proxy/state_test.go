package proxy

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// A State that a connection keeps between requests holds nothing of the
// rules in force once Reset ends a request, and Check shrinks its buffers
// when the set in force is much smaller than the one they grew for.
func TestStateLetsReplacedRulesGo(t *testing.T) {
	t.Parallel()
	p := newProxy(t, "http://127.0.0.1:1")
	small := p.Rules()
	var st State
	check := func(path string) *Decision {
		t.Helper()
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("X-Key", "k")
		return p.Check(req, &st)
	}
	check("/deny")
	if d := check("/deny"); d.Outcome != Denied || d.Rule == nil {
		t.Fatalf("second request: %v, want denied by a rule", d.Outcome)
	}
	st.Reset()
	if st.d.Rule != nil {
		t.Error("the Decision of the ended request still names its rule")
	}
	for i, h := range st.Hits[:cap(st.Hits)] {
		if h != (engine.Hit{}) {
			t.Errorf("hit %d of the ended request is still there: %+v", i, h)
		}
	}

	var b strings.Builder
	b.WriteString("apiVersion: floodgate.dev/sidecar-config/v1\npolicies:\n- name: big\n  uid: big-uid\n  rules:\n")
	for i := range 200 {
		fmt.Fprintf(&b, "  - name: r%d\n    limit: {requests: 1000, per: 1s}\n", i)
	}
	c, err := config.Load([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	large, err := ruleset.Compile(c, labels.Set{}, p.o.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	p.SetRules(large)
	check("/x")
	if len(st.Hits) != 200 {
		t.Fatalf("%d hits on the large set, want 200", len(st.Hits))
	}
	st.Reset()
	p.SetRules(small)
	check("/deny")
	if h, r := cap(st.Hits), cap(st.v.Results); h > 2*len(small.Rules)+16 || r > 2*len(small.Rules)+16 {
		t.Errorf("on a set of %d rules, the State keeps room for %d hits and %d results", len(small.Rules), h, r)
	}
}
