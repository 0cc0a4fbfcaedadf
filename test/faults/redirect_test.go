package faults

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// errorStats sums, over nodes, the error replies they sent by code (INFO
// errorstats).
func errorStats(t *testing.T, nodes []*redistest.Node, codes ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, n := range nodes {
		if !n.Running() {
			continue
		}
		info, err := n.Client().Info(t.Context(), "errorstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			for _, code := range codes {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_"+code+":count="); ok {
					v, err := strconv.Atoi(strings.TrimSpace(rest))
					if err != nil {
						t.Fatal(err)
					}
					out[code] += v
				}
			}
		}
	}
	return out
}

// functionLoads sums the FUNCTION LOAD calls the nodes have run (INFO
// commandstats).
func functionLoads(t *testing.T, nodes []*redistest.Node) int {
	t.Helper()
	n := 0
	for _, node := range nodes {
		if !node.Running() {
			continue
		}
		info, err := node.Client().Info(t.Context(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_function|load:calls="); ok {
				v, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
				if err != nil {
					t.Fatal(err)
				}
				n += v
			}
		}
	}
	return n
}

// TestFunctionFlushThenFailover deletes the functions of every master
// (FUNCTION FLUSH, which their replicas follow) and then fails a master
// over to its replica (CLUSTER FAILOVER), while three sidecars with
// batching on decide 300 requests per second each on keys of every shard.
// "Function not found" is answered by sending the op again after FUNCTION
// LOAD (the test's store user may load it), MOVED by following it to the
// new master, within the batches: no error reaches a caller, and nothing
// falls back.
func TestFunctionFlushThenFailover(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{Masters: 3, Replicas: 1, NodeTimeout: 2 * time.Second})
	ctx := t.Context()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := masters[0]
	replicas, err := c.ReplicasOf(ctx, victim)
	if err != nil || len(replicas) == 0 {
		t.Fatalf("replicas of %v: %v, %v", victim, replicas, err)
	}
	keys := []string{keyOn(t, c, victim, "a"), keyOn(t, c, victim, "b"), keyOn(t, c, masters[1], "c"), keyOn(t, c, masters[2], "d")}
	lim := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 1_000_000, Period: time.Hour}
	const sidecars, rate = 3, 300
	// The test is about the answers, not the deadline: a budget above the
	// longest Redis may hold a write during a manual failover (the old
	// master pauses writes for up to CLUSTER_MF_TIMEOUT x
	// CLUSTER_MF_PAUSE_MULT = 10 s until the replica has taken over; on a
	// busy machine the takeover uses seconds of it), with room for the
	// machine's lateness.
	fleet, rules := newFleet(t, c, "flush", sidecars, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: 15 * time.Second}, lim)
	warmUp(t, fleet, rules, keys...)
	before := errorStats(t, c.Nodes(), "MOVED")
	loadsBefore := functionLoads(t, c.Nodes())

	rec := &record{}
	stop := make(chan struct{})
	var wgs []*sync.WaitGroup
	for _, k := range keys {
		wgs = append(wgs, drive(ctx, fleet, rules, k, rate/float64(len(keys)), rec, stop))
	}
	halt := sync.OnceFunc(func() {
		close(stop)
		for _, wg := range wgs {
			wg.Wait()
		}
	})
	defer halt()
	time.Sleep(time.Second)
	for _, m := range masters {
		if err := m.Client().FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The sidecars meet the flush before the failover: they have loaded
	// the library again.
	if !waitUntil(30*time.Second, func() bool { return functionLoads(t, c.Nodes()) > loadsBefore }) {
		t.Fatal("no sidecar loaded the library within 30s of the flush")
	}
	if err := replicas[0].Client().Do(ctx, "cluster", "failover").Err(); err != nil {
		t.Fatal(err)
	}
	// CLUSTER FAILOVER answers at once and fails over in the background.
	promoted := replicas[0]
	deadline := time.Now().Add(30 * time.Second)
	for {
		role, err := promoted.Client().Do(ctx, "role").Slice()
		if err == nil && len(role) > 0 && role[0] == "master" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("role of %v 30s after CLUSTER FAILOVER: %v, %v", promoted, role, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.WaitClusterOK(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	halt()
	ds := rec.all()
	after := errorStats(t, c.Nodes(), "MOVED")
	loads := functionLoads(t, c.Nodes()) - loadsBefore
	got := counts(ds)
	t.Logf("%d decisions through a FUNCTION FLUSH of every master and a failover of %v to %v: %v, the slowest %v; the sidecars loaded the library %d times, the nodes answered MOVED %d times",
		len(ds), victim.Addr(), promoted.Addr(), got, maxTook(ds), loads, after["MOVED"]-before["MOVED"])
	if got["allow/store"] != len(ds) {
		t.Errorf("%d of %d decisions did not come from the store: %v", len(ds)-got["allow/store"], len(ds), got)
		shown := 0
		for _, d := range ds {
			if d.outcome != engine.Allow || d.source != engine.FromStore {
				if shown++; shown <= 10 {
					t.Logf("sidecar %d, %v/%v at %v: %s", d.sidecar, d.outcome, d.source, d.at.Format("15:04:05.000"), d.story())
				}
			}
		}
	}
	if loads == 0 {
		t.Error("no sidecar loaded the library: the flush was not exercised")
	}
	if after["MOVED"] == before["MOVED"] {
		t.Log("no MOVED: every sidecar reloaded its slot map before sending to the old master")
	}
}

// TestSlotMigrationUnderLoad moves the slot of a hot key from master to
// master and back, three times, keys included (SETSLOT IMPORTING and
// MIGRATING, MIGRATE, SETSLOT NODE), while 8 callers, each with a store of
// its own, spend it. The store follows ASK and MOVED (at most two hops a
// decision, as documented) without an error reaching a caller, and counts
// are conserved: what Redis holds is exactly what the callers were granted.
func TestSlotMigrationUnderLoad(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{Masters: 3})
	ctx := t.Context()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := keyOn(t, c, masters[0], "moving")
	slot := redislayout.KeySlot(key)
	lim := exactCounter
	const callers = 8
	var stores []*redisstore.Store
	for range callers {
		s, err := redisstore.New(redisstore.Options{Addrs: c.Addrs(), BatchWindow: redisstore.DefaultBatchWindow, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}
	start := remaining(t, c, key, lim)

	var granted, calls atomic.Int64
	// done counts each caller's finished calls.
	done := make([]atomic.Int64, callers)
	var mu sync.Mutex
	var errs []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, _, err := s.Take(ctx, limiter.Request{Key: key, Limit: lim, Cost: 1})
				calls.Add(1)
				done[i].Add(1)
				switch {
				case err != nil:
					mu.Lock()
					errs = append(errs, err.Error())
					mu.Unlock()
				case d.Allowed:
					granted.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	halt := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer halt()
	// everyCallerCalls waits until every caller has made a whole call in
	// the slot's present state: one begun after it was reached.
	everyCallerCalls := func(state string) {
		t.Helper()
		var from [callers]int64
		for i := range done {
			from[i] = done[i].Load()
		}
		if !waitUntil(30*time.Second, func() bool {
			for i := range done {
				if done[i].Load() < from[i]+2 {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("not every caller made a call %s within 30s", state)
		}
	}
	stats := func() map[string]int { return errorStats(t, c.Nodes(), "MOVED", "ASK", "TRYAGAIN") }
	before := stats()
	everyCallerCalls("before the moves")
	owner := masters[0]
	for round := range 3 {
		next := masters[1+round%2]
		migrateSlot(t, c, slot, owner, next, masters, everyCallerCalls)
		owner = next
	}
	halt()
	after := stats()
	charged := start - remaining(t, c, key, lim)
	t.Logf("%d calls by %d callers through 3 moves of slot %d: %d granted, %d errors; the nodes answered MOVED %d, ASK %d, TRYAGAIN %d times; Redis holds %d charges",
		calls.Load(), callers, slot, granted.Load(), len(errs), after["MOVED"]-before["MOVED"], after["ASK"]-before["ASK"],
		after["TRYAGAIN"]-before["TRYAGAIN"], charged)
	for _, e := range errs {
		t.Errorf("a caller got an error: %s", e)
	}
	if charged != granted.Load() {
		t.Errorf("Redis holds %d charges, the callers were granted %d: counts were not conserved across the moves", charged, granted.Load())
	}
	if after["MOVED"]+after["ASK"] == before["MOVED"]+before["ASK"] {
		t.Error("no node answered MOVED or ASK: the moves were not exercised under load")
	}
}

// migrateSlot moves slot, keys included, from src to dst, in the steps
// the CLUSTER SETSLOT documentation gives, and calls settle in each state
// the slot passes through (open on both sides, its keys moved, moved) for
// the load to meet it.
func migrateSlot(t *testing.T, c *redistest.Cluster, slot int, src, dst *redistest.Node, masters []*redistest.Node, settle func(state string)) {
	t.Helper()
	ctx := t.Context()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	host, port, ok := strings.Cut(dst.Addr(), ":")
	if !ok {
		t.Fatalf("bad address %s", dst.Addr())
	}
	must(dst.Client().Do(ctx, "cluster", "setslot", slot, "importing", src.ID()).Err())
	must(src.Client().Do(ctx, "cluster", "setslot", slot, "migrating", dst.ID()).Err())
	settle("while the slot is open on both sides")
	for {
		keys, err := src.Client().ClusterGetKeysInSlot(ctx, slot, 100).Result()
		must(err)
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Client().Do(ctx, args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
	}
	// Leave the slot half moved while every caller calls: they meet ASK.
	settle("while the slot's keys are on the new owner, the slot still open")
	// The new owner first, then the old one, then the others, as the
	// CLUSTER SETSLOT documentation prescribes: the other way round, the
	// old owner sends callers to a new one that, still importing, sends
	// them back.
	order := []*redistest.Node{dst, src}
	for _, m := range masters {
		if m != dst && m != src {
			order = append(order, m)
		}
	}
	for _, m := range order {
		must(m.Client().Do(ctx, "cluster", "setslot", slot, "node", dst.ID()).Err())
	}
	// Every caller's slot map still names the old owner: they meet MOVED.
	settle("after the move")
}
