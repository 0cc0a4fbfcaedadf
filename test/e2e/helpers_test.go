package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

func init() {
	SetDefaultEventuallyTimeout(30 * time.Second)
	SetDefaultEventuallyPollingInterval(100 * time.Millisecond)
}

// apply runs kubectl apply on doc and returns its output.
func apply(ctx context.Context, name, doc string) string {
	GinkgoHelper()
	out, err := stack.Apply(ctx, name, doc)
	Expect(err).NotTo(HaveOccurred())
	return out
}

// kubectl runs kubectl and returns its output.
func kubectl(ctx context.Context, args ...string) string {
	GinkgoHelper()
	out, err := stack.Kubectl.Run(ctx, args...)
	Expect(err).NotTo(HaveOccurred())
	return out
}

// jsonpath reads one field of an object with kubectl, "" when it is unset
// or the object cannot be read.
func jsonpath(ctx context.Context, path string, args ...string) string {
	out, err := stack.Kubectl.Run(ctx, append(args, "-o", "jsonpath="+path)...)
	if err != nil {
		return ""
	}
	return out
}

// condition returns a policy's condition status and reason as
// "Status/Reason", "" when it has none yet.
func condition(ctx context.Context, ns, policy, typ string) string {
	return jsonpath(ctx, fmt.Sprintf(`{.status.conditions[?(@.type=="%[1]s")].status}/{.status.conditions[?(@.type=="%[1]s")].reason}`, typ),
		"-n", ns, "get", "ratelimitpolicy", policy)
}

// waitStoreReady waits until the suite's CounterStore is Ready.
func waitStoreReady(ctx context.Context) {
	GinkgoHelper()
	Eventually(func() string {
		return jsonpath(ctx, `{.status.conditions[?(@.type=="Ready")].status}`, "get", "counterstore", storeName)
	}).WithContext(ctx).WithTimeout(60 * time.Second).Should(Equal("True"))
}

// newNamespace creates a namespace for one Describe with kubectl.
func newNamespace(ctx context.Context, prefix string) string {
	GinkgoHelper()
	ns := prefix + "-" + rand.String(5)
	kubectl(ctx, "create", "namespace", ns)
	DeferCleanup(func(ctx SpecContext) {
		// envtest runs no namespace controller: the namespace stays
		// Terminating, which is harmless; its processes are stopped by
		// their own cleanups.
		_, _ = stack.Kubectl.Run(ctx, "delete", "namespace", ns, "--wait=false")
	})
	return ns
}

