package app

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run runs the plugin in process and returns its exit code, stdout and
// stderr.
func run(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(append(args, "--kubeconfig", filepath.Join(t.TempDir(), "none")), Streams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut})
	return code, out.String(), errOut.String()
}

const goodPolicy = `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: checkout, namespace: shop}
spec:
  podSelector: {matchLabels: {app: checkout}}
  rules:
  - name: per-key
    match: {path: {type: Prefix, value: /api/}}
    key: [{header: X-API-Key}]
    limit: {requests: 5, per: 10s, burst: 5}
`

func TestCheckExitCodes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(goodPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := run(t, "", "check", good); code != ExitOK || !strings.Contains(out, "ratelimitpolicy.ratelimit.floodgate.dev/checkout valid") {
		t.Errorf("check good.yaml: exit %d\n%s", code, out)
	}
	bad := strings.Replace(goodPolicy, "requests: 5", "requests: 0", 1)
	code, out, _ := run(t, bad, "check", "-o", "json", "-")
	if code != ExitFindings {
		t.Errorf("check of an invalid policy: exit %d, want %d", code, ExitFindings)
	}
	var rep CheckReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Invalid != 1 || rep.Results[0].Status == nil || rep.Results[0].Status.Code != 422 ||
		!strings.HasPrefix(rep.Results[0].Message, `The RateLimitPolicy "checkout" is invalid: spec.rules[0].limit.requests`) {
		t.Errorf("report %+v", rep)
	}
	if code, _, errOut := run(t, "", "check", filepath.Join(dir, "missing.yaml")); code != ExitError || !strings.Contains(errOut, "no such file") {
		t.Errorf("check of a missing file: exit %d, %q", code, errOut)
	}
	if code, _, errOut := run(t, "", "check", "-o", "yaml", good); code != ExitError || !strings.Contains(errOut, `--output "yaml"`) {
		t.Errorf("a bad --output: exit %d, %q", code, errOut)
	}
}

func TestExplainAndSimulate(t *testing.T) {
	t.Parallel()
	code, out, errOut := run(t, goodPolicy, "explain", "-", "--replicas", "5")
	if code != ExitOK || !strings.Contains(out, "each X-API-Key: 5 requests per 10 s, burst 5, TokenBucket; fails open to 1 request per 10 s per replica on 5 replicas") {
		t.Errorf("explain: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = run(t, goodPolicy, "simulate", "-", "--rate", "1/s", "--for", "7s", "--path", "/api/x",
		"--key-from", "header:X-API-Key=alice", "-o", "json")
	if code != ExitOK {
		t.Fatalf("simulate: exit %d: %s", code, errOut)
	}
	var rep SimulateReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	// A burst of 5 and one more token every 2s: seven requests a second
	// apart are all admitted.
	if len(rep.Decisions) != 7 || len(rep.Summary) != 1 || rep.Summary[0].Rule != "checkout.per-key" || rep.Summary[0].Allowed != 7 {
		t.Errorf("simulate report %+v", rep.Summary)
	}
	code, _, errOut = run(t, goodPolicy, "simulate", "-", "--rate", "1/s")
	if code != ExitError || !strings.Contains(errOut, "--rate and --for") {
		t.Errorf("simulate without --for: exit %d, %q", code, errOut)
	}
}

// concurrencyConfig is a sidecar config with a rule of each kind an HTTP
// rule can be: a rate, a cap on requests in flight, and only a priority.
const concurrencyConfig = `apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: exports
  uid: exports-1
  replicas: 3
  rules:
  - name: per-tenant
    match: {path: {type: Prefix, value: /exports}}
    key: [{header: X-Tenant}]
    concurrency: {max: 10}
  - name: per-key
    key: [{header: X-API-Key}]
    limit: {requests: 100, per: 1m}
  - name: payments
    match: {path: {type: Prefix, value: /pay}}
    priority: Critical
`

// A concurrency rule is an HTTP rule: check counts it with the rate rules,
// and explain words it as floodgate-sidecar --check-config does
// (rlsimport's TestExplainConcurrencyRule pins the same words).
func TestCheckCountsConcurrencyRules(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "sidecar.yaml")
	if err := os.WriteFile(file, []byte(concurrencyConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "", "check", file)
	if got, want := out, file+": floodgate sidecar config valid: 1 policies, 2 HTTP rules (1 rate, 1 concurrency), 0 Envoy descriptor rules in 0 domains\n"+
		"1 valid, 0 invalid, 0 skipped (not floodgate objects)\n"; code != ExitOK || got != want {
		t.Errorf("check: exit %d, stdout\n%s\nwant\n%s%s", code, got, want, errOut)
	}
	code, out, errOut = run(t, "", "explain", file)
	if want := "    limits   each X-Tenant: at most 10 requests in flight at once across replicas (a crashed sidecar's slots come back after 10 s); fails open to 3 in flight per replica on 3 replicas\n"; code != ExitOK || !strings.Contains(out, want) {
		t.Errorf("explain: exit %d, stdout\n%s\nwant a line\n%s%s", code, out, want, errOut)
	}
	code, out, errOut = run(t, "", "simulate", file, "--rate", "1/s", "--for", "1s", "--path", "/exports", "-q")
	if want := "floodgate sidecar config (floodgate.dev/sidecar-config/v1) from " + file + ": 2 HTTP rules (1 rate, 1 concurrency)\n"; code != ExitOK || !strings.HasPrefix(out, want) {
		t.Errorf("simulate: exit %d, stdout\n%s\nwant it to start with\n%s%s", code, out, want, errOut)
	}
}
