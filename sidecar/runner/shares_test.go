package runner

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// refusedAddr returns a loopback address that refuses connections: a
// Redis store there is unreachable from the start.
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// fleetDoc is a one-policy config whose fail-open rule is shared by
// replicas replicas; pods, when given, are listed in pods and replicaPods.
func fleetDoc(rev, rule string, replicas int, requests int, pods ...string) string {
	var list, idx string
	if len(pods) > 0 {
		var is []string
		for i := range pods {
			is = append(is, fmt.Sprint(i))
		}
		list = fmt.Sprintf("pods: [%s]\n", strings.Join(pods, ", "))
		idx = fmt.Sprintf("  replicaPods: [%s]\n", strings.Join(is, ", "))
	}
	return fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
revision: %s
%spolicies:
- name: login
  uid: login-1
  replicas: %d
%s  rules:
  - name: %s
    key: [{header: X-User}]
    failureMode: Open
    limit: {requests: %d, per: 1m}
`, rev, list, replicas, idx, rule, requests)
}

// noIdentity is the refusal of a sidecar without --pod-name.
const noIdentity = `policy "login": replicas is 10 but this sidecar has no pod identity (--pod-name): ` +
	`its fail-open share could collide with every other replica's; set --pod-name, or replicas to 1`

// --check-config refuses what a sidecar started with the same flags
// would: a config whose fail-open shares it has no place of its own in.
func TestCheckConfigRefusesSharesWithoutAPlace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, doc string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	redis := "store: {type: redis, addresses: [127.0.0.1:1]}\n"
	unlisted := write("unlisted.yaml", strings.Replace(fleetDoc("v1", "r", 10, 3), "policies:", redis+"policies:", 1))
	listed := write("listed.yaml", strings.Replace(fleetDoc("v1", "r", 3, 3, "api-0", "api-1", "api-2"), "policies:", redis+"policies:", 1))
	memory := write("memory.yaml", fleetDoc("v1", "r", 10, 3))
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		file string
		want string // "" for valid
	}{
		{"no --pod-name", nil, nil, unlisted, noIdentity},
		{"no --pod-name, listed pods", nil, nil, listed, `policy "login": replicas is 3 but this sidecar has no pod identity (--pod-name)`},
		{"no --pod-name, Kubernetes mode", []string{"--kubernetes"}, nil, unlisted, noIdentity},
		{"no --pod-name, --store redis on a file without a store", []string{"--store", "redis", "--redis-addrs", "127.0.0.1:1"}, nil, memory, noIdentity},
		{"no --pod-name, memory store", nil, nil, memory, ""},
		{"listed", []string{"--pod-name", "api-1"}, nil, listed, ""},
		{"listed by $POD_NAME", nil, map[string]string{"POD_NAME": "api-2"}, listed, ""},
		{"not listed", []string{"--pod-name", "api-7"}, nil, listed,
			`policy "login": replicas is 3 but this sidecar's pod "api-7" (--pod-name) is not in its replicaPods: ` +
				`its fail-open share, placed by a hash of the name, could collide with another replica's; list every replica in pods and replicaPods, or set replicas to 1`},
		{"no replicaPods", []string{"--pod-name", "api-1"}, nil, unlisted, `this sidecar's pod "api-1" (--pod-name) is not in its replicaPods`},
		// floodgate-manager lists a new pod in its next revision.
		{"not listed, Kubernetes mode", []string{"--pod-name", "api-7", "--kubernetes"}, nil, listed, ""},
	} {
		c, err := parse(t, tc.args, tc.env)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err = c.Check(&out, tc.file)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: Check = %v, want valid", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Check = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	// On the memory store the file is valid, and the explanation says what
	// the same sidecar on Redis would do.
	var c Config
	var out bytes.Buffer
	if err := c.Check(&out, memory); err != nil {
		t.Fatal(err)
	}
	if want := "note: on the memory store a sidecar never falls back to a share of a limit, so it enforces this file; " +
		"on a Redis store (--store redis, or the file's store section) it refuses it:\n" + noIdentity; !strings.Contains(out.String(), want) {
		t.Errorf("explanation on the memory store lacks %q:\n%s", want, out.String())
	}
}

