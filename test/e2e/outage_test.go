package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// restoreStore brings every killed Redis node back with its node ID and
// waits until the cluster and the CounterStore are healthy again. It does
// nothing for nodes that run.
func restoreStore(ctx context.Context) {
	GinkgoHelper()
	for _, n := range cluster.Nodes() {
		if !n.Running() {
			Expect(cluster.Restart(n)).To(Succeed())
		}
	}
	Expect(cluster.WaitClusterOK(60 * time.Second)).To(Succeed())
	waitStoreReady(ctx)
}

var _ = Describe("with the store down", Ordered, func() {
	// The fail-open rule's shared limit: 30 per second with a bucket of 6,
	// so each of 3 sidecars falls back to its share, every third token: 10
	// per second, holding at most 2.
	const (
		rate     = 30
		burst    = 6
		replicas = 3
		window   = 10 * time.Second
	)
	var (
		ns     string
		fleet  []*member
		killed time.Time
	)

	BeforeAll(func(ctx SpecContext) {
		ns = newNamespace(ctx, "outage")
		apply(ctx, "outage-policy.yaml", fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: outage
  namespace: %s
spec:
  podSelector:
    matchLabels: {app: outage}
  storeRef: {name: %s}
  rules:
  - name: open
    match:
      path: {type: Exact, value: /open}
    key:
    - header: X-Tenant
    limit: {requests: %d, per: 1s, burst: %d, algorithm: TokenBucket}
    failureMode: Open
  - name: closed
    match:
      path: {type: Exact, value: /closed}
    key:
    - header: X-Tenant
    limit: {requests: 1000, per: 1s, algorithm: TokenBucket}
    failureMode: Closed
`, ns, storeName, rate, burst))
		Eventually(func() string { return condition(ctx, ns, "outage", "Accepted") }).WithContext(ctx).Should(Equal("True/Accepted"))
		fleet = startFleet(ctx, ns, "outage", "outage", replicas)

		By("checking both rules admit while the store is up")
		// Once each sidecar has called every master: a first call, cold,
		// may miss the budget, and /closed would then answer 503.
		warmUp(ctx, fleet, "/closed")
		for _, m := range fleet {
			Expect(mustSend(ctx, m.sidecar.URL, http.MethodGet, "/open", "X-Tenant", "warmup").status).To(Equal(http.StatusOK))
			Expect(mustSend(ctx, m.sidecar.URL, http.MethodGet, "/closed", "X-Tenant", "warmup").status).To(Equal(http.StatusOK))
		}

		By("killing every Redis master and replica")
		DeferCleanup(func(ctx SpecContext) { restoreStore(ctx) }, NodeTimeout(2*time.Minute))
		for _, n := range cluster.Nodes() {
			Expect(cluster.Kill(n)).To(Succeed())
		}
		killed = time.Now()

		By("waiting until every sidecar runs on its fallback")
		Eventually(func(g Gomega) {
			for _, m := range fleet {
				_, err := send(ctx, m.sidecar.URL, http.MethodGet, "/open", "X-Tenant", "probe")
				g.Expect(err).NotTo(HaveOccurred())
				v, err := m.sidecar.Metric(ctx, "floodgate_sidecar_fallback_active", nil)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(v).To(Equal(1.0), "fallback_active of %s", m.pod)
			}
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		AddReportEntry("store killed -> all 3 sidecars on fallback", time.Since(killed).Round(time.Millisecond).String())
	}, NodeTimeout(3*time.Minute))

	It("caps a fail-open rule at 1.1 × the limit across the three sidecars, each on its share of the limit, and still admits", func(ctx SpecContext) {
		hits0 := backendHits(fleet)
		fb0 := metricSum(ctx, fleet, "floodgate_sidecar_fallback_decisions_total", map[string]string{"policy": "outage", "rule": "open", "result": "allowed"})
		res := drive(ctx, fleet, loadSpec{
			duration: window, workers: 1, pause: 10 * time.Millisecond,
			method: http.MethodGet, path: "/open", header: []string{"X-Tenant", "acme"},
		})
		admitted := res.byStatus[http.StatusOK]
		total := 0
		for _, n := range res.byStatus {
			total += n
		}
		// Over the span the decisions were made in, measured: the last
		// answer comes after the nominal window on a busy machine.
		limit := rate * res.span.Seconds()
		var per []string
		for i, m := range fleet {
			per = append(per, fmt.Sprintf("%s: %d", m.pod, res.perSidecar[i][http.StatusOK]))
		}
		AddReportEntry("fail-open with the store down",
			fmt.Sprintf("admitted %d of %d over %s; limit×span = %.0f, bound 1.1× = %.0f, floor 0.5× = %.0f; the shares allow at most burst+rate×span = %.0f; per sidecar %v",
				admitted, total, res.span.Round(time.Millisecond), limit, 1.1*limit, 0.5*limit, burst+rate*res.span.Seconds(), per))

		Expect(res.transportErrors).To(BeZero())
		Expect(res.byStatus).To(HaveKey(http.StatusTooManyRequests), "the load must exceed the limit")
		Expect(res.byStatus).To(HaveLen(2), "a fail-open rule answers 200 or 429, never 503: %v", res.byStatus)
		Expect(float64(admitted)).To(BeNumerically("<=", 1.1*limit), "at most 1.1 × the limit")
		Expect(float64(admitted)).To(BeNumerically(">=", 0.5*limit), "fail-open still admits")
		for i, m := range fleet {
			Expect(res.perSidecar[i][http.StatusOK]).To(BeNumerically(">", 0), "%s admits on its local bucket", m.pod)
		}
		Expect(backendHits(fleet) - hits0).To(Equal(int64(admitted)))
		fb := metricSum(ctx, fleet, "floodgate_sidecar_fallback_decisions_total", map[string]string{"policy": "outage", "rule": "open", "result": "allowed"})
		Expect(fb-fb0).To(Equal(float64(admitted)), "every admission was a fallback decision")
	})

	It("rejects a fail-closed rule with 503 and Retry-After", func(ctx SpecContext) {
		closedHits := int64(0)
		for _, m := range fleet {
			closedHits += m.backend.PathHits("/closed")
		}
		un0 := metricSum(ctx, fleet, "floodgate_sidecar_decisions_total", map[string]string{"policy": "outage", "rule": "closed", "result": "unavailable"})
		for i := range 30 {
			m := fleet[i%len(fleet)]
			r := mustSend(ctx, m.sidecar.URL, http.MethodGet, "/closed", "X-Tenant", "acme")
			Expect(r.status).To(Equal(http.StatusServiceUnavailable), "request %d via %s: %s", i, m.pod, r.body)
			retry, err := strconv.Atoi(r.header.Get("Retry-After"))
			Expect(err).NotTo(HaveOccurred(), "Retry-After %q", r.header.Get("Retry-After"))
			Expect(retry).To(BeNumerically(">=", 1))
			if i == 0 {
				AddReportEntry("fail-closed answer", fmt.Sprintf("%d, Retry-After: %s, %s", r.status, r.header.Get("Retry-After"), r.body))
			}
		}
		after := int64(0)
		for _, m := range fleet {
			after += m.backend.PathHits("/closed")
		}
		Expect(after).To(Equal(closedHits), "no rejected request reaches the app")
		un := metricSum(ctx, fleet, "floodgate_sidecar_decisions_total", map[string]string{"policy": "outage", "rule": "closed", "result": "unavailable"})
		Expect(un - un0).To(Equal(30.0))
	})

	It("recomputes the local share within 10 s when the app scales from 3 to 6 pods during the outage, and caps the six at 1.1 × the limit", func(ctx SpecContext) {
		By("starting three more pods while the store is down")
		var docs []string
		for i := replicas; i < 2*replicas; i++ {
			docs = append(docs, podYAML(ns, fmt.Sprintf("outage-%d", i), "outage"))
		}
		apply(ctx, "outage-more-pods.yaml", strings.Join(docs, "---\n"))
		var more []*member
		for i := replicas; i < 2*replicas; i++ {
			m := startMember(ctx, ns, fmt.Sprintf("outage-%d", i))
			DeferCleanup(m.stop)
			more = append(more, m)
		}
		for _, m := range more {
			_, err := stack.WaitPolicyLoaded(ctx, ns, m.pod, 30*time.Second)
			Expect(err).NotTo(HaveOccurred())
			Expect(stack.MarkPodReady(ctx, ns, m.pod)).To(Succeed())
		}
		ready := time.Now()
		all := append(append([]*member(nil), fleet...), more...)

		By("waiting until every sidecar enforces the share of six")
		Eventually(func(g Gomega) {
			for _, m := range all {
				g.Expect(inForceReplicas(ctx, m, "outage")).To(Equal(int32(2*replicas)), "sidecar of %s", m.pod)
			}
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		recomputed := time.Since(ready)
		AddReportEntry("scale 3 -> 6 pods during the outage: last new pod Ready -> all six sidecars on the share of 6 (bound 10s)", recomputed.Round(time.Millisecond).String())
		Expect(recomputed).To(BeNumerically("<=", 10*time.Second))

		By("driving over-limit traffic through all six")
		res := drive(ctx, all, loadSpec{
			duration: window, workers: 1, pause: 10 * time.Millisecond,
			method: http.MethodGet, path: "/open", header: []string{"X-Tenant", "scaled"},
		})
		admitted := res.byStatus[http.StatusOK]
		limit := rate * res.span.Seconds()
		var per []string
		for i, m := range all {
			per = append(per, fmt.Sprintf("%s: %d", m.pod, res.perSidecar[i][http.StatusOK]))
		}
		AddReportEntry("fail-open with the store down, 6 sidecars after the scale-up",
			fmt.Sprintf("admitted %d over %s; limit×span = %.0f, bound 1.1× = %.0f (each sidecar on limit/6, bucket burst/6); per sidecar %v",
				admitted, res.span.Round(time.Millisecond), limit, 1.1*limit, per))
		Expect(res.transportErrors).To(BeZero())
		Expect(res.byStatus).To(HaveKey(http.StatusTooManyRequests), "the load must exceed the limit")
		Expect(float64(admitted)).To(BeNumerically("<=", 1.1*limit), "the six together stay within 1.1 × the limit")
		Expect(float64(admitted)).To(BeNumerically(">=", 0.5*limit), "fail-open still admits")
	})

	It("counts in the store again once it is back", func(ctx SpecContext) {
		outage := time.Since(killed)
		restoreStore(ctx)
		back := time.Now()
		Eventually(func(g Gomega) {
			for _, m := range fleet {
				r, err := send(ctx, m.sidecar.URL, http.MethodGet, "/closed", "X-Tenant", "after")
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(r.status).To(Equal(http.StatusOK), "%s", m.pod)
				v, err := m.sidecar.Metric(ctx, "floodgate_sidecar_fallback_active", nil)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(v).To(BeZero(), "fallback_active of %s", m.pod)
			}
		}).WithContext(ctx).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		AddReportEntry("store outage", fmt.Sprintf("down %s; sidecars back on the store %s after the cluster was ok", outage.Round(time.Millisecond), time.Since(back).Round(time.Millisecond)))
	}, NodeTimeout(3*time.Minute))
})

// inForceReplicas returns the replica count of policy in the config that
// m's sidecar has in force (its /debug/config): the count its fallback
// share divides the limit by.
func inForceReplicas(ctx context.Context, m *member, policy string) int32 {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.sidecar.AdminURL+"/debug/config", nil)
	Expect(err).NotTo(HaveOccurred())
	resp, err := httpClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	var st struct {
		Config struct {
			Policies []struct {
				Name     string `json:"name"`
				Replicas int32  `json:"replicas"`
			} `json:"policies"`
		} `json:"config"`
	}
	Expect(json.NewDecoder(resp.Body).Decode(&st)).To(Succeed())
	for _, p := range st.Config.Policies {
		if p.Name == policy {
			return p.Replicas
		}
	}
	return 0
}
