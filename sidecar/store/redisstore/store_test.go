package redisstore_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

var allAlgorithms = []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow, limiter.SlidingLog}

// uniqueKey returns a Request.Key of the engine's shape that no other test
// uses.
var keySeq atomic.Int64

func uniqueKey(t testing.TB) string {
	return fmt.Sprintf("uid-%d-%d:%s:%016x", time.Now().UnixNano(), keySeq.Add(1), strings.ReplaceAll(t.Name(), "/", "."), keySeq.Load())
}

// TestEightClientsExactCounts has eight stores, like eight sidecars, spend
// one key at once with mixed costs: what they were granted plus what
// remains is exactly the capacity, for every algorithm, with a batch window
// or without, on Redis's own clock.
func TestEightClientsExactCounts(t *testing.T) {
	t.Parallel()
	for _, window := range []time.Duration{redisstore.DefaultBatchWindow, 0} {
		for _, alg := range allAlgorithms {
			t.Run(fmt.Sprintf("%v/window=%v", alg, window), func(t *testing.T) {
				t.Parallel()
				opts := redisstore.Options{BatchWindow: window, Timeout: suiteTimeout}
				const clients, perClient, capacity = 8, 60, 200
				stores := make([]*redisstore.Store, clients)
				for i := range stores {
					stores[i] = newStore(t, cluster, opts)
				}
				// A day-long period: nothing refills or slides while the
				// test runs on Redis TIME.
				l := limiter.Limit{Algorithm: alg, Requests: capacity, Period: 24 * time.Hour}
				if alg == limiter.FixedWindow || alg == limiter.SlidingWindow {
					// Epoch-aligned windows: pin the clock so no boundary
					// falls inside the run.
					l.Period = 366 * 24 * time.Hour
				}
				key := uniqueKey(t)
				var granted atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, clients*perClient)
				for c := range clients {
					wg.Go(func() {
						for i := range perClient {
							cost := int64(1 + (c+i)%3)
							d, _, err := stores[c].Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: cost})
							if err != nil {
								errs <- err
								return
							}
							if d.Allowed {
								granted.Add(cost)
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("take: %v", err)
				}
				peek, _, err := stores[0].Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: 0})
				if err != nil {
					t.Fatal(err)
				}
				if got := granted.Load() + peek.Remaining; got != capacity {
					t.Errorf("granted %d + remaining %d = %d, want exactly %d", granted.Load(), peek.Remaining, got, capacity)
				}
				if granted.Load() < capacity-2 {
					// 8*60 requests of cost 1-3 ask for far more than the
					// capacity: only a cost-3 or cost-2 tail can be left.
					t.Errorf("granted only %d of %d", granted.Load(), capacity)
				}
			})
		}
	}
}

