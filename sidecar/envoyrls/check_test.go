package envoyrls_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestCheckThenCharge is a gateway that checks each request with a
// descriptor of hits_addend 0 before it lets it through, and charges it
// afterwards. The check asks whether a unit is left and charges nothing:
// on a fresh key it is OK and the charges that follow still get the whole
// limit; on a spent key it is OVER_LIMIT with a wait, as a charge of 1 is,
// so a client over its budget is not let through. Every algorithm, on the
// in-memory store and on the Redis Cluster, over the real gRPC server.
func TestCheckThenCharge(t *testing.T) {
	t.Parallel()
	store := redisStore(t, cluster, 2*time.Second)
	cc := cluster.NewClient()
	t.Cleanup(func() { _ = cc.Close() })
	for _, backend := range []string{"memory", "redis"} {
		for _, alg := range algorithms {
			t.Run(backend+"/"+alg, func(t *testing.T) {
				t.Parallel()
				run := func(attempt int) func() {
					doc := fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: check-%s-%s-%d-%d
  rules:
  - name: per-user
    match: {descriptors: {domain: api, entries: [{key: user}]}}
    limit: {requests: 5, per: 1h, algorithm: %s}
`, backend, strings.ToLower(alg), time.Now().UnixNano(), attempt, alg)
					s := setup{parallel: true}
					if backend == "redis" {
						s.store = store
					}
					r := newRLS(t, doc, s)
					check := req("api", d("user=alice"))
					check.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
					charge := req("api", d("user=alice"))
					var fresh, charges []*rlsv3.RateLimitResponse
					for range 3 {
						fresh = append(fresh, r.call(t, check))
					}
					for range 5 {
						charges = append(charges, r.call(t, charge))
					}
					var spent []*rlsv3.RateLimitResponse
					for range 3 {
						spent = append(spent, r.call(t, check))
					}
					last := r.call(t, charge)
					return func() {
						for i, out := range fresh {
							if out.OverallCode != ok || out.Statuses[0].Code != ok || out.Statuses[0].LimitRemaining != 5 {
								t.Fatalf("check %d on a fresh key: %v, want OK with 5 remaining", i, out)
							}
						}
						for i, out := range charges {
							if got, want := out.Statuses[0].LimitRemaining, uint32(4-i); out.OverallCode != ok || got != want {
								t.Fatalf("charge %d after the checks: %v, want OK with %d remaining: a check charged", i, out, want)
							}
						}
						for i, out := range spent {
							st := out.Statuses[0]
							if out.OverallCode != over || st.Code != over || st.LimitRemaining != 0 {
								t.Fatalf("check %d on the spent key: %v, want OVER_LIMIT with nothing remaining", i, out)
							}
							if st.DurationUntilReset.AsDuration() <= 0 {
								t.Errorf("check %d: OVER_LIMIT without duration_until_reset: %v", i, st)
							}
						}
						if last.OverallCode != over {
							t.Errorf("a charge after the checks on the spent key: %v, want OVER_LIMIT", last)
						}
						if n := r.metric(t, "floodgate_sidecar_fallback_decisions_total"); n != 0 {
							t.Errorf("%v decisions fell back: the store calls failed", n)
						}
					}
				}
				if backend == "memory" {
					// The in-memory store's clock stands still.
					run(0)()
					return
				}
				// Redis counts on its own clock, the windows in hours: a
				// run a window boundary splits is made again.
				redistest.InOneWindow(t, cc, time.Hour, run)
			})
		}
	}
}
