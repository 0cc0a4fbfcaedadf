package usage

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// sidecar serves a usage report that the test changes.
type sidecar struct {
	srv  *httptest.Server
	mu   sync.Mutex
	rep  config.Usage
	port int32
}

func newSidecar(t *testing.T, started time.Time) *sidecar {
	t.Helper()
	s := &sidecar{rep: config.Usage{Started: started}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != config.UsagePath {
			http.NotFound(w, r)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(s.rep)
	}))
	t.Cleanup(s.srv.Close)
	_, port, _ := net.SplitHostPort(s.srv.Listener.Addr().String())
	n, _ := strconv.Atoi(port)
	s.port = int32(n)
	return s
}

// set replaces the report's rules, and its start time when non-zero.
func (s *sidecar) set(started time.Time, rules ...config.RuleUsage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !started.IsZero() {
		s.rep.Started = started
	}
	s.rep.Rules = rules
}

// startAPI starts envtest's kube-apiserver for pods.
func startAPI(t *testing.T) client.Client {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is unset: run with KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)")
	}
	env := &envtest.Environment{}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runPod creates a Running pod on 127.0.0.1 whose sidecar's admin port is
// the sidecar server's port; native puts the sidecar among the init
// containers, as the injector does where native sidecars exist.
func runPod(ctx context.Context, t *testing.T, c client.Client, ns, name string, s *sidecar, native bool) {
	t.Helper()
	always := corev1.ContainerRestartPolicyAlways
	side := corev1.Container{Name: config.ContainerName, Image: "registry.invalid/sidecar:1",
		Ports: []corev1.ContainerPort{{Name: injection.AdminPortName, ContainerPort: s.port}}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
	}
	if native {
		side.RestartPolicy = &always
		pod.Spec.InitContainers = []corev1.Container{side}
	} else {
		pod.Spec.Containers = append(pod.Spec.Containers, side)
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = "127.0.0.1"
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

func TestCollector(t *testing.T) {
	ctx := t.Context()
	c := startAPI(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := t0
	a := newSidecar(t, t0.Add(-time.Hour))
	b := newSidecar(t, t0.Add(-time.Hour))
	runPod(ctx, t, c, "shop", "api-0", a, false)
	runPod(ctx, t, c, "shop", "api-1", b, true)
	// A pod without the sidecar is not read.
	if err := c.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: "shop"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "registry.invalid/db:1"}}}}); err != nil {
		t.Fatal(err)
	}
	col := New(c, Options{Window: 5 * time.Minute, Now: func() time.Time { return now }})

	rule := func(denied, shadow, exempt uint64) config.RuleUsage {
		return config.RuleUsage{Policy: "checkout", Rule: "per-user", Denied: denied, ShadowDenied: shadow, Exempt: exempt, Allowed: 1000}
	}
	counts := func() policy.RuleCounts {
		t.Helper()
		u := col.For("shop", "checkout")
		if u == nil {
			t.Fatal("no usage for shop/checkout")
		}
		if u.Pods != 2 || u.Window != 5*time.Minute {
			t.Errorf("usage of %d pods over %v, want 2 pods over 5m", u.Pods, u.Window)
		}
		return u.Rules["per-user"]
	}
	drain := func() int {
		n := 0
		for {
			select {
			case <-col.Updates():
				n++
			default:
				return n
			}
		}
	}

	// Long-running sidecars: their counts so far are older than the
	// window, so the first read is the baseline.
	a.set(time.Time{}, rule(10, 0, 0))
	b.set(time.Time{}, rule(20, 0, 0))
	col.Collect(ctx)
	if got, want := counts(), (policy.RuleCounts{}); got != want {
		t.Errorf("first read: %+v, want %+v", got, want)
	}
	if n := drain(); n != 1 {
		t.Errorf("%d update events after the first read, want 1", n)
	}

	now = t0.Add(10 * time.Second)
	a.set(time.Time{}, rule(15, 3, 1))
	b.set(time.Time{}, rule(22, 0, 0))
	col.Collect(ctx)
	if got, want := counts(), (policy.RuleCounts{Denied: 7, ShadowDenied: 3, Exempt: 1}); got != want {
		t.Errorf("after traffic: %+v, want %+v", got, want)
	}
	if n := drain(); n != 1 {
		t.Errorf("%d update events after a change, want 1", n)
	}

	// Nothing new: no event, no status write.
	now = t0.Add(20 * time.Second)
	col.Collect(ctx)
	if n := drain(); n != 0 {
		t.Errorf("%d update events without a change, want 0", n)
	}

	// b restarts: its counters start again from zero, and count whole.
	now = t0.Add(30 * time.Second)
	b.set(t0.Add(25*time.Second), rule(4, 0, 0))
	col.Collect(ctx)
	if got, want := counts(), (policy.RuleCounts{Denied: 11, ShadowDenied: 3, Exempt: 1}); got != want {
		t.Errorf("after a restart: %+v, want %+v", got, want)
	}

	// The window slides past all of it.
	now = t0.Add(6 * time.Minute)
	col.Collect(ctx)
	now = t0.Add(6*time.Minute + 10*time.Second)
	col.Collect(ctx)
	if got, want := counts(), (policy.RuleCounts{}); got != want {
		t.Errorf("after the window: %+v, want %+v", got, want)
	}

	// An unreachable sidecar keeps its series; its pod's deletion drops it.
	a.srv.Close()
	now = t0.Add(7 * time.Minute)
	b.set(time.Time{}, rule(9, 0, 0))
	col.Collect(ctx)
	if got, want := counts(), (policy.RuleCounts{Denied: 5}); got != want {
		t.Errorf("with a sidecar unreachable: %+v, want %+v", got, want)
	}
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "api-0", Namespace: "shop"}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	now = t0.Add(7*time.Minute + 10*time.Second)
	col.Collect(ctx)
	if u := col.For("shop", "checkout"); u == nil || u.Pods != 1 {
		t.Errorf("after deleting a pod: %+v, want the usage of 1 pod", u)
	}
}

// A sidecar first seen after it started within the window: everything it
// counted happened within the window.
func TestIncreaseOfASidecarStartedWithinTheWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	k := ruleKey{"p", "r"}
	s := &series{samples: []sample{{at: t0, started: t0.Add(-time.Minute), rules: map[ruleKey]config.RuleUsage{k: {Denied: 9, ShadowDenied: 2}}}}}
	got, seen := s.increase(k, t0.Add(-5*time.Minute))
	if !seen || got.Denied != 9 || got.ShadowDenied != 2 {
		t.Errorf("increase = %+v, %v; want 9 denied, 2 shadow-denied", got, seen)
	}
	if _, seen := s.increase(ruleKey{"p", "other"}, t0.Add(-5*time.Minute)); seen {
		t.Error("a rule the sidecar never reported was seen")
	}
}
