package runner

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

func parse(t *testing.T, args []string, env map[string]string) (Config, error) {
	t.Helper()
	var c Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	err := c.Parse(fs, args, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	return c, err
}

func TestFlagsEnvAndDefaults(t *testing.T) {
	t.Parallel()
	c, err := parse(t, []string{"--listen", ":7000"}, map[string]string{
		"FLOODGATE_LISTEN":               ":6000", // the flag wins
		"FLOODGATE_UPSTREAM":             "http://127.0.0.1:9999",
		"FLOODGATE_POLICY_POLL_INTERVAL": "250ms",
		"FLOODGATE_REDIS_TLS":            "true",
		"FLOODGATE_REDIS_PASSWORD":       "s3cret",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != ":7000" || c.Upstream != "http://127.0.0.1:9999" || c.PollInterval != 250*time.Millisecond || !c.RedisTLS {
		t.Errorf("config %+v", c)
	}
	if c.AdminListen != DefaultAdminListen {
		t.Errorf("admin listen %q, want the default", c.AdminListen)
	}
	if c.RedisPassword != "s3cret" {
		t.Errorf("password not read from %s", EnvRedisPassword)
	}
	if c.RedisBatchWindow != redisstore.DefaultBatchWindow || c.RedisMaxBatch != redisstore.DefaultMaxBatch ||
		c.RedisBreakerFailures != redisstore.DefaultBreakerFailures || c.RedisBreakerCooldown != redisstore.DefaultBreakerCooldown {
		t.Errorf("redis tuning defaults %v %d %d %v, want the store's defaults", c.RedisBatchWindow, c.RedisMaxBatch, c.RedisBreakerFailures, c.RedisBreakerCooldown)
	}
	if c, err := parse(t, nil, map[string]string{"FLOODGATE_REDIS_BATCH_WINDOW": "0s"}); err != nil || c.RedisBatchWindow != 0 || c.Validate() != nil && strings.Contains(c.Validate().Error(), "batch") {
		t.Errorf("FLOODGATE_REDIS_BATCH_WINDOW=0s: %v, window %v; 0 must be accepted (no window)", err, c.RedisBatchWindow)
	}
	if !c.IsSet("upstream") || c.IsSet("admin-listen") {
		t.Errorf("IsSet does not track env-given flags")
	}
	if _, err := parse(t, nil, map[string]string{"FLOODGATE_REDIS_TIMEOUT": "soon"}); err == nil || !strings.Contains(err.Error(), "FLOODGATE_REDIS_TIMEOUT") {
		t.Errorf("bad env value: %v, want an error naming the variable", err)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	c, err := parse(t, []string{
		"--listen", "nonsense", "--upstream", "ftp://x", "--store", "etcd",
		"--redis-addrs", "a:1,bad", "--max-header-bytes", "10", "--log-level", "loud",
		"--policy-poll-interval", "1ms", "--redis-password-file", "/nonexistent/pw",
		"--redis-batch-window", "1s", "--redis-max-batch", "0", "--redis-breaker-failures", "-1", "--redis-breaker-cooldown", "0s",
		"--gc-percent", "10", "--memory-limit-ratio", "1.5",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	if err == nil {
		t.Fatal("Validate succeeded")
	}
	for _, want := range []string{"--listen", "--upstream", "--store", "--redis-addrs", "--max-header-bytes", "--log-level", "--policy-file", "--policy-poll-interval", "--redis-password-file",
		"--redis-batch-window", "--redis-max-batch", "--redis-breaker-failures", "--redis-breaker-cooldown", "--gc-percent", "--memory-limit-ratio"} {
		if !strings.Contains(err.Error(), want+" (") {
			t.Errorf("no problem reported for %s:\n%v", want, err)
		}
	}
}

func TestStorePrecedence(t *testing.T) {
	t.Parallel()
	file := &config.Config{Store: config.Store{Type: config.StoreRedis, Addresses: []string{"10.0.0.1:6379"}}}
	for _, tc := range []struct {
		name  string
		args  []string
		doc   *config.Config
		want  string
		addrs string
		from  string
	}{
		{"default", nil, &config.Config{}, "memory", "", "default"},
		{"file", nil, file, "redis", "10.0.0.1:6379", "policy-file"},
		{"flag addresses override the file's", []string{"--redis-addrs", "127.0.0.1:7000"}, file, "redis", "127.0.0.1:7000", "policy-file"},
		{"--store wins", []string{"--store", "memory"}, file, "memory", "", "flags"},
		{"--store redis", []string{"--store", "redis", "--redis-addrs", "127.0.0.1:1,127.0.0.1:2"}, &config.Config{}, "redis", "127.0.0.1:1,127.0.0.1:2", "flags"},
	} {
		c, err := parse(t, tc.args, nil)
		if err != nil {
			t.Fatal(err)
		}
		sel := c.selectStore(tc.doc)
		if sel.Type != tc.want || strings.Join(sel.Addresses, ",") != tc.addrs || sel.From != tc.from {
			t.Errorf("%s: %+v, want %s %q from %s", tc.name, sel, tc.want, tc.addrs, tc.from)
		}
	}
}

// TestPodContractEnvNames pins the variables the injection webhook writes
// (sidecar/config's pod contract) to the flags they must set.
func TestPodContractEnvNames(t *testing.T) {
	t.Parallel()
	for flagName, want := range map[string]string{
		"kubernetes":          config.EnvKubernetes,
		"redis-password-file": config.EnvRedisPasswordFile,
	} {
		if got := EnvName(flagName); got != want {
			t.Errorf("EnvName(%q) = %q, want the contract's %q", flagName, got, want)
		}
	}
}