// TestKeyInjection: a Request.Key carrying braces, huge data or non-UTF-8
// bytes can neither pick its slot nor grow the Redis key.
func TestKeyInjection(t *testing.T) {
	t.Parallel()
	s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: at(time.Unix(1_700_000_000, 0))})
	ctx := t.Context()
	prefix := uniqueKey(t)
	victim := "victim-tag"
	victimSlot, err := cluster.KeySlot(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	inputs := []string{
		prefix + ":{" + victim + "}",
		prefix + ":}" + victim + "{",
		prefix + ":{}",
		"{" + victim + "}",
		prefix + ":" + strings.Repeat("A", 64<<10),
		prefix + ":\xff\xfe\x00\x80" + victim,
		"#" + prefix,
		prefix + ": spaced out",
	}
	l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 3, Period: time.Hour}
	for i, in := range inputs {
		for j := range 4 {
			d, _, err := s.Take(ctx, limiter.Request{Key: in, Limit: l, Cost: 1})
			if err != nil {
				t.Fatalf("input %d: %v", i, err)
			}
			// Each input is its own counter: three admitted, then denied.
			if got, want := d.Allowed, j < 3; got != want {
				t.Fatalf("input %d request %d: Allowed = %v, want %v", i, j, got, want)
			}
		}
		slot := redislayout.KeySlot(in)
		owner, err := cluster.MasterForSlot(ctx, slot)
		if err != nil {
			t.Fatal(err)
		}
		found := redislayout.CounterKey(in, limiter.GCRA)
		if n, err := owner.Client().Exists(ctx, found).Result(); err != nil || n != 1 {
			t.Fatalf("input %d: %q is not on %v, the master of slot %d (%d, %v)", i, found, owner, slot, n, err)
		}
		if strings.Contains(found, victim) || strings.Contains(found, "AAAA") || !utf8.ValidString(found) {
			t.Errorf("input %d: Redis key %q embeds the client string", i, found)
		}
		if len(found) > redislayout.MaxRedisKeyLen {
			t.Errorf("input %d: Redis key is %d bytes, more than %d", i, len(found), redislayout.MaxRedisKeyLen)
		}
		if got, err := owner.Client().ClusterKeySlot(ctx, found).Result(); err != nil || int(got) != slot {
			t.Errorf("input %d: CLUSTER KEYSLOT %q = %d, %v; want %d", i, found, got, err, slot)
		}
		if strings.Contains(in, "{"+victim+"}") && slot == victimSlot {
			t.Errorf("input %d landed in the slot its braces chose (%d)", i, victimSlot)
		}
	}
}

// TestKeySlotMatchesRedis checks the store's keys and slot function
// against CLUSTER KEYSLOT, which is what routes the scripts.
func TestKeySlotMatchesRedis(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cl := cluster.Nodes()[0].Client()
	for i := range 300 {
		key := fmt.Sprintf("uid:%d:rule-%d:%x", i*7919, i%13, i*104729)
		if i%10 == 0 {
			key = fmt.Sprintf("x{%d}y\xff", i) // hashed form
		}
		alg := allAlgorithms[i%len(allAlgorithms)]
		want, err := cl.ClusterKeySlot(ctx, redislayout.CounterKey(key, alg)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := redislayout.KeySlot(key); got != int(want) {
			t.Fatalf("KeySlot(%q) = %d, CLUSTER KEYSLOT %q = %d", key, got, redislayout.CounterKey(key, alg), want)
		}
	}
	if got := redislayout.CounterKey("k", 0); got != "" {
		t.Errorf("CounterKey with no algorithm = %q, want empty", got)
	}
}

// TestFunctionFlushMidRun deletes the functions of every master (FUNCTION
// FLUSH, which their replicas follow) while decisions run: the store,
// whose user may load the library, loads it again and no caller sees an
// error.
func TestFunctionFlushMidRun(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	stores := []*redisstore.Store{
		newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout}),
		newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout, BatchWindow: 0}),
	}
	stop := make(chan struct{})
	var calls, failures atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			s := stores[w%2]
			alg := allAlgorithms[w%len(allAlgorithms)]
			l := limiter.Limit{Algorithm: alg, Requests: 100_000, Period: time.Hour}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("%s:%d:%d", uniqueKey(t), w, i%50)
				calls.Add(1)
				if _, _, err := s.Take(ctx, limiter.Request{Key: key, Limit: l, Cost: 1}); err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	halt := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer halt()
	// 30 flushes, each once the callers have finished decisions since the
	// last (calls counts the decisions begun, one at most in flight per
	// caller): every flush is met by decisions.
	const flushes = 30
	for range flushes {
		from := calls.Load()
		deadline := time.Now().Add(30 * time.Second)
		for calls.Load() < from+16 {
			if time.Now().After(deadline) {
				t.Fatalf("the callers made %d decisions in 30s", calls.Load()-from)
			}
			time.Sleep(time.Millisecond)
		}
		for _, n := range cluster.Nodes() {
			if err := n.Client().FunctionFlush(ctx).Err(); err != nil && !strings.HasPrefix(err.Error(), "READONLY") {
				t.Errorf("function flush on %v: %v", n, err)
			}
		}
	}
	halt()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d of %d decisions failed across %d flushes; first: %v", n, calls.Load(), flushes, firstErr.Load())
	}
	t.Logf("%d decisions across %d function flushes of all %d nodes' masters, no error", calls.Load(), flushes, len(cluster.Nodes()))
}

