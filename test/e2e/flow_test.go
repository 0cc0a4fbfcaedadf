package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

// watchGeneration returns a channel that receives the time at which a
// watch saw the policy reach generation gen.
func watchGeneration(ctx context.Context, ns, name string, gen int64) <-chan time.Time {
	GinkgoHelper()
	dyn, err := dynamic.NewForConfig(stack.Config)
	Expect(err).NotTo(HaveOccurred())
	gvr := v1alpha1.GroupVersion.WithResource("ratelimitpolicies")
	w, err := dyn.Resource(gvr).Namespace(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(w.Stop)
	seen := make(chan time.Time, 1)
	go func() {
		for ev := range w.ResultChan() {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && u.GetGeneration() >= gen {
				seen <- time.Now()
				return
			}
		}
	}()
	return seen
}

// maxRefillRuns bounds the runs of inOneRefill: each one that is run
// again took longer than a token's refill, seconds for a few requests,
// which even a busy machine does not do several times in a row.
const maxRefillRuns = 5

// inOneRefill sends n requests in a row with do, on key, and returns the
// answers, for a run that the store decided within refill (the time a
// TokenBucket or GCRA rule takes to refill one token) on Redis's clock, by
// which it decides: the answers of such a run are exact, with no token
// coming back between them, however fast or slow the machine ran it. The
// run is bracketed by two reads of that clock (every node of the suite's
// cluster runs on this machine's clock), before the first request is sent
// and after the last answer came, so the bracket holds every decision. A
// slower run (a busy machine) is run again on a fresh key, key-2, key-3,
// ..., whose bucket is full; admittedBefore counts what those slower runs
// admitted, which the backend received too.
func inOneRefill(ctx context.Context, n int, refill time.Duration, do func(key string) reply, key string) (replies []reply, admittedBefore int) {
	GinkgoHelper()
	rc := cluster.NewClient()
	defer func() { _ = rc.Close() }()
	now := func() time.Time {
		GinkgoHelper()
		at, err := rc.Time(ctx).Result()
		Expect(err).NotTo(HaveOccurred(), "reading Redis's clock")
		return at
	}
	for run := 1; ; run++ {
		k := key
		if run > 1 {
			k = fmt.Sprintf("%s-%d", key, run)
		}
		from := now()
		replies = make([]reply, 0, n)
		for range n {
			replies = append(replies, do(k))
		}
		to := now()
		if took := to.Sub(from); took < refill {
			AddReportEntry(fmt.Sprintf("%d requests within one token's refill (%s)", n, refill),
				fmt.Sprintf("run %d, on key %q, took %s on Redis's clock", run, k, took.Round(time.Millisecond)))
			return replies, admittedBefore
		}
		for _, r := range replies {
			if r.status == http.StatusOK {
				admittedBefore++
			}
		}
		msg := fmt.Sprintf("%d requests on key %q took %s on Redis's clock (%s to %s), not within one token's refill of %s",
			n, k, to.Sub(from).Round(time.Millisecond), from.Format(time.StampMicro), to.Format(time.StampMicro), refill)
		Expect(run).To(BeNumerically("<", maxRefillRuns), "%d runs in a row were slower than a token's refill; the last: %s", run, msg)
		_, _ = fmt.Fprintf(GinkgoWriter, "%s: run again on a fresh key\n", msg)
	}
}

// checkoutPolicy is the flow's policy; perKey per per is the per-API-key
// limit that the live edit changes.
func checkoutPolicy(ns string, perKey int, per string) string {
	return fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: checkout
  namespace: %s
spec:
  podSelector:
    matchLabels: {app: checkout}
  storeRef: {name: %s}
  rules:
  - name: per-api-key
    match:
      path: {type: Prefix, value: /api/}
    key:
    - header: X-API-Key
    limit: {requests: %d, per: %s, algorithm: TokenBucket}
  - name: login-per-ip
    match:
      path: {type: Exact, value: /login}
      methods: [POST]
    key:
    - clientIP: {}
    limit: {requests: 3, per: 1m, algorithm: GCRA}
    failureMode: Closed
`, ns, storeName, perKey, per)
}

var _ = Describe("the demo flow, asserted", Ordered, func() {
	var (
		ns string
		m  *member
	)

	BeforeAll(func(ctx SpecContext) {
		ns = newNamespace(ctx, "flow")
	})
	AfterAll(func() {
		if m != nil {
			m.stop()
		}
	})

	It("applied the CRDs with kubectl and they are Established", func(ctx SpecContext) {
		Expect(stack.CRDApply).To(ContainSubstring("customresourcedefinition.apiextensions.k8s.io/counterstores.ratelimit.floodgate.dev"))
		Expect(stack.CRDApply).To(ContainSubstring("customresourcedefinition.apiextensions.k8s.io/ratelimitpolicies.ratelimit.floodgate.dev"))
		for _, crd := range []string{"counterstores.ratelimit.floodgate.dev", "ratelimitpolicies.ratelimit.floodgate.dev"} {
			Expect(jsonpath(ctx, `{.status.conditions[?(@.type=="Established")].status}`, "get", "crd", crd)).To(Equal("True"), crd)
		}
	})

	It("brings the CounterStore applied with kubectl to Ready, covering every slot", func(ctx SpecContext) {
		waitStoreReady(ctx)
		// Another Describe may have just brought the store back from an
		// outage: the node counts follow within the controller's resync.
		Eventually(func() string {
			return jsonpath(ctx, "{.status.slotsCovered} {.status.nodes.primaries}/{.status.nodes.replicas}/{.status.nodes.failed}", "get", "counterstore", storeName)
		}).WithContext(ctx).Should(Equal("16384 3/3/0"))
	})

	It("accepts a policy applied with kubectl", func(ctx SpecContext) {
		Expect(apply(ctx, "checkout-policy.yaml", checkoutPolicy(ns, 5, "10s"))).To(Equal("ratelimitpolicy.ratelimit.floodgate.dev/checkout created"))
		Eventually(func() string { return condition(ctx, ns, "checkout", "Accepted") }).WithContext(ctx).Should(Equal("True/Accepted"))
	})

	It("injects exactly one sidecar into an annotated pod", func(ctx SpecContext) {
		apply(ctx, "checkout-pod.yaml", podYAML(ns, "checkout-0", "checkout"))
		pod, err := stack.Kube.CoreV1().Pods(ns).Get(ctx, "checkout-0", metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		var names []string
		for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			names = append(names, c.Name)
		}
		Expect(names).To(ConsistOf("app", config.ContainerName), "exactly one injected sidecar next to the app")
		sc, err := simnode.InjectedSidecar(pod)
		Expect(err).NotTo(HaveOccurred())
		Expect(sc.Image).To(Equal(simnode.DefaultSidecarImage))
		Expect(pod.Spec.ReadinessGates).To(ContainElement(HaveField("ConditionType", corev1.PodConditionType(config.ConditionPolicyLoaded))))
		AddReportEntry("injected sidecar args", sc.Args)
		By("reporting Programmed=False until the sidecar reports the revision")
		Eventually(func() string { return condition(ctx, ns, "checkout", "Programmed") }).WithContext(ctx).
			Should(Equal("False/WaitingForSidecars"))
	})

	It("runs the injected sidecar in front of a real backend and turns Programmed=True once it reports its revision", func(ctx SpecContext) {
		m = startMember(ctx, ns, "checkout-0", exactStore...)
		Expect(m.sidecar.Args[:len(m.sidecar.Injected.Args)]).To(Equal(m.sidecar.Injected.Args), "the injected args come first")
		Expect(m.sidecar.Env).To(ContainElements("FLOODGATE_KUBERNETES=true", "POD_NAME=checkout-0", "POD_NAMESPACE="+ns))
		_, err := stack.WaitPolicyLoaded(ctx, ns, "checkout-0", 30*time.Second)
		Expect(err).NotTo(HaveOccurred())
		// checkout-0 is targeted, not yet Ready: the sidecar reports the
		// revision the manager settles on for that.
		reportsOnPod := func(rev string) {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				c, err := stack.PolicyLoaded(ctx, ns, "checkout-0")
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(corev1.ConditionTrue))
				g.Expect(c.Message).To(Equal(rev))
			}).WithContext(ctx).Should(Succeed(), "checkout-0 reports revision %s", rev)
			Expect(m.sidecar.Revision(ctx)).To(Equal(rev))
		}
		reportsOnPod(settledRevision(ctx, ns, "checkout", 1))
		Expect(stack.MarkPodReady(ctx, ns, "checkout-0")).To(Succeed())
		// Ready, it is a replica of the policy: a new revision.
		reportsOnPod(settledRevision(ctx, ns, "checkout", 1, "checkout-0"))
		Eventually(func() string { return condition(ctx, ns, "checkout", "Programmed") }).WithContext(ctx).Should(Equal("True/Programmed"))
		Expect(jsonpath(ctx, "{.status.enforcingPods}/{.status.targetedPods}", "-n", ns, "get", "rlp", "checkout")).To(Equal("1/1"))
	})

	It("enforces each rule exactly, with 429, Retry-After and the rate-limit headers, and the backend sees only what is allowed", func(ctx SpecContext) {
		hits0 := m.backend.Hits()
		ordersHits0 := m.backend.PathHits("/api/orders")
		By("alice: 8 requests against 5 per 10 s")
		alice, admittedBefore := inOneRefill(ctx, 8, 2*time.Second, func(key string) reply {
			return mustSend(ctx, m.sidecar.URL, http.MethodGet, "/api/orders", "X-API-Key", key)
		}, "alice")
		var codes, remaining []string
		for _, r := range alice {
			codes = append(codes, strconv.Itoa(r.status))
			remaining = append(remaining, r.header.Get("X-RateLimit-Remaining"))
		}
		Expect(codes).To(Equal([]string{"200", "200", "200", "200", "200", "429", "429", "429"}))
		Expect(remaining).To(Equal([]string{"4", "3", "2", "1", "0", "0", "0", "0"}))
		for _, r := range alice {
			Expect(r.header.Get("X-RateLimit-Limit")).To(Equal("5"))
			Expect(r.header.Get("RateLimit-Policy")).To(Equal(`"checkout.per-api-key";q=5;w=10`))
			Expect(r.header.Get("X-RateLimit-Reset")).To(MatchRegexp(`^[0-9]+$`))
			Expect(r.header.Get("RateLimit")).To(MatchRegexp(`^"checkout\.per-api-key";r=[0-4];t=[0-9]+$`))
		}
		denied := alice[5]
		retry, err := strconv.Atoi(denied.header.Get("Retry-After"))
		Expect(err).NotTo(HaveOccurred(), "Retry-After %q", denied.header.Get("Retry-After"))
		Expect(retry).To(BeNumerically(">=", 1))
		Expect(retry).To(BeNumerically("<=", 2), "one token of 5 per 10 s refills within 2 s")
		Expect(denied.header.Get("Content-Type")).To(Equal("application/problem+json"))
		var problem struct {
			Status     int    `json:"status"`
			Detail     string `json:"detail"`
			RetryAfter int    `json:"retryAfter"`
		}
		Expect(json.Unmarshal([]byte(denied.body), &problem)).To(Succeed())
		Expect(problem.Status).To(Equal(http.StatusTooManyRequests))
		Expect(problem.Detail).To(ContainSubstring("rule per-api-key"))
		Expect(problem.RetryAfter).To(Equal(retry))
		AddReportEntry("first 429", fmt.Sprintf("Retry-After: %s; RateLimit: %s; body %s", denied.header.Get("Retry-After"), denied.header.Get("RateLimit"), denied.body))

		By("bob, another key, is not affected")
		Expect(statuses(ctx, m.sidecar.URL, 3, http.MethodGet, "/api/orders", "X-API-Key", "bob")).To(Equal(repeat(200, 3)))

		By("logins: 3 per minute per client IP, POST only")
		Expect(statuses(ctx, m.sidecar.URL, 5, http.MethodPost, "/login")).To(Equal([]int{200, 200, 200, 429, 429}))
		Expect(statuses(ctx, m.sidecar.URL, 2, http.MethodGet, "/login")).To(Equal(repeat(200, 2)), "GET /login matches no rule")

		Expect(m.backend.Hits()-hits0).To(Equal(int64(admittedBefore+5+3+3+2)), "the backend receives exactly the allowed requests")
		Expect(m.backend.PathHits("/api/orders") - ordersHits0).To(Equal(int64(admittedBefore + 5 + 3)))
	})

	It("refuses invalid policies at admission, naming the field", func(ctx SpecContext) {
		bad := func(limit, path string) string {
			return fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: broken
  namespace: %s
spec:
  podSelector: {}
  storeRef: {name: %s}
  rules:
  - name: typo
    match:
      path: %s
    key: [{header: X-API-Key}]
    limit: %s
`, ns, storeName, path, limit)
		}
		for _, c := range []struct{ what, doc, field, reason string }{
			{"the OpenAPI schema", bad("{requests: 0, per: 10s}", "{type: Prefix, value: /api/}"),
				"spec.rules[0].limit.requests", "greater than or equal to 1"},
			{"a CEL rule", bad("{requests: 10, per: 10s, burst: 5, algorithm: FixedWindow}", "{type: Prefix, value: /api/}"),
				"spec.rules[0].limit.burst", "burst is only valid with the TokenBucket and GCRA algorithms"},
			{"the validating webhook", bad("{requests: 10, per: 10s}", `{type: RegularExpression, value: "/api/(v1|v2"}`),
				"spec.rules[0].match.path.value", "not a valid RE2 regular expression"},
		} {
			out, err := stack.Apply(ctx, "broken.yaml", c.doc)
			Expect(err).To(HaveOccurred(), "%s let an invalid policy through: %s", c.what, out)
			Expect(out).To(ContainSubstring(c.field), c.what)
			Expect(out).To(ContainSubstring(c.reason), c.what)
			AddReportEntry("refused by "+c.what, out)
		}
		_, err := stack.Kubectl.Run(ctx, "-n", ns, "get", "rlp", "broken")
		Expect(err).To(MatchError(ContainSubstring("NotFound")))
	})

	It("applies a live policy edit within 5 s and reports Programmed=True for the new revision", func(ctx SpecContext) {
		before := settledRevision(ctx, ns, "checkout", 1, "checkout-0")
		// The watch sees when the API server stored the edit: kubectl's
		// own start-up is not part of the loop's latency.
		written := watchGeneration(ctx, ns, "checkout", 2)
		start := time.Now()
		// 20 per hour: the 21 requests on a fresh key below are counted
		// exactly however long they take on a busy machine (at 20 per 10
		// s, a token would come back every half second).
		Expect(apply(ctx, "checkout-policy.yaml", checkoutPolicy(ns, 20, "1h"))).To(Equal("ratelimitpolicy.ratelimit.floodgate.dev/checkout configured"))
		applied := time.Now()
		probes := 0
		Eventually(func() string {
			probes++
			r, err := send(ctx, m.sidecar.URL, http.MethodGet, "/api/orders", "X-API-Key", fmt.Sprintf("probe-%d", probes))
			if err != nil {
				return err.Error()
			}
			return r.header.Get("X-RateLimit-Limit")
		}).WithContext(ctx).WithTimeout(5*time.Second).WithPolling(20*time.Millisecond).Should(Equal("20"),
			"the sidecar enforces the edit within 5 s of kubectl apply returning")
		inForce := time.Now()
		var stored time.Time
		Eventually(written).WithContext(ctx).Should(Receive(&stored))
		Expect(inForce.Sub(stored)).To(BeNumerically("<=", 5*time.Second), "the sidecar enforces the edit within 5 s of the API write")
		AddReportEntry("live policy edit latency",
			fmt.Sprintf("API write -> sidecar enforcing: %s; kubectl apply took %s and the limit was in force %s after it returned (%s from its start)",
				inForce.Sub(stored).Round(time.Millisecond), applied.Sub(start).Round(time.Millisecond),
				inForce.Sub(applied).Round(time.Millisecond), inForce.Sub(start).Round(time.Millisecond)))

		By("enforcing the new limit exactly on a fresh key")
		Expect(statuses(ctx, m.sidecar.URL, 21, http.MethodGet, "/api/orders", "X-API-Key", "carol")).To(Equal(append(repeat(200, 20), 429)))

		By("reporting the new revision on the pod, and Programmed=True for the new generation")
		after := settledRevision(ctx, ns, "checkout", 1, "checkout-0")
		Expect(after).NotTo(Equal(before))
		Expect(m.sidecar.Revision(ctx)).To(Equal(after))
		Eventually(func() string {
			c, err := stack.PolicyLoaded(ctx, ns, "checkout-0")
			if err != nil || c == nil {
				return ""
			}
			return c.Message
		}).WithContext(ctx).Should(Equal(after))
		Eventually(func() string {
			return jsonpath(ctx, `{.metadata.generation}/{.status.conditions[?(@.type=="Programmed")].observedGeneration}/{.status.conditions[?(@.type=="Programmed")].status}`,
				"-n", ns, "get", "rlp", "checkout")
		}).WithContext(ctx).Should(Equal("2/2/True"))
	})
})
