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
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestLibraryCommandsAllowed: Redis checks the commands a function calls
// against the caller's ACL rules, so every command the library calls must
// be in NamespaceACLRules, and no command that runs code or touches
// another namespace may be.
func TestLibraryCommandsAllowed(t *testing.T) {
	t.Parallel()
	_, src := redislayout.Library()
	rules := NamespaceACLRules("team-a")
	called := map[string]bool{}
	for _, part := range strings.Split(src, "redis.call('")[1:] {
		cmd, _, ok := strings.Cut(part, "'")
		if !ok || cmd == "" {
			t.Fatalf("unreadable redis.call in the library near %.40q", part)
		}
		called[strings.ToLower(cmd)] = true
	}
	if len(called) < 5 {
		t.Fatalf("found only %v called in the library", called)
	}
	for cmd := range called {
		if !slices.Contains(rules, "+"+cmd) {
			t.Errorf("the library calls %s, which NamespaceACLRules do not allow: %v", cmd, rules)
		}
	}
	for _, r := range rules {
		switch {
		case strings.HasPrefix(r, "~") && r != "~fg:{team-a/*":
			t.Errorf("key pattern %s beyond the namespace's keys", r)
		case r == "+@all" || strings.HasPrefix(r, "+eval") || strings.HasPrefix(r, "+script") || strings.HasPrefix(r, "+function") ||
			strings.HasPrefix(r, "+config") || r == "+keys" || r == "+scan" || strings.HasPrefix(r, "+acl") || strings.HasPrefix(r, "+debug") || r == "+del":
			t.Errorf("rule %s lets a tenant run code, read the config or touch keys beyond the functions' use", r)
		case strings.HasPrefix(r, "&") || r == "allchannels" || r == "allkeys":
			t.Errorf("rule %s widens the user", r)
		}
	}
}