// TestWrongTypeIsScriptError: a key of the wrong type is a script error,
// not an unavailable store.
func TestWrongTypeIsScriptError(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout})
	key := uniqueKey(t)
	cl := cluster.NewClient()
	defer func() { _ = cl.Close() }()
	redisKey := redislayout.CounterKey(key, limiter.TokenBucket)
	if err := cl.HSet(ctx, redisKey, "L", "1").Err(); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.Take(ctx, limiter.Request{Key: key, Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 5, Period: time.Minute}, Cost: 1})
	if err == nil || errors.Is(err, limiter.ErrUnavailable) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("take on a hash key: %v, want a WRONGTYPE script error", err)
	}
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow} {
		if err := cl.Set(ctx, redislayout.CounterKey(key, alg), "garbage", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		_, _, err = s.Take(ctx, limiter.Request{Key: key, Limit: limiter.Limit{Algorithm: alg, Requests: 5, Period: time.Minute}, Cost: 1})
		if err == nil || errors.Is(err, limiter.ErrUnavailable) || !strings.Contains(err.Error(), "corrupt "+alg.String()+" state") {
			t.Fatalf("%v: take on corrupt state: %v, want a corrupt-state script error", alg, err)
		}
	}
}

// TestAuthFailureIsUnavailable: refused credentials leave the count
// unknown, so rules fall back to their failure mode.
func TestAuthFailureIsUnavailable(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{Password: "right"})
	s, err := redisstore.New(redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Addrs: []string{srv.Addr()}, Single: true, Password: "wrong", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	_, _, err = s.Take(t.Context(), limiter.Request{Key: "k", Limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 5, Period: time.Minute}, Cost: 1})
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("take with a wrong password: %v, want ErrUnavailable", err)
	}
}

// TestClosedStore fails decisions as unavailable.
func TestClosedStore(t *testing.T) {
	t.Parallel()
	s, err := redisstore.New(redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Addrs: cluster.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Take(t.Context(), limiter.Request{Key: "k", Limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 5, Period: time.Minute}, Cost: 1})
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("take after Close: %v, want ErrUnavailable", err)
	}
}

