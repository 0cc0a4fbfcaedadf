package descriptor

import (
	"net/http/httptest"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// A Request kept for a connection holds nothing of a request that Reset
// with nil ended (its policies' views and values), and a request under far
// fewer policies drops the buffers that a larger set grew.
func TestResetLetsRequestsAndPoliciesGo(t *testing.T) {
	t.Parallel()
	pols := make([]*Policy, 40)
	for i := range pols {
		var err error
		if pols[i], err = NewPolicy(i, &config.Policy{Name: "p", UID: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	req := httptest.NewRequest("GET", "/x", nil)
	var r Request
	r.Reset(req, "/x", len(pols))
	for _, p := range pols {
		r.ClientIP(p)
		r.Activation(p).ResolveName("request")
	}
	r.Reset(nil, "", 0)
	for i, v := range r.views[:cap(r.views)] {
		if v.r != nil || v.p != nil {
			t.Fatalf("view %d of the ended request still holds it or its policy", i)
		}
	}
	for i, done := range r.ipDone[:cap(r.ipDone)] {
		if done || r.ips[:cap(r.ips)][i].IsValid() {
			t.Fatalf("client address %d of the ended request is still there", i)
		}
	}
	if got := cap(r.views); got < len(pols) {
		t.Errorf("ending a request dropped its buffers (%d views); the next request on the set would grow them again", got)
	}
	r.Reset(req, "/x", 1)
	if got := cap(r.views); got > 2+16 {
		t.Errorf("a request under 1 policy keeps room for %d", got)
	}
}