// TestNamespaceUsers starts a node with the Pods' own start script and
// gives it what the manager does (the counter functions, and the users of
// two namespaces, team-a during a rotation), then checks each user as its
// sidecars, and as a tenant holding its credential, would use it:
//   - the counter store works with it, every algorithm, leases and
//     concurrency slots, with either password of a rotation;
//   - it reaches its own namespace's counters and no other's, however it
//     names them, and everything else a tenant could try is refused:
//     plain reads and writes outside its keys, EVAL, EVALSHA, SCRIPT,
//     FUNCTION, CONFIG, KEYS, and the admin commands;
//   - without the library loaded, a call fails as unavailable (the user
//     may not load it), and works once the manager has loaded it;
//   - the manager ends the rotation on the running node, and deletes the
//     users of namespaces without access and the shared user of earlier
//     releases.
func TestNamespaceUsers(t *testing.T) {
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
	const admin, currentA, previousA, passwordB = "admin-password-0001", "team-a-password-0002", "team-a-password-0001", "team-b-password-0001"
	srv := redistest.StartServer(t, redistest.ServerOptions{
		Host: host.IP, Port: RedisPort, Password: admin,
		Command: []string{"sh", "-c", StartScript(confDir, dataDir)},
		Env:     []string{"POD_IP=" + host.IP, "REDIS_PASSWORD=" + admin, "REDISCLI_AUTH=" + admin},
	})
	ctx := t.Context()
	if err := srv.Client().Do(ctx, "cluster", "addslotsrange", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	sess := formation.NewSession(formation.Dialer{Password: admin})
	defer func() { _ = sess.Close() }()
	addrs := []string{srv.Addr()}
	userA := formation.User{Name: NamespaceUser("team-a"), Passwords: []string{currentA, previousA}, Rules: NamespaceACLRules("team-a")}
	userB := formation.User{Name: NamespaceUser("team-b"), Passwords: []string{passwordB}, Rules: NamespaceACLRules("team-b")}
	if _, err := sess.EnsureUsers(ctx, addrs, []formation.User{userA, userB}); err != nil {
		t.Fatal(err)
	}
	open := func(space, user, password string) *redisstore.Store {
		s, err := redisstore.New(redisstore.Options{Addrs: addrs, Username: user, Password: password, KeySpace: space, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 3, Period: time.Minute}

	// Without the library: the user may not load it, so the call fails as
	// unavailable, naming the library.
	libName, libSrc := redislayout.Library()
	storeA := open("team-a", userA.Name, currentA)
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, err = storeA.Take(ctx, limiter.Request{Key: "before-library", Limit: l, Cost: 1})
		if err != nil && strings.Contains(err.Error(), libName) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // a fresh cluster node settles
	}
	if !errors.Is(err, limiter.ErrUnavailable) || !strings.Contains(err.Error(), libName) {
		t.Fatalf("a decision before the library is loaded: %v, want ErrUnavailable naming %s", err, libName)
	}
	if loaded, err := sess.EnsureLibrary(ctx, addrs, libName, libSrc); err != nil || !slices.Equal(loaded, addrs) {
		t.Fatalf("EnsureLibrary = %v, %v; want it loaded on %v", loaded, err, addrs)
	}
	if loaded, err := sess.EnsureLibrary(ctx, addrs, libName, libSrc); err != nil || len(loaded) != 0 {
		t.Errorf("EnsureLibrary again = %v, %v; want nothing loaded", loaded, err)
	}

	// The store works for each namespace, with either password of team-a.
	for _, c := range []struct{ space, user, pw string }{
		{"team-a", userA.Name, currentA}, {"team-a", userA.Name, previousA}, {"team-b", userB.Name, passwordB},
	} {
		s := open(c.space, c.user, c.pw)
		for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow, limiter.SlidingLog} {
			lim := limiter.Limit{Algorithm: alg, Requests: 3, Period: time.Minute}
			if _, _, err := s.Take(ctx, limiter.Request{Key: "acl-" + c.pw, Limit: lim, Cost: 1}); err != nil {
				t.Errorf("%v as %s (%s): %v", alg, c.user, c.pw, err)
			}
			if alg.Leasable() {
				if _, _, err := s.Lease(ctx, limiter.LeaseRequest{Key: "lease-" + c.pw, Limit: lim, LeaseArgs: limiter.LeaseArgs{Cost: 1, Want: 2}}); err != nil {
					t.Errorf("%v lease as %s: %v", alg, c.user, err)
				}
			}
		}
		slot := limiter.SlotRequest{Key: "slots-" + c.pw, Max: 2, Lease: 1, TTL: time.Minute}
		if _, _, err := s.Acquire(ctx, slot); err != nil {
			t.Errorf("a concurrency slot as %s: %v", c.user, err)
		}
		if _, err := s.Release(ctx, slot); err != nil {
			t.Errorf("releasing a concurrency slot as %s: %v", c.user, err)
		}
	}

	// A namespace cannot reach another's counters through the store: B's
	// credential with A's key space is refused.
	if _, _, err := open("team-a", userB.Name, passwordB).Take(ctx, limiter.Request{Key: "acl-" + currentA, Limit: l, Cost: 1}); !errors.Is(err, limiter.ErrUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("team-b's user on team-a's keys: %v, want a NOPERM refusal", err)
	}
	if _, _, err := open("", userB.Name, passwordB).Take(ctx, limiter.Request{Key: "acl", Limit: l, Cost: 1}); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("team-b's user on unnamed keys: %v, want a NOPERM refusal", err)
	}

	// Everything else B's credential could be used for is refused.
	if err := srv.Client().Set(ctx, "app:session", "secret", 0).Err(); err != nil {
		t.Fatal(err)
	}
	keyA := redislayout.Keys{Space: "team-a"}.Counter("acl-"+currentA, limiter.GCRA)
	keyB := redislayout.Keys{Space: "team-b"}.Counter("acl-"+passwordB, limiter.GCRA)
	stateA, err := srv.Client().Get(ctx, keyA).Result()
	if err != nil {
		t.Fatalf("team-a's counter %s: %v", keyA, err)
	}
	_, _, fn, _ := redislayout.TakeScript(limiter.GCRA)
	b := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: userB.Name, Password: passwordB, Protocol: 2, MaxRetries: -1, DisableIdentity: true})
	t.Cleanup(func() { _ = b.Close() })
	refused := [][]any{
		{"get", keyA},
		{"set", keyA, "x"},
		{"del", keyA},
		{"pexpire", keyA, 1},
		{"fcall", fn, 1, keyA, "", 3, 3, 60000000, 1, 1, 1, 3, 3},
		{"fcall", fn, 1, "fg:{team-a}:x", ""},
		{"eval", "return 1", 0},
		{"eval", "while true do end", 0},
		{"evalsha", strings.Repeat("0", 40), 0},
		{"eval_ro", "return 1", 0},
		{"script", "load", "while true do end"},
		{"script", "flush"},
		{"script", "kill"},
		{"function", "load", "#!lua name=evil\nredis.register_function('evil', function() while true do end end)"},
		{"function", "flush"},
		{"function", "delete", libName},
		{"function", "list"},
		{"function", "kill"},
		{"config", "get", "requirepass"},
		{"config", "set", "maxmemory", "1"},
		{"keys", "*"},
		{"scan", "0"},
		{"get", "app:session"},
		{"set", "app:session", "x"},
		{"flushall"},
		{"flushdb"},
		{"acl", "list"},
		{"acl", "setuser", userB.Name, "~*", "+@all"},
		{"cluster", "reset"},
		{"cluster", "forget", "0123456789012345678901234567890123456789"},
		{"debug", "sleep", "10"},
		{"shutdown", "nosave"},
		{"monitor"},
		{"client", "kill", "user", "default"},
		{"client", "list"},
		{"subscribe", "x"},
	}
	for _, cmd := range refused {
		err := b.Do(ctx, cmd...).Err()
		var re redis.Error
		// DEBUG is refused before the ACL is consulted: the nodes run
		// with enable-debug-command no.
		if err == nil || !errors.As(err, &re) || (!strings.HasPrefix(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "can't run this command") &&
			!strings.HasPrefix(err.Error(), "ERR DEBUG command not allowed")) {
			t.Errorf("%v as %s: %v, want a NOPERM refusal", cmd, userB.Name, err)
			continue
		}
		t.Logf("refused: %.60v -> %v", cmd, err)
	}
	// B's own functions cannot be turned against the store: a SlidingLog
	// call with a capacity and cost no valid limit has would add a
	// billion entries in one call, holding the server.
	_, _, logFn, _ := redislayout.TakeScript(limiter.SlidingLog)
	logKey := redislayout.Keys{Space: "team-b"}.Counter("huge", limiter.SlidingLog)
	if err := b.Do(ctx, "fcall", logFn, 1, logKey, "", 1_000_000_000, 1_000_000_000, 60_000_000).Err(); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("a SlidingLog call with a capacity of 10^9: %v, want it refused as out of range", err)
	}
	if n, err := srv.Client().Exists(ctx, logKey).Result(); err != nil || n != 0 {
		t.Errorf("the refused SlidingLog call left %s: %d, %v", logKey, n, err)
	}
	// B's own counter is its own to read: the functions need GET.
	if err := b.Get(ctx, keyB).Err(); err != nil {
		t.Errorf("team-b reading its own counter: %v", err)
	}
	if got, err := srv.Client().Get(ctx, "app:session").Result(); err != nil || got != "secret" {
		t.Errorf("app:session = %q, %v after the refusals", got, err)
	}
	if got, err := srv.Client().Get(ctx, keyA).Result(); err != nil || got != stateA {
		t.Errorf("team-a's counter changed after team-b's attempts: %q, %v", got, err)
	}
	libs, err := srv.Client().FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 1 || libs[0].Name != libName {
		t.Errorf("libraries after the attempts: %v, %v; want only %s", libs, err, libName)
	}

	// The rotation ends: the manager sets team-a's passwords to the
	// current one alone, on the running node.
	conn := func(user, password string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: password, Protocol: 2, MaxRetries: -1, DisableIdentity: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	held := conn(userA.Name, previousA)
	if err := held.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	userA.Passwords = []string{currentA}
	changed, err := sess.EnsureUser(ctx, addrs, userA)
	if err != nil || !slices.Equal(changed, addrs) {
		t.Fatalf("EnsureUser = %v, %v; want the node changed", changed, err)
	}
	if changed, err := sess.EnsureUser(ctx, addrs, userA); err != nil || len(changed) != 0 {
		t.Errorf("EnsureUser again = %v, %v; want nothing changed", changed, err)
	}
	if err := conn(userA.Name, previousA).Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("a new connection with the previous password: %v, want WRONGPASS", err)
	}
	if err := held.Ping(ctx).Err(); err != nil {
		t.Errorf("a connection authenticated before the rotation ended: %v", err)
	}

	// Pruning: team-b lost access, and an earlier release's shared user
	// is still there; both go, team-a stays.
	if err := srv.Client().Do(ctx, "acl", "setuser", LegacySidecarUser, "on", ">legacy-password-01", "~fg:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	deleted, err := sess.PruneUsers(ctx, addrs, func(name string) bool {
		return name == LegacySidecarUser || strings.HasPrefix(name, UserPrefix) && name != userA.Name
	})
	if err != nil || !slices.Equal(slices.Sorted(slices.Values(deleted[srv.Addr()])), slices.Sorted(slices.Values([]string{LegacySidecarUser, userB.Name}))) {
		t.Errorf("PruneUsers = %v, %v; want %s and %s deleted", deleted, err, LegacySidecarUser, userB.Name)
	}
	users, err := srv.Client().Do(ctx, "acl", "users").StringSlice()
	if err != nil || !slices.Equal(users, []string{"default", userA.Name}) {
		t.Errorf("users after pruning: %v, %v", users, err)
	}
	if err := b.Ping(ctx).Err(); err == nil {
		t.Error("team-b's connection still works after its user was deleted")
	}
	if _, _, err := open("team-a", userA.Name, currentA).Take(ctx, limiter.Request{Key: "after-prune", Limit: l, Cost: 1}); err != nil {
		t.Errorf("team-a after pruning: %v", err)
	}
}
