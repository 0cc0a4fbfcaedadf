package envoyrls_test

import (
	"math"
	"os"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// A config in envoyproxy/ratelimit's format, with several domains, decides
// as that project documents.
func TestEnvoyFormatFixture(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("testdata/ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := newRLS(t, string(doc), setup{})

	t.Run("nested and value-less keys", func(t *testing.T) {
		mk := d("message_type=marketing", "to_number=2061111111")
		if got := r.count(t, 7, req("messaging", mk)); got != 5 {
			t.Errorf("marketing to one number: %d of 7 admitted, want 5 per day", got)
		}
		other := d("message_type=marketing", "to_number=2062222222")
		if got := r.count(t, 6, req("messaging", other)); got != 5 {
			t.Errorf("marketing to another number: %d of 6 admitted, want its own 5", got)
		}
		out := r.call(t, req("messaging", d("to_number=2061111111")))
		st := out.Statuses[0]
		if out.OverallCode != ok || st.CurrentLimit.GetRequestsPerUnit() != 100 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY || st.LimitRemaining != 99 {
			t.Errorf("per number: %v, want OK, 100 per DAY, 99 remaining", out)
		}
		// The request depth must equal the config depth.
		if out := r.call(t, req("messaging", d("message_type=marketing"))); out.Statuses[0].CurrentLimit != nil {
			t.Errorf("a one-entry marketing descriptor matched %v; it has no limit of its own", out.Statuses[0].CurrentLimit)
		}
	})

	t.Run("most specific match, block, whitelist, unlimited", func(t *testing.T) {
		if got := r.count(t, 12, req("edge_proxy_per_ip", d("remote_address=50.0.0.1"))); got != 10 {
			t.Errorf("a default IP: %d of 12 admitted, want 10", got)
		}
		for range 3 {
			out := r.call(t, req("edge_proxy_per_ip", d("remote_address=50.0.0.5")))
			st := out.Statuses[0]
			if out.OverallCode != over || st.CurrentLimit.GetRequestsPerUnit() != 0 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
				t.Fatalf("blocked IP: %v, want OVER_LIMIT at 0 per SECOND", out)
			}
		}
		if got := r.count(t, 15, req("edge_proxy_per_ip", d("remote_address=10.0.0.1"))); got != 15 {
			t.Errorf("whitelisted IP: %d of 15 admitted, want all", got)
		}
		for range 3 {
			out := r.call(t, req("edge_proxy_per_ip", d("ldap=anything")))
			if st := out.Statuses[0]; out.OverallCode != ok || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
				t.Fatalf("unlimited: %v, want OK with limit_remaining 2^32-1", out)
			}
		}
		// A blocked descriptor denies the call without charging the
		// other descriptor.
		if out := r.call(t, req("edge_proxy_per_ip", d("remote_address=50.0.0.5"), d("remote_address=50.0.0.9"))); out.OverallCode != over || out.Statuses[1].Code != ok {
			t.Errorf("blocked with another: %v", out)
		}
		if got := r.count(t, 11, req("edge_proxy_per_ip", d("remote_address=50.0.0.9"))); got != 10 {
			t.Errorf("the other IP afterwards: %d of 11 admitted, want its full 10", got)
		}
	})

	t.Run("replaces", func(t *testing.T) {
		one := d("key_1=value_1", "user=bkthomps")
		two := d("key_2=value_2", "user=bkthomps")
		// Both in one call: only the replacing 10/hour applies.
		if got := r.count(t, 7, req("replacing", one, two)); got != 7 {
			t.Errorf("both descriptors: %d of 7 admitted, want 7 (specific_limit of 5 is replaced)", got)
		}
		out := r.call(t, req("replacing", one, two))
		if out.Statuses[0].CurrentLimit != nil || out.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 10 {
			t.Errorf("statuses %v: the replaced descriptor reports no limit, the other 10", out.Statuses)
		}
		// The replaced limit was not touched; the replacing one has 2 left.
		if got := r.count(t, 6, req("replacing", one)); got != 5 {
			t.Errorf("key_1 alone: %d of 6 admitted, want its untouched 5", got)
		}
		if got := r.count(t, 4, req("replacing", two)); got != 2 {
			t.Errorf("key_2 alone: %d of 4 admitted, want the 2 left of 10", got)
		}
	})

	t.Run("shadow mode and wildcard", func(t *testing.T) {
		if got := r.count(t, 5, req("soft", d("service=auth", "user=user-a"))); got != 5 {
			t.Errorf("shadow user-a: %d of 5 admitted, want all", got)
		}
		out := r.call(t, req("soft", d("service=auth", "user=user-a")))
		if out.Statuses[0].Code != ok || out.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
			t.Errorf("shadow status %v, want OK reporting the limit of 2", out.Statuses[0])
		}
		if got := r.metric(t, "floodgate_sidecar_decisions_total", "result", "shadow_denied"); got < 4 {
			t.Errorf("shadow denials counted %v, want at least 4", got)
		}
		if got := r.count(t, 5, req("soft", d("service=auth", "user=user-b"))); got != 3 {
			t.Errorf("user-b: %d of 5 admitted, want 3", got)
		}
		for _, p := range []string{"/api/users", "/api/orders"} {
			if got := r.count(t, 6, req("soft", d("path="+p))); got != 4 {
				t.Errorf("wildcard %s: %d of 6 admitted, want 4 per distinct value", p, got)
			}
		}
		if out := r.call(t, req("soft", d("path=/web"))); out.Statuses[0].CurrentLimit != nil {
			t.Errorf("/web matched %v, want nothing", out.Statuses[0])
		}
	})
}