// TestTakeReportsShard: Take names the master that holds the key, as the
// slot map has it, and UnknownShard when it fails before it knows one.
func TestTakeReportsShard(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout})
	l := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 5, Period: time.Minute}
	seen := map[string]bool{}
	for i := range 30 {
		key := fmt.Sprintf("%s:%d", uniqueKey(t), i)
		_, shard, err := s.Take(ctx, limiter.Request{Key: key, Limit: l, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		owner, err := cluster.MasterForKey(ctx, redislayout.CounterKey(key, l.Algorithm))
		if err != nil {
			t.Fatal(err)
		}
		if shard != owner.Addr() {
			t.Errorf("key %d: shard %q, want its master %s", i, shard, owner.Addr())
		}
		seen[shard] = true
	}
	if len(seen) != 3 {
		t.Errorf("30 keys reported %d shards (%v), want the 3 masters", len(seen), seen)
	}
	if _, shard, err := s.Take(ctx, limiter.Request{Key: "k", Limit: l, Cost: -1}); err == nil || shard != redisstore.UnknownShard {
		t.Errorf("bad input: shard %q, err %v; want %q and an error", shard, err, redisstore.UnknownShard)
	}
}

// TestTTL: an admitted request sets the key's TTL to StateTTL(ResetAfter);
// a peek and a deny write nothing.
func TestTTL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: at(time.Unix(1_700_000_000, 0))})
	cl := cluster.NewClient()
	defer func() { _ = cl.Close() }()
	for _, alg := range allAlgorithms {
		key := uniqueKey(t) + alg.String()
		redisKey := redislayout.CounterKey(key, alg)
		l := limiter.Limit{Algorithm: alg, Requests: 2, Period: 10 * time.Minute}
		if _, _, err := s.Take(ctx, limiter.Request{Key: key, Limit: l, Cost: 0}); err != nil {
			t.Fatal(err)
		}
		if n, err := cl.Exists(ctx, redisKey).Result(); err != nil || n != 0 {
			t.Fatalf("%v: a peek created %s (%d, %v)", alg, redisKey, n, err)
		}
		sent := time.Now()
		d, _, err := s.Take(ctx, limiter.Request{Key: key, Limit: l, Cost: 1})
		answered := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		// The key expires want after the script ran, on Redis's clock,
		// which is this machine's: within the call's own instants, to
		// the millisecond Redis keeps expiries in.
		ms, err := cl.PExpireTime(ctx, redisKey).Result()
		if err != nil {
			t.Fatal(err)
		}
		expireAt := time.UnixMilli(int64(ms / time.Millisecond))
		want := limiter.StateTTL(d.ResetAfter)
		if lo, hi := sent.Add(want-time.Millisecond), answered.Add(want+time.Millisecond); expireAt.Before(lo) || expireAt.After(hi) {
			t.Errorf("%v: the key expires %v after the allow was sent (answered %v after it), with ResetAfter %v; want a TTL of %v",
				alg, expireAt.Sub(sent), answered.Sub(sent), d.ResetAfter, want)
		}
	}
}

// TestMovedAndAsk migrates a counter's slot by hand: during the migration
// the old master answers ASK and the store follows it; afterwards a store
// with a stale slot map gets MOVED and follows it. The count carries on
// across both.
func TestMovedAndAsk(t *testing.T) {
	t.Parallel()
	testMovedAndAsk(t, redistest.StartCluster(t, redistest.Options{Masters: 3}))
}

// TestMovedAndAskIPv6 is TestMovedAndAsk on a cluster whose nodes announce
// themselves on ::1: its redirects read "ASK 3999 ::1:7001", without
// brackets, and the store must still find the node.
func TestMovedAndAskIPv6(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, redistest.Options{Masters: 3,
		ExtraArgs: []string{"--bind", "127.0.0.1", "::1", "--cluster-announce-ip", "::1"}})
	testMovedAndAsk(t, c)
}

