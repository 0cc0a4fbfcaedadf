package simnode

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseSample(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		line   string
		name   string
		labels map[string]string
		value  float64
	}{
		{`floodgate_sidecar_fallback_active 1`, "floodgate_sidecar_fallback_active", map[string]string{}, 1},
		{`floodgate_sidecar_decisions_total{policy="checkout",result="allowed",rule="per-api-key"} 1083`,
			"floodgate_sidecar_decisions_total", map[string]string{"policy": "checkout", "result": "allowed", "rule": "per-api-key"}, 1083},
		{`m{a="x,y",b="q\"uote\\"} 2.5e-3 1700000000000`, "m", map[string]string{"a": "x,y", "b": `q"uote\`}, 2.5e-3},
		{`m{} +Inf`, "m", map[string]string{}, posInf()},
	} {
		name, labels, value, err := ParseSample(tc.line)
		if err != nil {
			t.Errorf("ParseSample(%q): %v", tc.line, err)
			continue
		}
		if name != tc.name || !maps.Equal(labels, tc.labels) || value != tc.value {
			t.Errorf("ParseSample(%q) = %q, %v, %v; want %q, %v, %v", tc.line, name, labels, value, tc.name, tc.labels, tc.value)
		}
	}
	for _, bad := range []string{``, `{a="b"} 1`, `m{a="b} 1`, `m{a} 1`, `m`, `m{a="b"}`, `m x`} {
		if _, _, _, err := ParseSample(bad); err == nil {
			t.Errorf("ParseSample(%q) succeeded, want an error", bad)
		}
	}
}

func posInf() float64 {
	var zero float64
	return 1 / zero
}

func TestMetricSum(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprint(w, `# HELP d decisions
# TYPE d counter
d{policy="p",result="allowed",rule="a"} 3
d{policy="p",result="denied",rule="a"} 4
d{policy="p",result="allowed",rule="b"} 5
d_other{policy="p",result="allowed",rule="a"} 100
`)
	}))
	t.Cleanup(srv.Close)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"d", nil, 12},
		{"d", map[string]string{"result": "allowed"}, 8},
		{"d", map[string]string{"rule": "a", "result": "denied"}, 4},
		{"d", map[string]string{"rule": "c"}, 0},
		{"missing", nil, 0},
	} {
		got, err := MetricSum(ctx, srv.URL, tc.name, tc.match)
		if err != nil {
			t.Fatalf("MetricSum(%s, %v): %v", tc.name, tc.match, err)
		}
		if got != tc.want {
			t.Errorf("MetricSum(%s, %v) = %v, want %v", tc.name, tc.match, got, tc.want)
		}
	}
}

func TestBackendCounts(t *testing.T) {
	t.Parallel()
	b, err := StartBackend("app")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for _, p := range []string{"/a", "/a", "/b"} {
		resp, err := http.Get(b.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if got, want := resp.StatusCode, http.StatusOK; got != want {
			t.Fatalf("GET %s: status %d, want %d", p, got, want)
		}
	}
	if got, want := b.Hits(), int64(3); got != want {
		t.Errorf("Hits() = %d, want %d", got, want)
	}
	if got, want := b.PathHits("/a"), int64(2); got != want {
		t.Errorf("PathHits(/a) = %d, want %d", got, want)
	}
}

func TestInjectedSidecar(t *testing.T) {
	t.Parallel()
	pod := func(init, containers []string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
		for _, n := range init {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: n})
		}
		for _, n := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: n})
		}
		return p
	}
	if c, err := InjectedSidecar(pod(nil, []string{"app", "floodgate-sidecar"})); err != nil || c.Name != "floodgate-sidecar" {
		t.Errorf("sidecar container: %v, %v", c, err)
	}
	if c, err := InjectedSidecar(pod([]string{"floodgate-sidecar"}, []string{"app"})); err != nil || c.Name != "floodgate-sidecar" {
		t.Errorf("native sidecar (init container): %v, %v", c, err)
	}
	if _, err := InjectedSidecar(pod(nil, []string{"app"})); err == nil || !strings.Contains(err.Error(), "did not inject") {
		t.Errorf("no sidecar: err = %v", err)
	}
	if _, err := InjectedSidecar(pod([]string{"floodgate-sidecar"}, []string{"app", "floodgate-sidecar"})); err == nil || !strings.Contains(err.Error(), "want exactly one") {
		t.Errorf("two sidecars: err = %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	err := Options{}.Validate()
	if err == nil {
		t.Fatal("empty Options validated")
	}
	for _, f := range []string{"Root", "Work", "Bin"} {
		if !strings.Contains(err.Error(), "Options."+f+" is required") {
			t.Errorf("error %q does not name %s", err, f)
		}
	}
	if err := (Options{Root: t.TempDir(), Work: "w", Bin: "b"}).Validate(); err == nil || !strings.Contains(err.Error(), "config/crd/bases") {
		t.Errorf("a root without config: err = %v", err)
	}
}

func TestPollBounded(t *testing.T) {
	t.Parallel()
	calls := 0
	start := time.Now()
	// The timeout is 50 intervals, so that cond is called several times
	// even when this goroutine waits for a CPU for a while.
	const timeout = 500 * time.Millisecond
	err := Poll(context.Background(), 10*time.Millisecond, timeout, "never", func() (bool, error) {
		calls++
		return false, nil
	})
	if err == nil || !strings.Contains(err.Error(), "waiting for never") {
		t.Fatalf("Poll = %v, want a timeout naming what it waited for", err)
	}
	if calls < 2 {
		t.Errorf("cond called %d times, want several", calls)
	}
	if d := time.Since(start); d > 10*timeout {
		t.Errorf("Poll returned after %v, far past its %v timeout", d, timeout)
	}
}
