package ruleset

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

// rulesDoc is a policy of n rules without a key, which every request hits.
func rulesDoc(n int) string {
	var b strings.Builder
	b.WriteString("apiVersion: floodgate.dev/sidecar-config/v1\npolicies:\n- name: p\n  uid: p-uid\n  rules:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: r%d\n    limit: {requests: 10, per: 1s}\n", i)
	}
	return b.String()
}

// A Scratch kept between requests holds nothing of a set that a config
// change replaced: Evaluate clears the hits of the last request, and Fit
// drops the buffers a larger set grew.
func TestScratchLetsReplacedSetsGo(t *testing.T) {
	t.Parallel()
	large, _ := compileDoc(t, rulesDoc(100), nil)
	small, _ := compileDoc(t, rulesDoc(1), nil)
	sc := &Scratch{}
	eval := func(s *Set) {
		t.Helper()
		req := httptest.NewRequest("GET", "/x", nil)
		sc.Request.Reset(req, "/x", s.Policies)
		if err := s.Evaluate(sc); err != nil {
			t.Fatal(err)
		}
		if len(sc.Hits) != len(s.Rules) {
			t.Fatalf("%d hits, want %d", len(sc.Hits), len(s.Rules))
		}
	}
	eval(large)
	if sc.Fit(large) {
		t.Error("Fit dropped the buffers of the set they were grown for")
	}
	eval(small)
	for i, h := range sc.Hits[len(sc.Hits):cap(sc.Hits)] {
		if h.Rule != nil || h.Key != "" {
			t.Fatalf("hit %d of the last request on the large set is still there: %s %q", len(sc.Hits)+i, h.Rule.Name, h.Key)
		}
	}
	if !sc.Fit(small) || cap(sc.Hits) != 0 || cap(sc.Rules) != 0 || cap(sc.idx) != 0 {
		t.Errorf("Fit on the small set: buffers of %d hits, %d rules, %d matches remain", cap(sc.Hits), cap(sc.Rules), cap(sc.idx))
	}
	eval(small)
	if sc.Fit(small) {
		t.Error("Fit dropped the buffers of one request on the small set")
	}
}
