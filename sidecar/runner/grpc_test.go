package runner

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/floodgate-dev/floodgate/test/redistest"
)

const envoyPolicy = `domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: user
    value: admin
    rate_limit: {unlimited: true}
`

// floodgate-sidecar serves ShouldRateLimit on --grpc-listen from an
// envoyproxy/ratelimit format policy file, on the Redis Cluster store,
// and reloads it like any policy file.
//
// Its limits are per hour, FixedWindow, counted by Redis on its own clock:
// a run that a window boundary splits counts in two windows, and is run
// again, on a sidecar of its own and for a user of its own.
func TestEnvoyRLSOnGRPCListen(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, redistest.Options{Masters: 3})
	cc := cluster.NewClient()
	t.Cleanup(func() { _ = cc.Close() })
	be := newBackend(t, nil)
	redistest.InOneWindow(t, cc, time.Hour, func(attempt int) func() {
		return envoyRLS(t, cluster, be, fmt.Sprint("alice-", attempt))
	})
}

// envoyRLS runs TestEnvoyRLSOnGRPCListen's calls for user on a sidecar of
// its own, checks what does not depend on the window the counts fall in,
// and returns the checks of those counts, for a run that one window held.
func envoyRLS(t *testing.T, cluster *redistest.Cluster, be *backend, user string) (check func()) {
	sc := startSidecar(t, be.URL, envoyPolicy, true, "--grpc-listen", "127.0.0.1:0", "--grpc-response-headers",
		"--store", "redis", "--redis-addrs", strings.Join(cluster.Addrs(), ","), "--redis-timeout", "2s")
	conn, err := grpc.NewClient(sc.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(user string) *rlsv3.RateLimitResponse {
		t.Helper()
		out, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommonv3.RateLimitDescriptor{
			{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	var checks []func()
	admitted := 0
	for range 5 {
		if call(user).OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	checks = append(checks, func() {
		if admitted != 3 {
			t.Errorf("%s: %d of 5 admitted, want 3", user, admitted)
		}
	})
	out := call(user)
	var retry string
	for _, h := range out.ResponseHeadersToAdd {
		if h.Key == "Retry-After" {
			retry = h.Value
		}
	}
	checks = append(checks, func() {
		if out.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || retry == "" {
			t.Errorf("over the limit: %v, want OVER_LIMIT with Retry-After", out)
		}
	})
	for range 5 {
		if out := call("admin"); out.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("admin is unlimited: %v", out)
		}
	}
	if n := sc.metric(t, `floodgate_sidecar_fallback_decisions_total{policy="edge",result="allowed",rule="user"}`); n != 0 {
		t.Errorf("%v decisions fell back: Redis calls failed", n)
	}
	overLimit := sc.metric(t, `floodgate_sidecar_rls_calls_total{code="over_limit"}`)
	checks = append(checks, func() {
		if overLimit != 3 {
			t.Errorf("over_limit calls %v, want 3", overLimit)
		}
	})
	st := sc.Status()
	if st.DescriptorRules != 2 || !strings.Contains(st.Format, "envoyproxy/ratelimit") || st.Store.Type != "redis" {
		t.Errorf("status %+v", st)
	}
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health %v %v", hc, err)
	}
	// Descriptor rules never apply to the HTTP proxy.
	for range 5 {
		res, err := http.Get(sc.url + "/x")
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("HTTP request through the proxy: %d", res.StatusCode)
		}
	}

	// Reload in floodgate's format with the same policy and rule names:
	// the limit rises to 5 and the counter survives.
	writeAtomic(t, sc.policy, `apiVersion: floodgate.dev/sidecar-config/v1
revision: r2
policies:
- name: edge
  uid: envoy.edge
  rules:
  - name: user
    match: {descriptors: {domain: edge, entries: [{key: user}]}}
    limit: {requests: 5, per: 1h, algorithm: FixedWindow}
`)
	sc.waitRevision(t, "r2")
	raised := 0
	for range 4 {
		if call(user).OverallCode == rlsv3.RateLimitResponse_OK {
			raised++
		}
	}
	checks = append(checks, func() {
		if raised != 2 {
			t.Errorf("after raising the limit to 5: %d of 4 admitted, want 2 (3 already spent)", raised)
		}
	})
	if out := call("admin"); out.OverallCode != rlsv3.RateLimitResponse_OK || out.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Errorf("admin after the reload: %v, want the per-user limit (the unlimited rule is gone)", out)
	}
	return func() {
		for _, c := range checks {
			c()
		}
	}
}

func TestGRPCListenValidate(t *testing.T) {
	t.Parallel()
	var cfg Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	if err := cfg.Parse(fs, []string{"--policy-file", "p.yaml", "--grpc-listen", "nonsense", "--listen", ":8081"}, func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--grpc-listen (FLOODGATE_GRPC_LISTEN)") {
		t.Errorf("Validate: %v, want a --grpc-listen error", err)
	}
	cfg.GRPCListen = ":8081"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "must differ") {
		t.Errorf("Validate: %v, want a clash error", err)
	}
}

func TestCheckConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte(envoyPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - value: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var c Config
	var out bytes.Buffer
	if err := c.Check(&out, good); err != nil {
		t.Fatalf("Check(good): %v", err)
	}
	for _, want := range []string{"valid", "envoyproxy/ratelimit config", "rule user_admin", "unlimited", "2 Envoy descriptor rules in 1 domains"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explanation lacks %q:\n%s", want, out.String())
		}
	}
	err := c.Check(&out, bad)
	if err == nil || !strings.Contains(err.Error(), "invalid rate limit unit \"fortnight\"") || !strings.Contains(err.Error(), "empty key") {
		t.Errorf("Check(bad): %v, want both problems", err)
	}
}

// --check-config's summary counts a pod's concurrency rules beside its
// rate rules, as kubectl floodgate check does (rlsimport.HTTPRules).
func TestCheckConfigCountsConcurrencyRules(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "conc.yaml")
	doc := `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: exports
  uid: exports-1
  rules:
  - name: per-tenant
    key: [{header: X-Tenant}]
    concurrency: {max: 10}
  - name: per-key
    key: [{header: X-API-Key}]
    limit: {requests: 100, per: 1m}
`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var c Config
	var out bytes.Buffer
	if err := c.Check(&out, path); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if want := "for a pod with labels {}: 2 HTTP rules (1 rate, 1 concurrency), 0 Envoy descriptor rules"; !strings.Contains(out.String(), want) {
		t.Errorf("Check's summary lacks %q:\n%s", want, out.String())
	}
}