func testMovedAndAsk(t *testing.T, c *redistest.Cluster) {
	ctx := t.Context()
	now := at(time.Unix(1_700_000_000, 0))
	asker := newStore(t, c, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: now})
	mover := newStore(t, c, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: now})
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: time.Hour}
	key := uniqueKey(t)
	slot := redislayout.KeySlot(key)
	src, err := c.MasterForSlot(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	var dst *redistest.Node
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range masters {
		if m != src {
			dst = m
			break
		}
	}
	take := func(s *redisstore.Store, wantRemaining int64) string {
		t.Helper()
		d, shard, err := s.Take(ctx, limiter.Request{Key: key, Limit: l, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Remaining != wantRemaining {
			t.Fatalf("take: %v, want allowed with %d remaining", d, wantRemaining)
		}
		return shard
	}
	take(asker, 9)
	take(mover, 8) // both stores have the slot map now

	// Start the migration and move the key: the source answers ASK.
	dstHost, dstPort := splitAddr(t, dst.Addr())
	must(t, dst.Client().Do(ctx, "cluster", "setslot", slot, "importing", src.ID()).Err())
	must(t, src.Client().Do(ctx, "cluster", "setslot", slot, "migrating", dst.ID()).Err())
	keys, err := src.Client().ClusterGetKeysInSlot(ctx, slot, 100).Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys in slot %d: %v, %v", slot, keys, err)
	}
	args := []any{"migrate", dstHost, dstPort, "", 0, 5000, "keys"}
	for _, k := range keys {
		args = append(args, k)
	}
	must(t, src.Client().Do(ctx, args...).Err())
	asksBefore := errorStat(t, src, "ASK")
	asked := take(asker, 7)
	if got := errorStat(t, src, "ASK"); got <= asksBefore {
		t.Errorf("the source answered no ASK (%d before, %d after)", asksBefore, got)
	}

	// Finish the migration; the mover's map still names the source.
	for _, m := range masters {
		must(t, m.Client().Do(ctx, "cluster", "setslot", slot, "node", dst.ID()).Err())
	}
	movedBefore := errorStat(t, src, "MOVED")
	moved := take(mover, 6)
	if got := errorStat(t, src, "MOVED"); got <= movedBefore {
		t.Logf("the mover's slot map was already reloaded: no MOVED (%d before, %d after)", movedBefore, got)
	}
	take(asker, 5)
	// The redirects went to the destination under the address the slot
	// map gives it ([::1]:port on the IPv6 cluster), not to a shard of
	// another spelling.
	cc := c.NewClient()
	defer func() { _ = cc.Close() }()
	owner, err := cc.MasterForKey(ctx, redislayout.CounterKey(key, limiter.TokenBucket))
	if err != nil {
		t.Fatal(err)
	}
	want := owner.Options().Addr
	// Take reports the shard that answered: the destination.
	if asked != want || moved != want {
		t.Errorf("shards reported after ASK %q, after MOVED %q; want the destination %s", asked, moved, want)
	}
	for _, s := range []*redisstore.Store{asker, mover} {
		var addrs []string
		found := false
		for _, sh := range s.Shards() {
			addrs = append(addrs, sh.Addr)
			found = found || sh.Addr == want
		}
		if !found {
			t.Errorf("shards %v, want %s among them", addrs, want)
		}
	}
}

// errorStat returns the count of error replies with the given prefix that
// n has sent (INFO errorstats).
func errorStat(t *testing.T, n *redistest.Node, code string) int {
	t.Helper()
	info, err := n.Client().Info(t.Context(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_"+code+":count="); ok {
			v, err := strconv.Atoi(strings.TrimSpace(rest))
			if err != nil {
				t.Fatalf("errorstat_%s: %v", code, err)
			}
			return v
		}
	}
	return 0
}

func splitAddr(t *testing.T, addr string) (string, string) {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		t.Fatalf("bad address %q", addr)
	}
	return addr[:i], addr[i+1:]
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestPipelineStats: every decision leaves in a counted pipelined write,
// with a batch window or without.
func TestPipelineStats(t *testing.T) {
	t.Parallel()
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1000, Period: time.Hour}
	for _, window := range []time.Duration{redisstore.DefaultBatchWindow, 0} {
		s := newStore(t, cluster, redisstore.Options{BatchWindow: window, Timeout: suiteTimeout})
		const takes = 64
		var wg sync.WaitGroup
		for i := range takes {
			wg.Go(func() {
				if _, _, err := s.Take(t.Context(), limiter.Request{Key: fmt.Sprintf("%s:%d", uniqueKey(t), i), Limit: l, Cost: 1}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		st := s.PipelineStats()
		if st.Decisions < takes || st.Writes < 1 || st.Writes > st.Decisions {
			t.Errorf("window %v: %+v after %d decisions", window, st, takes)
		}
		t.Logf("window %v: %d decisions in %d writes", window, st.Decisions, st.Writes)
	}
}

// TestRotatedPasswordWithoutRestart: with Credentials, a store picks up a
// changed password at its next connection; a store given the old password
// as a string keeps failing once its connections are gone.
func TestRotatedPasswordWithoutRestart(t *testing.T) {
	t.Parallel()
	for _, window := range []time.Duration{0, redisstore.DefaultBatchWindow} {
		t.Run(fmt.Sprintf("window=%v", window), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			srv := redistest.StartServer(t, redistest.ServerOptions{Password: "old"})
			var current atomic.Pointer[string]
			old, rotated := "old", "new"
			current.Store(&old)
			s, err := redisstore.New(redisstore.Options{BatchWindow: window, Addrs: []string{srv.Addr()}, Single: true, Timeout: suiteTimeout,
				Credentials: func() (string, string) { return "", *current.Load() }})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			fixed, err := redisstore.New(redisstore.Options{BatchWindow: window, Addrs: []string{srv.Addr()}, Single: true, Timeout: suiteTimeout, Password: "old"})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = fixed.Close() }()
			req := limiter.Request{Key: "k", Limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 1000, Period: time.Minute}, Cost: 1}
			for _, st := range []*redisstore.Store{s, fixed} {
				if _, _, err := st.Take(ctx, req); err != nil {
					t.Fatalf("take with the password in force: %v", err)
				}
			}
			admin := srv.Client()
			if err := admin.ConfigSet(ctx, "requirepass", rotated).Err(); err != nil {
				t.Fatal(err)
			}
			current.Store(&rotated)
			// Existing connections stay authenticated: drop them, as a
			// restarted Redis would.
			if err := admin.ClientKillByFilter(ctx, "TYPE", "normal").Err(); err != nil {
				t.Fatal(err)
			}
			var lastErr error
			ok := false
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				if _, _, lastErr = s.Take(ctx, req); lastErr == nil {
					ok = true
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !ok {
				t.Fatalf("the store with Credentials did not authenticate with the rotated password within 10s: %v", lastErr)
			}
			for range 5 {
				if _, _, err := fixed.Take(ctx, req); !errors.Is(err, limiter.ErrUnavailable) {
					t.Fatalf("the store with the old password as a string: %v, want ErrUnavailable", err)
				}
			}
		})
	}
}

// TestPasswordThatAppearsAfterStart: a store started before its password
// exists (an injected sidecar whose optional Secret volume the kubelet
// fills in a moment after the container starts) connects without one,
// is refused, and authenticates once the password is there: no connection
// dialled without it stays in use.
func TestPasswordThatAppearsAfterStart(t *testing.T) {
	t.Parallel()
	pw, err := redistest.NewCluster(redistest.Options{Masters: 1, Password: "late"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pw.Close)
	srv := redistest.StartServer(t, redistest.ServerOptions{Password: "late"})
	for _, tc := range []struct {
		name   string
		single bool
		addrs  []string
		window time.Duration
	}{
		{"cluster", false, pw.Addrs(), redisstore.DefaultBatchWindow},
		{"cluster-nowindow", false, pw.Addrs(), 0},
		{"single", true, []string{srv.Addr()}, redisstore.DefaultBatchWindow},
		{"single-nowindow", true, []string{srv.Addr()}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			var current atomic.Pointer[string]
			none, late := "", "late"
			current.Store(&none)
			s, err := redisstore.New(redisstore.Options{BatchWindow: tc.window, Addrs: tc.addrs, Single: tc.single, Timeout: suiteTimeout,
				BreakerCooldown: 50 * time.Millisecond,
				Credentials:     func() (string, string) { return "", *current.Load() }})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			req := limiter.Request{Key: "k-" + tc.name, Limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 1000, Period: time.Minute}, Cost: 1}
			if _, _, err := s.Take(ctx, req); !errors.Is(err, limiter.ErrUnavailable) {
				t.Fatalf("take before the password exists: %v, want ErrUnavailable", err)
			}
			current.Store(&late)
			var lastErr error
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				if _, _, lastErr = s.Take(ctx, req); lastErr == nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Fatalf("the store never authenticated once the password appeared: %v", lastErr)
		})
	}
}
