package runner

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/configsource"
)

func TestKubernetesModeFlagsAndEnv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	lf := filepath.Join(dir, "labels")
	if err := os.WriteFile(lf, []byte("app=\"api\"\ntier=\"a b\\\"c\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parse(t, []string{"--pod-labels-file", lf, "--pod-labels", "tier=override"}, map[string]string{
		"FLOODGATE_KUBERNETES": "true",
		config.EnvPodNamespace: "shop",
		config.EnvPodName:      "api-0",
	})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Kubernetes || c.Namespace != "shop" || c.PodName != "api-0" {
		t.Errorf("kubernetes %v namespace %q pod %q, want true, shop, api-0", c.Kubernetes, c.Namespace, c.PodName)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v; Kubernetes mode needs no --policy-file", err)
	}
	got, err := c.Labels()
	if err != nil {
		t.Fatal(err)
	}
	if want := (labels.Set{"app": "api", "tier": "override"}); !labels.Equals(got, want) {
		t.Errorf("Labels() = %v, want %v", got, want)
	}

	flagWins, err := parse(t, []string{"--namespace", "other"}, map[string]string{config.EnvPodNamespace: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	if flagWins.Namespace != "other" {
		t.Errorf("namespace %q, want the flag's value over %s", flagWins.Namespace, config.EnvPodNamespace)
	}
}

func TestKubernetesModeValidation(t *testing.T) {
	t.Parallel()
	c, err := parse(t, []string{"--kubernetes", "--policy-file", "/etc/p.yaml", "--pod-labels-file", "/nonexistent/labels"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	if err == nil {
		t.Fatal("Validate accepted a Kubernetes config without identity and with a policy file")
	}
	for _, want := range []string{"--policy-file", "--namespace", "POD_NAMESPACE", "--pod-name", "POD_NAME", "--pod-labels", "/nonexistent/labels"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestParseLabelsFile(t *testing.T) {
	t.Parallel()
	got, err := ParseLabelsFile([]byte("app.kubernetes.io/name=\"api\"\n\npod-template-hash=\"7d9\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (labels.Set{"app.kubernetes.io/name": "api", "pod-template-hash": "7d9"}); !labels.Equals(got, want) {
		t.Errorf("ParseLabelsFile = %v, want %v", got, want)
	}
	for _, bad := range []string{"novalue\n", "k=unquoted\n"} {
		if _, err := ParseLabelsFile([]byte(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("ParseLabelsFile(%q) = %v, want an error naming line 1", bad, err)
		}
	}
}

// scriptedSource delivers fixed updates, recording what the runner
// reports through Update.Result, then waits for the end.
type scriptedSource struct {
	updates []configsource.Update
	results chan string
}

func (s *scriptedSource) Run(ctx context.Context, deliver func(configsource.Update)) {
	for _, u := range s.updates {
		u.Result = func(o configsource.Outcome) {
			msg := "applied"
			if o.Err != nil {
				msg = "rejected: " + o.Err.Error()
			}
			if len(o.Failed) > 0 {
				msg += " but " + strings.Join(o.Failed, ",")
			}
			s.results <- o.InForce + " " + msg
		}
		deliver(u)
	}
	<-ctx.Done()
}

func TestUpdateResultReportsTheRevisionInForce(t *testing.T) {
	t.Parallel()
	doc := func(rev string) []byte {
		return []byte(`{"apiVersion":"floodgate.dev/sidecar-config/v1","revision":"` + rev + `","store":{"type":"memory"},"policies":[]}`)
	}
	src := &scriptedSource{results: make(chan string, 8), updates: []configsource.Update{
		{Err: errors.New("no document yet")},
		{Data: doc("r1")},
		{Data: []byte(`{"apiVersion":"nope"}`)},
		{Data: doc("r2")},
	}}
	var cfg Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	if err := cfg.Parse(fs, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--policy-file", "unused"},
		func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg, slog.New(slog.DiscardHandler), src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	want := []string{" rejected: no document yet", "r1 applied", "r1 rejected: ", "r2 applied"}
	for i, w := range want {
		select {
		case got := <-src.results:
			if !strings.HasPrefix(got, w) {
				t.Errorf("result %d = %q, want prefix %q", i, got, w)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("result %d never came", i)
		}
	}
}

func TestConfigMapNameFlag(t *testing.T) {
	t.Parallel()
	c, err := parse(t, []string{"--kubernetes", "--namespace", "floodgate-system", "--pod-name", "floodgate-ratelimit-0"},
		map[string]string{"FLOODGATE_CONFIGMAP_NAME": config.RateLimitServiceConfigMapName})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.ConfigMapName, config.RateLimitServiceConfigMapName; got != want {
		t.Errorf("ConfigMapName = %q, want %q from FLOODGATE_CONFIGMAP_NAME", got, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	def, err := parse(t, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := def.ConfigMapName, config.ConfigMapName; got != want {
		t.Errorf("default ConfigMapName = %q, want %q", got, want)
	}
	standalone, err := parse(t, []string{"--policy-file", "p.yaml", "--configmap-name", "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := standalone.Validate(); err == nil || !strings.Contains(err.Error(), "--configmap-name") {
		t.Errorf("Validate of --configmap-name without --kubernetes = %v, want an error naming the flag", err)
	}
}
