package runner

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// secretsPolicy keeps to itself, in every place a policy can: a
// condition, a header match's value and pattern, a query match's value, a
// key expression and exemptions.
const secretsPolicy = `apiVersion: floodgate.dev/sidecar-config/v1
revision: secrets-1
policies:
- name: p
  uid: uid-p
  exempt: {sourceCIDRs: ["203.0.113.0/24"], when: ["request.headers['x-bypass'] == 'exempt-secret-1'"]}
  rules:
  - name: r
    match:
      headers: [{name: X-Internal, value: header-secret-2}, {name: X-Other, regex: "regex-secret-3.*"}]
      query: [{name: token, value: query-secret-4}]
      when: ["request.headers['x-flag'] != 'when-secret-5'"]
    key: [{expression: "request.headers['x-org'] + 'expr-secret-6'"}]
    exempt: {when: ["request.headers['x-probe'] == 'exempt-secret-7'"]}
    limit: {requests: 10, per: 1m}
`

var policySecrets = []string{"203.0.113.0/24", "exempt-secret-1", "header-secret-2", "regex-secret-3", "query-secret-4", "when-secret-5", "expr-secret-6", "exempt-secret-7"}

// TestAdminPortKeepsThePolicysSecrets: /debug/config shows the whole
// config to loopback (a container of the pod, kubectl port-forward), and
// to any other host the config with what the policy keeps to itself
// redacted; the profiles answer loopback only.
func TestAdminPortKeepsThePolicysSecrets(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	sc := startSidecar(t, be.URL, secretsPolicy, true, "--admin-pprof")
	get := func(path, remote string) (int, string) {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		sc.adminHandler().ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Result().Body)
		return rec.Code, string(body)
	}
	// Over a real socket from loopback: everything.
	res, err := http.Get(sc.admin + "/debug/config")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	for _, s := range policySecrets {
		if !strings.Contains(string(body), s) {
			t.Errorf("/debug/config from loopback lacks %q:\n%s", s, body)
		}
	}
	for _, remote := range []string{"192.0.2.10:40000", "[2001:db8::1]:40000", "[::ffff:192.0.2.10]:40000"} {
		code, body := get("/debug/config", remote)
		if code != http.StatusOK {
			t.Fatalf("/debug/config from %s: %d %s", remote, code, body)
		}
		for _, s := range policySecrets {
			if strings.Contains(body, s) {
				t.Errorf("/debug/config from %s shows %q:\n%s", remote, s, body)
			}
		}
		// The report is still there: the revision, the policy and its
		// rule, and what was redacted says so.
		for _, s := range []string{`"revision": "secrets-1"`, `"name": "p"`, `"name": "r"`, `"name": "X-Internal"`, redacted, `"requests": 10`} {
			if !strings.Contains(body, s) {
				t.Errorf("/debug/config from %s lacks %q:\n%s", remote, s, body)
			}
		}
		if code, _ := get("/debug/pprof/cmdline", remote); code != http.StatusForbidden {
			t.Errorf("/debug/pprof/cmdline from %s: %d, want 403", remote, code)
		}
		if code, _ := get("/metrics", remote); code != http.StatusOK {
			t.Errorf("/metrics from %s: %d, want 200", remote, code)
		}
	}
	if code, _ := get("/debug/pprof/cmdline", "127.0.0.1:40000"); code != http.StatusOK {
		t.Errorf("/debug/pprof/cmdline from loopback: %d, want 200", code)
	}
}
