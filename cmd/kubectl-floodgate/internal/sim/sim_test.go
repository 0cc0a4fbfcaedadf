package sim

import (
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/internal/trace"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testConfig() *config.Config {
	return &config.Config{APIVersion: config.APIVersion, Policies: []config.Policy{{
		Name: "shop", UID: "shop-1", PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "shop"}},
		Rules: []config.Rule{{
			Name: "per-key", Match: config.Match{Path: &config.PathMatch{Type: config.PathPrefix, Value: "/api"}},
			Key: []config.KeyPart{{Header: "X-API-Key"}}, OnMissingKey: config.OnMissingKeyReject,
			Limit: config.Limit{Requests: 2, Per: metav1.Duration{Duration: 10 * time.Second}},
		}},
	}}}
}

func request(at time.Duration, path, key string) trace.Request {
	h := http.Header{}
	if key != "" {
		h.Set("X-API-Key", key)
	}
	return trace.Request{At: start.Add(at), Method: http.MethodGet, Target: path, Header: h, Client: trace.DefaultClient}
}

// TestDecisions is a step table on the simulated clock: each request's
// status, outcome and fields.
func TestDecisions(t *testing.T) {
	t.Parallel()
	s, err := New(Options{Config: testConfig(), Start: start})
	if err != nil {
		t.Fatal(err)
	}
	if rules, ignored, descs := s.Rules(); rules != 1 || len(ignored) != 0 || descs != 0 {
		t.Fatalf("Rules() = %d, %v, %d", rules, ignored, descs)
	}
	for i, step := range []struct {
		req     trace.Request
		status  int
		outcome string
		fields  map[string]string
	}{
		{request(0, "/api/a", "alice"), 200, Allowed, map[string]string{"Ratelimit": `"shop.per-key";r=1;t=5`, "Ratelimit-Policy": `"shop.per-key";q=2;w=10`}},
		{request(0, "/api/a", "alice"), 200, Allowed, map[string]string{"Ratelimit": `"shop.per-key";r=0;t=10`}},
		// The next token comes 4s later (a microsecond more: the limiter never
		// admits early), which Retry-After rounds up to 5.
		{request(time.Second, "/api/a", "alice"), 429, Denied, map[string]string{"Retry-After": "5", "X-Ratelimit-Remaining": "0"}},
		{request(time.Second, "/api/a", "bob"), 200, Allowed, map[string]string{"Ratelimit": `"shop.per-key";r=1;t=5`}},
		{request(5*time.Second+time.Millisecond, "/api/a", "alice"), 200, Allowed, map[string]string{"Ratelimit": `"shop.per-key";r=0;t=10`}},
		{request(6*time.Second, "/api/a", ""), 400, Rejected, nil},
		{request(6*time.Second, "/other", ""), 200, Allowed, nil},
	} {
		d, err := s.Do(step.req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Status != step.status || d.Outcome != step.outcome {
			t.Errorf("step %d: %s %s = %d %s, want %d %s (%s)", i, step.req.Target, step.req.Header.Get("X-API-Key"), d.Status, d.Outcome, step.status, step.outcome, d.Detail)
		}
		for f, want := range step.fields {
			if got := d.Headers[f]; got != want {
				t.Errorf("step %d: %s = %q, want %q", i, f, got, want)
			}
		}
		if step.fields == nil && step.outcome == Allowed && len(d.Headers) != 0 {
			t.Errorf("step %d: fields %v on a request no rule matched", i, d.Headers)
		}
	}
	if _, err := s.Do(request(0, "/api/a", "alice")); err == nil {
		t.Error("a request earlier than the previous one was decided: the clock went back")
	}
}

func TestPodLabels(t *testing.T) {
	t.Parallel()
	s, err := New(Options{Config: testConfig(), Start: start, PodLabels: labels.Set{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	if rules, ignored, _ := s.Rules(); rules != 0 || len(ignored) != 1 || ignored[0] != "shop" {
		t.Errorf("Rules() = %d, %v: a policy not selecting the pod must not apply", rules, ignored)
	}
	d, err := s.Do(request(0, "/api/a", ""))
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != http.StatusOK {
		t.Errorf("status %d, want 200 with no policy in force", d.Status)
	}
}
