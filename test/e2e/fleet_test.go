package e2e

import (
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("three sidecars sharing one key", func() {
	// The shared limit: 10 per second with a bucket of 20, over 30 s.
	const (
		rate   = 10 // requests per second
		burst  = 20
		window = 30 * time.Second
	)

	It("admit at most limit × window + burst together, and at least 90% of limit × window", func(ctx SpecContext) {
		ns := newNamespace(ctx, "fleet")
		apply(ctx, "fleet-policy.yaml", fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: shared
  namespace: %s
spec:
  podSelector:
    matchLabels: {app: fleet}
  storeRef: {name: %s}
  rules:
  - name: per-tenant
    key:
    - header: X-Tenant
    limit: {requests: %d, per: 1s, burst: %d, algorithm: TokenBucket}
`, ns, storeName, rate, burst))
		Eventually(func() string { return condition(ctx, ns, "shared", "Accepted") }).WithContext(ctx).Should(Equal("True/Accepted"))
		fleet := startFleet(ctx, ns, "fleet", "shared", 3)
		// The load starts on sidecars that have called every master: a
		// first call, cold, may miss the budget and be decided on the
		// fallback bucket, which the bound on those below is not about.
		warmUp(ctx, fleet, "/warmup")
		hits0 := backendHits(fleet)

		fallbackAllowed := func() float64 {
			return metricSum(ctx, fleet, "floodgate_sidecar_fallback_decisions_total", map[string]string{"policy": "shared", "rule": "per-tenant", "result": "allowed"})
		}
		fb0 := fallbackAllowed()
		By(fmt.Sprintf("sending over-limit traffic for one tenant through all three sidecars for %s", window))
		res := drive(ctx, fleet, loadSpec{
			duration: window, workers: 1, pause: 15 * time.Millisecond,
			method: http.MethodGet, path: "/orders", header: []string{"X-Tenant", "acme"},
			checkReply: func(r reply) error {
				if r.status == http.StatusTooManyRequests && r.header.Get("Retry-After") == "" {
					return fmt.Errorf("429 without Retry-After")
				}
				return nil
			},
		})
		admitted := res.byStatus[http.StatusOK]
		// A store call that misses its budget (a loaded CI machine) is
		// decided on the sidecar's fallback bucket of limit/replicas, as
		// failureMode Open says. Those admissions are not the shared count's;
		// the shared count alone must hold the exact bound.
		onFallback := fallbackAllowed() - fb0
		shared := float64(admitted) - onFallback
		total := 0
		for _, n := range res.byStatus {
			total += n
		}
		upper := float64(rate)*res.span.Seconds() + burst
		nominal := rate*int(window/time.Second) + burst
		lower := 0.9 * rate * window.Seconds()
		var per []string
		for i, m := range fleet {
			per = append(per, fmt.Sprintf("%s: %d of %d", m.pod, res.perSidecar[i][http.StatusOK], res.perSidecar[i][http.StatusOK]+res.perSidecar[i][http.StatusTooManyRequests]))
		}
		AddReportEntry("three sidecars, one key, sustained load",
			fmt.Sprintf("admitted %d of %d requests over %s (%.0f on fallback buckets); bound limit×window+burst = %d (nominal 30 s) / %.0f (measured span); floor 90%% of limit×window = %.0f; per sidecar %v",
				admitted, total, res.span.Round(time.Millisecond), onFallback, nominal, upper, lower, per))

		Expect(res.transportErrors).To(BeZero())
		Expect(res.check).NotTo(HaveOccurred())
		Expect(res.byStatus).To(HaveLen(2), "only 200 and 429: %v", res.byStatus)
		Expect(res.byStatus).To(HaveKey(http.StatusTooManyRequests), "the load must exceed the limit")
		Expect(shared).To(BeNumerically("<=", upper), "the shared count admits at most limit × window + burst")
		Expect(onFallback).To(BeNumerically("<=", 0.05*float64(admitted)), "fallback decisions stay rare while the store answers")
		Expect(float64(admitted)).To(BeNumerically(">=", lower), "at least 90%% of limit × window")
		Expect(backendHits(fleet)-hits0).To(Equal(int64(admitted)), "the backends receive exactly the admitted requests")
		for i, m := range fleet {
			Expect(res.perSidecar[i][http.StatusOK]+res.perSidecar[i][http.StatusTooManyRequests]).To(BeNumerically(">", 100),
				"the load is spread over all three sidecars (%s)", m.pod)
		}
	})
})
