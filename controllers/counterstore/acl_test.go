package counterstore

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/controllers/counterstore/formation"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestSidecarUser starts a node with the Pods' own start script, during a
// rotation (a current and a previous sidecar password), and checks the
// sidecar user as the sidecars see it: the counter store works with it
// (its handshake, the scripts, the slot map), with either password, and
// everything else a credential in a tenant namespace could be used for is
// refused. Then the manager's EnsureUser ends the rotation on the running
// node: the previous password is refused, and a connection authenticated
// with it before stays open.
func TestSidecarUser(t *testing.T) {
	t.Parallel()
	host := redistest.ClaimHost(t, RedisPort)
	dir := t.TempDir()
	confDir, dataDir := filepath.Join(dir, "config"), filepath.Join(dir, "data")
	for _, d := range []string{confDir, dataDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := strings.ReplaceAll(RedisConf(testStore()), " /data", " "+dataDir)
	if err := os.WriteFile(filepath.Join(confDir, "redis.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	const admin, current, previous = "admin-password-0001", "sidecar-password-0002", "sidecar-password-0001"
	srv := redistest.StartServer(t, redistest.ServerOptions{
		Host: host.IP, Port: RedisPort, Password: admin,
		Command: []string{"sh", "-c", StartScript(confDir, dataDir)},
		Env: []string{"POD_IP=" + host.IP, "REDIS_PASSWORD=" + admin, "REDISCLI_AUTH=" + admin,
			"REDIS_SIDECAR_PASSWORD=" + current, "REDIS_SIDECAR_PASSWORD_PREVIOUS=" + previous},
	})
	ctx := t.Context()
	if err := srv.Client().Do(ctx, "cluster", "addslotsrange", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	sidecar := func(password string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: SidecarUser, Password: password, Protocol: 2, MaxRetries: -1, DisableIdentity: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	// The counter store, as the sidecars run it, with both passwords.
	l := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 3, Period: time.Minute}
	for _, pw := range []string{current, previous} {
		s, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr()}, Username: SidecarUser, Password: pw, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, _, err = s.Take(ctx, limiter.Request{Key: "acl-" + pw, Limit: l, Cost: 1})
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond) // a fresh cluster node settles
		}
		_ = s.Close()
		if err != nil {
			t.Fatalf("a decision as %s with password %s: %v", SidecarUser, pw, err)
		}
	}
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow} {
		s, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr()}, Username: SidecarUser, Password: current, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = s.Take(ctx, limiter.Request{Key: "acl-alg", Limit: limiter.Limit{Algorithm: alg, Requests: 3, Period: time.Minute}, Cost: 1})
		_ = s.Close()
		if err != nil {
			t.Errorf("%v script as %s: %v", alg, SidecarUser, err)
		}
	}

	c := sidecar(current)
	if err := srv.Client().Set(ctx, "app:session", "secret", 0).Err(); err != nil {
		t.Fatal(err)
	}
	refused := [][]any{
		{"flushall"},
		{"flushdb"},
		{"config", "get", "requirepass"},
		{"config", "set", "maxmemory", "1"},
		{"keys", "*"},
		{"scan", "0"},
		{"get", "app:session"},
		{"set", "app:session", "x"},
		{"del", "fg:{acl-" + current + "}:sl:2"},
		{"eval", "return redis.call('get', KEYS[1])", 1, "app:session"},
		{"eval", "return redis.call('flushall')", 0},
		{"script", "flush"},
		{"acl", "list"},
		{"acl", "setuser", SidecarUser, "+@all"},
		{"cluster", "reset"},
		{"cluster", "forget", "0123456789012345678901234567890123456789"},
		{"shutdown", "nosave"},
		{"monitor"},
		{"client", "kill", "user", "default"},
		{"subscribe", "x"},
	}
	for _, cmd := range refused {
		err := c.Do(ctx, cmd...).Err()
		var re redis.Error
		if err == nil || !errors.As(err, &re) || (!strings.HasPrefix(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "can't run this command")) {
			t.Errorf("%v as %s: %v, want a NOPERM refusal", cmd, SidecarUser, err)
			continue
		}
		t.Logf("refused: %v -> %v", cmd, err)
	}
	if got, err := srv.Client().Get(ctx, "app:session").Result(); err != nil || got != "secret" {
		t.Errorf("app:session = %q, %v after the refusals", got, err)
	}
	if n, err := srv.Client().DBSize(ctx).Result(); err != nil || n < 2 {
		t.Errorf("dbsize %d, %v: the data is gone", n, err)
	}

	// The rotation ends: the manager sets the user's passwords to the
	// current one alone, on the running node.
	held := sidecar(previous)
	if err := held.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	sess := formation.NewSession(formation.Dialer{Password: admin})
	defer func() { _ = sess.Close() }()
	u := formation.User{Name: SidecarUser, Passwords: []string{current}, Rules: SidecarACLRules}
	changed, err := sess.EnsureUser(ctx, []string{srv.Addr()}, u)
	if err != nil || !slices.Equal(changed, []string{srv.Addr()}) {
		t.Fatalf("EnsureUser = %v, %v; want the node changed", changed, err)
	}
	if changed, err := sess.EnsureUser(ctx, []string{srv.Addr()}, u); err != nil || len(changed) != 0 {
		t.Errorf("EnsureUser again = %v, %v; want nothing changed", changed, err)
	}
	if err := sidecar(previous).Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("a new connection with the previous password: %v, want WRONGPASS", err)
	}
	if err := held.Ping(ctx).Err(); err != nil {
		t.Errorf("a connection authenticated before the rotation ended: %v", err)
	}
	if err := sidecar(current).Ping(ctx).Err(); err != nil {
		t.Errorf("a new connection with the current password: %v", err)
	}

	// A node without the user (started before it existed) gets it, with
	// its rules.
	if err := srv.Client().Do(ctx, "acl", "deluser", SidecarUser).Err(); err != nil {
		t.Fatal(err)
	}
	if changed, err := sess.EnsureUser(ctx, []string{srv.Addr()}, u); err != nil || len(changed) != 1 {
		t.Fatalf("EnsureUser on a node without the user = %v, %v", changed, err)
	}
	if err := sidecar(current).Do(ctx, "flushall").Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Errorf("flushall as the recreated user: %v, want NOPERM", err)
	}
	if err := sidecar(current).Do(ctx, "time").Err(); err != nil {
		t.Errorf("time as the recreated user: %v", err)
	}
}