// A sidecar whose first config has a fail-open share it has no place of
// its own in stops with the reason, without serving: a fleet of them
// would admit the limit once per replica while the store is down.
func TestRefusesToStartWithoutAPlace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		doc  string
		want string
	}{
		{"no --pod-name", nil, fleetDoc("v1", "r", 10, 3), noIdentity},
		{"not in replicaPods", []string{"--pod-name", "api-1"}, fleetDoc("v1", "r", 10, 3),
			`policy "login": replicas is 10 but this sidecar's pod "api-1" (--pod-name) is not in its replicaPods`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pf := filepath.Join(t.TempDir(), "policy.yaml")
			writeAtomic(t, pf, tc.doc)
			var cfg Config
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			args := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1",
				"--policy-file", pf, "--store", "redis", "--redis-addrs", refusedAddr(t)}, tc.args...)
			if err := cfg.Parse(fs, args, func(string) (string, bool) { return "", false }); err != nil {
				t.Fatal(err)
			}
			r, err := New(cfg, slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err = r.Run(ctx)
			if ctx.Err() != nil {
				t.Fatalf("the sidecar kept running with a config it has no place in (ready %v, status %+v)", r.Ready(), r.Status())
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), pf+": ") {
				t.Errorf("Run = %v, want %s: ...%s", err, pf, tc.want)
			}
			if r.Ready() {
				t.Errorf("ready after refusing its only config")
			}
		})
	}
}

// A reload to a config whose fail-open share the sidecar has no place in
// is refused as an invalid config is: the last good config stays in
// force, the error is counted and logged, and the refused rules leave no
// metrics behind.
func TestReloadRefusesSharesWithoutAPlace(t *testing.T) {
	t.Parallel()
	be := newBackend(t, nil)
	sc := startSidecar(t, be.URL, fleetDoc("v1", "r", 1, 5), true, "--store", "redis", "--redis-addrs", refusedAddr(t), "--redis-timeout", "1s")
	c := &http.Client{}
	if res, _ := get(t, c, sc.url+"/", "X-User", "u"); res.Header.Get("X-RateLimit-Limit") != "5" {
		t.Fatalf("v1: %d, X-RateLimit-Limit %q, want v1's limit 5", res.StatusCode, res.Header.Get("X-RateLimit-Limit"))
	}

	writeAtomic(t, sc.policy, fleetDoc("v2", "r2", 10, 3))
	sc.waitError(t, noIdentity)
	if got := sc.Status().Revision; got != "v1" {
		t.Errorf("revision after the refusal = %q, want v1", got)
	}
	if got := sc.metric(t, "floodgate_sidecar_config_errors_total"); got != 1 {
		t.Errorf("config_errors_total = %v, want 1", got)
	}
	if got := sc.metric(t, `floodgate_sidecar_config_loads_total{result="error"}`); got != 1 {
		t.Errorf(`config_loads_total{result="error"} = %v, want 1`, got)
	}
	if got := sc.metric(t, "floodgate_sidecar_config_valid"); got != 0 {
		t.Errorf("config_valid = %v, want 0", got)
	}
	if !strings.Contains(sc.logs.String(), `"msg":"config rejected; keeping the last good config"`) ||
		!strings.Contains(sc.logs.String(), strings.ReplaceAll(noIdentity, `"`, `\"`)) {
		t.Errorf("the refusal is not logged with its reason:\n%s", sc.logs.String())
	}
	if res, _ := get(t, c, sc.url+"/", "X-User", "u"); res.Header.Get("X-RateLimit-Limit") != "5" {
		t.Errorf("after the refusal: X-RateLimit-Limit %q, want v1's limit 5 still in force", res.Header.Get("X-RateLimit-Limit"))
	}
	// The refused rule r2 was compiled, so it made series; they go.
	deadline := time.Now().Add(10 * time.Second)
	for strings.Contains(metricsText(t, sc.admin), `rule="r2"`) {
		if time.Now().After(deadline) {
			t.Fatalf("the refused rule's series are still exported")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// One replica again: applied.
	writeAtomic(t, sc.policy, fleetDoc("v3", "r", 1, 7))
	sc.waitRevision(t, "v3")
	if got := sc.metric(t, "floodgate_sidecar_config_valid"); got != 1 {
		t.Errorf("config_valid = %v, want 1", got)
	}
}

// metricsText returns the admin server's /metrics.
func metricsText(t *testing.T, admin string) string {
	t.Helper()
	res, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	var b bytes.Buffer
	if _, err := b.ReadFrom(res.Body); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
