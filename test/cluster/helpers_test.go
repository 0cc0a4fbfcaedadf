package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

// watchGeneration returns a channel that receives the time at which a watch
// saw the app's policy stored at generation gen or later: the event that the
// manager and the sidecars react to.
func watchGeneration(ctx context.Context, gen int64) <-chan time.Time {
	GinkgoHelper()
	w, err := k8s.Watch(ctx, &v1alpha1.RateLimitPolicyList{}, client.InNamespace(appNS),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", app)})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(w.Stop)
	seen := make(chan time.Time, 1)
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*v1alpha1.RateLimitPolicy); ok && p.Generation >= gen {
				seen <- time.Now()
				return
			}
		}
	}()
	return seen
}

// answer is what a request got.
type answer struct {
	Status int
	Header http.Header
	Body   string
	// Err is a transport error (no answer at all).
	Err error
}

var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// send sends one request. Every request opens its own connection, so that
// kube-proxy picks a backend pod for each.
func send(ctx context.Context, method, url string, header map[string]string) answer {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return answer{Err: err}
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{Err: err}
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Err: err}
}

// podOf returns the pod name the sample backend put in an allowed answer.
func podOf(a answer) string {
	var b struct {
		Pod string `json:"pod"`
	}
	if json.Unmarshal([]byte(a.Body), &b) != nil {
		return ""
	}
	return b.Pod
}

// hits reads the sample backend's counts from its stats port, which the
// sidecar does not front.
func hits(ctx context.Context, podIP string) map[string]int64 {
	GinkgoHelper()
	a := send(ctx, http.MethodGet, "http://"+podIP+":8081/hits", nil)
	Expect(a.Err).NotTo(HaveOccurred())
	Expect(a.Status).To(Equal(http.StatusOK))
	var h struct {
		Paths map[string]int64 `json:"paths"`
	}
	Expect(json.Unmarshal([]byte(a.Body), &h)).To(Succeed())
	return h.Paths
}

// pathHits sums, over pods, the requests for path that reached the app.
func pathHits(ctx context.Context, pods []corev1.Pod, path string) int64 {
	GinkgoHelper()
	var n int64
	for _, p := range pods {
		n += hits(ctx, p.Status.PodIP)[path]
	}
	return n
}

// fallbackDenied sums, over pods, the sidecars' fail-open denials
// (floodgate_sidecar_fallback_decisions_total{result="denied"}): requests
// a rule's local share answered 429 because a store call failed.
func fallbackDenied(ctx context.Context, pods []corev1.Pod) int64 {
	GinkgoHelper()
	var n float64
	for _, p := range pods {
		v, err := simnode.MetricSum(ctx, "http://"+p.Status.PodIP+":9090/metrics",
			"floodgate_sidecar_fallback_decisions_total", map[string]string{"result": "denied"})
		Expect(err).NotTo(HaveOccurred())
		n += v
	}
	return int64(n)
}

// fallbackDecisions sums, over pods, the sidecars' decisions of rule that
// a local fallback share took with result ("allowed" or "denied")
// because a store call failed or missed its budget.
func fallbackDecisions(ctx context.Context, pods []corev1.Pod, rule, result string) int64 {
	GinkgoHelper()
	var n float64
	for _, p := range pods {
		v, err := simnode.MetricSum(ctx, "http://"+p.Status.PodIP+":9090/metrics",
			"floodgate_sidecar_fallback_decisions_total", map[string]string{"rule": rule, "result": result})
		Expect(err).NotTo(HaveOccurred())
		n += v
	}
	return int64(n)
}

// readyPods returns the Running, Ready, not terminating pods of a
// namespace that match labels.
func readyPods(ctx context.Context, ns string, labels map[string]string) []corev1.Pod {
	GinkgoHelper()
	var list corev1.PodList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels(labels))).To(Succeed())
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && condition(&p, corev1.PodReady) == corev1.ConditionTrue {
			out = append(out, p)
		}
	}
	return out
}

// names returns the pods' names, for short failure messages.
func names(pods []corev1.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Name
	}
	return out
}

// condition returns the status of a pod condition, "" when absent.
func condition(p *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// waitRollout waits until a Deployment has rolled out replicas ready pods.
func waitRollout(ctx context.Context, ns, name string, replicas int32, timeout time.Duration) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var d appsv1.Deployment
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &d)).To(Succeed())
		g.Expect(d.Status.ObservedGeneration).To(Equal(d.Generation))
		g.Expect(d.Status.UpdatedReplicas).To(Equal(replicas))
		g.Expect(d.Status.ReadyReplicas).To(Equal(replicas))
		g.Expect(d.Status.Replicas).To(Equal(replicas), "old pods still terminating")
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(500 * time.Millisecond).Should(Succeed())
}

// processUIDs returns the real user ids of the processes of the node's
// pods (in its kubepods cgroups) whose command line starts with argv0: the
// containers' processes, seen from the node.
func processUIDs(argv0 string) map[int]int {
	GinkgoHelper()
	entries, err := os.ReadDir("/proc")
	Expect(err).NotTo(HaveOccurred())
	uids := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		// Redis rewrites its command line to "redis-server ip:port
		// [cluster]": a space may end the program name too.
		if err != nil || (!strings.HasPrefix(string(cmdline), argv0+"\x00") && !strings.HasPrefix(string(cmdline), argv0+" ")) {
			continue
		}
		// Only containers: tests on this machine run redis-server too.
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(cg), "/kubepods/") {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				uid, _ := strconv.Atoi(f[1])
				uids[pid] = uid
			}
		}
	}
	return uids
}

// expectRunAs checks that n processes of the node's pods run argv0, each
// as uid: the user the image and the securityContext ask for.
func expectRunAs(argv0 string, n, uid int) {
	GinkgoHelper()
	uids := processUIDs(argv0)
	Expect(uids).To(HaveLen(n), "processes running %s", argv0)
	for pid, u := range uids {
		Expect(u).To(Equal(uid), "the uid of %s (pid %d)", argv0, pid)
	}
}

// sidecarOf returns the injected sidecar container of a pod.
func sidecarOf(p *corev1.Pod) *corev1.Container {
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == config.ContainerName {
			return &p.Spec.InitContainers[i]
		}
	}
	return nil
}

// sidecarConfig is the part of a sidecar's /debug/config the suite reads.
type sidecarConfig struct {
	Revision string `json:"revision"`
	Config   struct {
		Store struct {
			Addresses []string `json:"addresses"`
		} `json:"store"`
		Policies []struct {
			Name     string `json:"name"`
			Replicas int32  `json:"replicas"`
		} `json:"policies"`
	} `json:"config"`
}

// debugConfig reads a sidecar's config in force from its admin port.
func debugConfig(ctx context.Context, podIP string) (sidecarConfig, error) {
	var c sidecarConfig
	a := send(ctx, http.MethodGet, "http://"+podIP+":9090/debug/config", nil)
	if a.Err != nil {
		return c, a.Err
	}
	if a.Status != http.StatusOK {
		return c, fmt.Errorf("/debug/config: %d", a.Status)
	}
	return c, json.Unmarshal([]byte(a.Body), &c)
}

// tally counts answers by status; transport errors count under 0.
type tally map[int]int

func (t tally) String() string {
	var b strings.Builder
	for _, s := range []int{0, 200, 429, 503} {
		if t[s] > 0 {
			fmt.Fprintf(&b, " %d:%d", s, t[s])
		}
	}
	for s, n := range t {
		if s != 0 && s != 200 && s != 429 && s != 503 {
			fmt.Fprintf(&b, " %d:%d", s, n)
		}
	}
	return strings.TrimSpace(b.String())
}