// podYAML is an app pod opted in to injection, serving "http" on 8080.
func podYAML(ns, name, app string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels: {app: %s}
  annotations:
    floodgate.dev/inject: "true"
spec:
  containers:
  - name: app
    image: example.com/%s:1.0
    ports:
    - {name: http, containerPort: 8080}
`, name, ns, app, app)
}

// exactStore is the Redis call budget of the sidecars whose specs count
// exactly: one the busiest test machine meets. A call that runs out of
// the default 50ms there (a sidecar's first call to a shard dials,
// authenticates and loads the scripts) is decided by the rule's failure
// mode instead, which exact counts do not allow for. What the sidecars do
// when Redis is slow or gone is test/faults' and test/failopen's; the
// fleet and the outage here run on the default budget.
var exactStore = []string{"--redis-timeout=10s"}

// member is one injected pod run locally: its backend and its sidecar.
type member struct {
	pod     string
	backend *simnode.Backend
	sidecar *simnode.Sidecar
}

// startMember starts a backend and the pod's injected sidecar in front of
// it, with args after the injected ones. The caller stops them with stop.
func startMember(ctx context.Context, ns, pod string, args ...string) *member {
	GinkgoHelper()
	b, err := simnode.StartBackend(pod)
	Expect(err).NotTo(HaveOccurred())
	sc, err := stack.StartSidecar(ctx, simnode.SidecarOptions{Namespace: ns, Pod: pod, Upstream: b.URL, Args: args})
	if err != nil {
		_ = b.Close()
	}
	Expect(err).NotTo(HaveOccurred())
	return &member{pod: pod, backend: b, sidecar: sc}
}

// stop stops the sidecar, then the backend.
func (m *member) stop() {
	m.sidecar.Proc.Stop(10 * time.Second)
	_ = m.backend.Close()
}

// startFleet creates n annotated pods app-0..app-(n-1) selected by a policy
// already applied in ns, runs their sidecars until the calling node's
// cleanup (the spec, or the ordered container for BeforeAll), plays the
// kubelet for each,
// and waits until every sidecar enforces the namespace's current revision,
// compiled for n ready replicas, and the policy is Programmed. The
// sidecars run with args after the injected ones.
func startFleet(ctx context.Context, ns, app, policy string, n int, args ...string) []*member {
	GinkgoHelper()
	var docs []string
	for i := range n {
		docs = append(docs, podYAML(ns, fmt.Sprintf("%s-%d", app, i), app))
	}
	apply(ctx, app+"-pods.yaml", strings.Join(docs, "---\n"))
	fleet := make([]*member, n)
	for i := range n {
		fleet[i] = startMember(ctx, ns, fmt.Sprintf("%s-%d", app, i), args...)
		DeferCleanup(fleet[i].stop)
	}
	for _, m := range fleet {
		_, err := stack.WaitPolicyLoaded(ctx, ns, m.pod, 30*time.Second)
		Expect(err).NotTo(HaveOccurred())
		Expect(stack.MarkPodReady(ctx, ns, m.pod)).To(Succeed())
	}
	Eventually(func(g Gomega) {
		c := compiled(ctx, ns)
		g.Expect(c).NotTo(BeNil())
		var replicas []int32
		for _, p := range c.Policies {
			if p.Name == policy {
				replicas = append(replicas, p.Replicas)
			}
		}
		g.Expect(replicas).To(Equal([]int32{int32(n)}), "the local share is limit/%d", n)
		for _, m := range fleet {
			rev, err := m.sidecar.Revision(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(rev).To(Equal(c.Revision), "sidecar of %s", m.pod)
		}
		g.Expect(condition(ctx, ns, policy, "Programmed")).To(Equal("True/Programmed"))
	}).WithContext(ctx).Should(Succeed())
	return fleet
}

// settledRevision waits until the manager has compiled what the spec
// built for policy, and returns the document's revision: the document
// holds the policy's current generation with exactly ready as its replica
// pods (so no pod event the manager has yet to see can recompile it), and
// the policy's status describes that generation with targeted pods. The
// policy is read before the document, so the document checked is at least
// as new as the status. A spec that asserts on a revision reads it here.
func settledRevision(ctx context.Context, ns, policy string, targeted int64, ready ...string) string {
	GinkgoHelper()
	dyn, err := dynamic.NewForConfig(stack.Config)
	Expect(err).NotTo(HaveOccurred())
	policies := dyn.Resource(v1alpha1.GroupVersion.WithResource("ratelimitpolicies")).Namespace(ns)
	var rev string
	Eventually(func(g Gomega) {
		p, err := policies.Get(ctx, policy, metav1.GetOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		observed, _, _ := unstructured.NestedInt64(p.Object, "status", "observedGeneration")
		g.Expect(observed).To(Equal(p.GetGeneration()), "the status of %s", policy)
		got, _, _ := unstructured.NestedInt64(p.Object, "status", "targetedPods")
		g.Expect(got).To(Equal(targeted), "the targeted pods of %s", policy)
		c := compiled(ctx, ns)
		g.Expect(c).NotTo(BeNil(), "the document of %s", ns)
		i := slices.IndexFunc(c.Policies, func(e config.Policy) bool { return e.Name == policy })
		g.Expect(i).To(BeNumerically(">=", 0), "policy %s in revision %s", policy, c.Revision)
		e := c.Policies[i]
		g.Expect(e.Generation).To(Equal(p.GetGeneration()), "the generation of %s in revision %s", policy, c.Revision)
		var replicas []string
		for _, j := range e.ReplicaPods {
			g.Expect(int(j)).To(BeNumerically("<", len(c.Pods)))
			replicas = append(replicas, c.Pods[j])
		}
		g.Expect(replicas).To(ConsistOf(ready), "replica pods of %s in revision %s", policy, c.Revision)
		rev = c.Revision
	}).WithContext(ctx).Should(Succeed(), "the manager settles on the generation and pods of %s", policy)
	return rev
}

// compiled returns the namespace's compiled sidecar config, or nil.
func compiled(ctx context.Context, ns string) *config.Config {
	cm, err := stack.Kube.CoreV1().ConfigMaps(ns).Get(ctx, config.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	c, err := config.Parse([]byte(cm.Data[config.DataKey]))
	if err != nil {
		return nil
	}
	return c
}

// httpClient reuses connections to the sidecars; each worker of a load
// loop holds at most one.
var httpClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 32, DisableCompression: true},
}

// reply is one answer.
type reply struct {
	status int
	header http.Header
	body   string
}

// send makes one request; hdr is name, value pairs.
func send(ctx context.Context, base, method, path string, hdr ...string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return reply{}, fmt.Errorf("reading the answer to %s %s: %w", method, path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(body)}, nil
}

// mustSend makes one request and fails the spec on a transport error.
func mustSend(ctx context.Context, base, method, path string, hdr ...string) reply {
	GinkgoHelper()
	r, err := send(ctx, base, method, path, hdr...)
	Expect(err).NotTo(HaveOccurred())
	return r
}

// statuses sends n requests in a row and returns their statuses.
func statuses(ctx context.Context, base string, n int, method, path string, hdr ...string) []int {
	GinkgoHelper()
	out := make([]int, 0, n)
	for range n {
		out = append(out, mustSend(ctx, base, method, path, hdr...).status)
	}
	return out
}

// repeat returns n copies of v.
func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// load is what a load run saw.
type load struct {
	// byStatus counts answers by status over all sidecars; perSidecar by
	// sidecar.
	byStatus   map[int]int
	perSidecar []map[int]int
	// transportErrors counts requests that got no answer.
	transportErrors int
	// span runs from the first request sent to the last answer received.
	span time.Duration
	// check holds the first answer that failed the run's check, if any.
	check error
}

// loadSpec describes a load run: workers per sidecar, each sending one
// request, pausing, and again, until the duration has passed.
type loadSpec struct {
	duration   time.Duration
	workers    int
	pause      time.Duration
	method     string
	path       string
	header     []string
	checkReply func(reply) error
}

// drive runs a bounded load over every sidecar at once.
func drive(ctx context.Context, fleet []*member, ls loadSpec) load {
	res := load{byStatus: map[int]int{}, perSidecar: make([]map[int]int, len(fleet))}
	for i := range res.perSidecar {
		res.perSidecar[i] = map[int]int{}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(ls.duration)
	var last time.Time
	for i, m := range fleet {
		for range ls.workers {
			wg.Go(func() {
				defer GinkgoRecover()
				for time.Now().Before(end) && ctx.Err() == nil {
					r, err := send(ctx, m.sidecar.URL, ls.method, ls.path, ls.header...)
					now := time.Now()
					mu.Lock()
					if now.After(last) {
						last = now
					}
					if err != nil {
						res.transportErrors++
					} else {
						res.byStatus[r.status]++
						res.perSidecar[i][r.status]++
						if ls.checkReply != nil && res.check == nil {
							if cerr := ls.checkReply(r); cerr != nil {
								res.check = fmt.Errorf("sidecar %s: %w", m.pod, cerr)
							}
						}
					}
					mu.Unlock()
					if ls.pause > 0 {
						time.Sleep(ls.pause)
					}
				}
			})
		}
	}
	wg.Wait()
	res.span = last.Sub(start)
	return res
}

// warmUp brings every sidecar of fleet to the state a spec that asserts
// on its store's answers needs: connected to every master of the cluster,
// with the scripts loaded there, and with every shard's last call
// answered (fallback_active 0). A sidecar's first call to a shard loads
// the slot map, dials, authenticates and loads the script, which on a busy
// machine can miss the default call budget, and the rule then follows its
// failure mode: warmUp's own requests, on keys of their own
// (X-Tenant: warmup-<pod>-<n>, GET path), are not asserted on. It does not
// change the budget the sidecars run on, nor any key the spec counts.
func warmUp(ctx context.Context, fleet []*member, path string) {
	GinkgoHelper()
	masters, err := cluster.Masters(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(masters).NotTo(BeEmpty())
	for _, m := range fleet {
		n := 0
		Eventually(func(g Gomega) {
			n++
			_, err := send(ctx, m.sidecar.URL, http.MethodGet, path, "X-Tenant", fmt.Sprintf("warmup-%s-%d", m.pod, n))
			g.Expect(err).NotTo(HaveOccurred())
			for _, master := range masters {
				ok, err := m.sidecar.Metric(ctx, "floodgate_sidecar_store_operations_total", map[string]string{"shard": master.Addr(), "result": "ok"})
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(ok).To(BeNumerically(">", 0), "calls of %s answered by master %s", m.pod, master.Addr())
			}
			active, err := m.sidecar.Metric(ctx, "floodgate_sidecar_fallback_active", nil)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(active).To(BeZero(), "fallback_active of %s", m.pod)
		}).WithContext(ctx).WithPolling(10*time.Millisecond).Should(Succeed(), "%s calls every master and its last calls were answered", m.pod)
		AddReportEntry("warm-up of "+m.pod, fmt.Sprintf("%d requests on keys of their own until it had called all %d masters", n, len(masters)))
	}
}

// backendHits sums what the fleet's backends received.
func backendHits(fleet []*member) int64 {
	var n int64
	for _, m := range fleet {
		n += m.backend.Hits()
	}
	return n
}

// metricSum sums a sidecar metric over the fleet.
func metricSum(ctx context.Context, fleet []*member, name string, match map[string]string) float64 {
	GinkgoHelper()
	var sum float64
	for _, m := range fleet {
		v, err := m.sidecar.Metric(ctx, name, match)
		Expect(err).NotTo(HaveOccurred())
		sum += v
	}
	return sum
}
