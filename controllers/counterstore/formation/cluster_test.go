package formation_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/controllers/counterstore/formation"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

const password = "formation-test-secret"

// testCluster is a set of unformed nodes, each on a loopback IP of its own
// as Pods are, and the spec that forms them.
type testCluster struct {
	t     *testing.T
	rc    *redistest.Cluster
	nodes []*redistest.Node
	spec  formation.Spec
	sess  *formation.Session
}

// Node timeouts of the test clusters. A test that kills nodes needs Redis
// to notice within a second. One that kills none must not have it notice
// anything: on a loaded machine a node can go unscheduled for over a
// second, and its peers would flag it failed, fail it over and leave the
// formation a repair to make that the test never asked for.
const (
	faultNodeTimeout = time.Second
	quietNodeTimeout = 15 * time.Second
)

func newTestCluster(t *testing.T, shards, replicas int, nodeTimeout time.Duration) *testCluster {
	t.Helper()
	c := &testCluster{t: t, spec: formation.Spec{Shards: shards, ReplicasPerShard: replicas}}
	c.sess = formation.NewSession(formation.Dialer{Password: password})
	t.Cleanup(func() { _ = c.sess.Close() })
	c.rc = redistest.StartCluster(t, redistest.Options{
		Masters: shards, Replicas: replicas, Unformed: true, IPPerNode: true,
		Password: password, NodeTimeout: nodeTimeout, PartialCoverage: true,
	})
	c.add(c.rc.Nodes())
	return c
}

// grow starts n more nodes and appends them as members.
func (c *testCluster) grow(n int) {
	c.t.Helper()
	added, err := c.rc.AddNodes(n)
	if err != nil {
		c.t.Fatal(err)
	}
	c.add(added)
}

func (c *testCluster) add(nodes []*redistest.Node) {
	for _, nd := range nodes {
		c.spec.Members = append(c.spec.Members, formation.Member{Name: "node-" + strconv.Itoa(len(c.nodes)), Addr: nd.Addr()})
		c.nodes = append(c.nodes, nd)
	}
}

// kill kills node i.
func (c *testCluster) kill(i int) {
	c.t.Helper()
	if err := c.rc.Kill(c.nodes[i]); err != nil {
		c.t.Fatal(err)
	}
}

// reschedule brings killed node i back as its Pod would come back: on a
// new IP or not, with its cluster identity or as a new node.
func (c *testCluster) reschedule(i int, newIP, keepID bool) {
	c.t.Helper()
	if err := c.rc.Reschedule(c.nodes[i], newIP, keepID); err != nil {
		c.t.Fatal(err)
	}
}

// myID asks node i for its cluster ID.
func (c *testCluster) myID(i int) string {
	c.t.Helper()
	id, err := c.nodes[i].Client().ClusterMyID(c.t.Context()).Result()
	if err != nil {
		c.t.Fatalf("cluster myid on %s: %v", c.nodes[i].Addr(), err)
	}
	return id
}

// refresh copies the nodes' current addresses into the spec, as the store
// controller does from the Pods' IPs.
func (c *testCluster) refresh() {
	for i, n := range c.nodes {
		c.spec.Members[i].Addr = n.Addr()
	}
}

// converge runs passes until one is converged and the cluster is ready and
// whole, and returns the last result.
func (c *testCluster) converge(timeout time.Duration) formation.Result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.t.Context(), timeout)
	defer cancel()
	var last formation.Result
	var lastErr error
	passes := 0
	for {
		res, err := c.sess.Reconcile(ctx, c.spec, 10*time.Second)
		passes++
		if res.Pass != nil {
			for _, a := range res.Pass.Actions {
				c.t.Logf("pass %d (%s): %v", passes, res.Pass.Step, a)
			}
		}
		if err == nil {
			last = res
			h := formation.Assess(res.Snapshot, c.spec.ReplicasPerShard)
			if res.Pass.Converged() && h.Ready() && !h.Degraded() {
				return res
			}
		} else {
			lastErr = err
			c.t.Logf("pass %d: %v", passes, err)
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("not converged after %v (%d passes); last error: %v", timeout, passes, lastErr)
			if last.Pass != nil {
				msg += fmt.Sprintf("; step %s, waiting %q, problems %q, health %+v", last.Pass.Step, last.Pass.Waiting, last.Pass.Problems,
					formation.Assess(last.Snapshot, c.spec.ReplicasPerShard))
			}
			c.t.Fatal(msg)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// clusterClient returns a cluster client seeded with every live node.
func (c *testCluster) clusterClient() *redis.ClusterClient {
	var addrs []string
	for _, n := range c.nodes {
		if n.Running() {
			addrs = append(addrs, n.Addr())
		}
	}
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Password: password, Protocol: 2, DisableIdentity: true, MaxRedirects: 16})
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// writeKeys writes n keys and returns them with their values.
func (c *testCluster) writeKeys(prefix string, n int) map[string]string {
	c.t.Helper()
	cl := c.clusterClient()
	ctx := c.t.Context()
	kv := map[string]string{}
	for i := range n {
		k, v := fmt.Sprintf("%s:%d", prefix, i), strconv.Itoa(i*7)
		if err := cl.Set(ctx, k, v, 0).Err(); err != nil {
			c.t.Fatalf("set %s: %v", k, err)
		}
		kv[k] = v
	}
	return kv
}

// checkKeys fails for every key that is missing or wrong, read through a
// fresh cluster client.
func (c *testCluster) checkKeys(kv map[string]string) {
	c.t.Helper()
	cl := c.clusterClient()
	ctx := c.t.Context()
	lost := 0
	for k, want := range kv {
		got, err := cl.Get(ctx, k).Result()
		if err != nil || got != want {
			lost++
			if lost <= 5 {
				c.t.Errorf("key %s = %q, %v; want %q", k, got, err, want)
			}
		}
	}
	if lost > 0 {
		c.t.Errorf("%d of %d keys lost or wrong", lost, len(kv))
	}
}

// checkShape checks every node's own account: cluster_state ok, all slots
// ok, the wanted number of masters each with its replicas, and slots split
// evenly.
func (c *testCluster) checkShape() {
	c.t.Helper()
	ctx := c.t.Context()
	masters := map[string]int{} // id -> slots
	replicas := map[string]int{}
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		info, err := n.Client().ClusterInfo(ctx).Result()
		if err != nil {
			c.t.Fatalf("cluster info on %s: %v", n.Addr(), err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			c.t.Errorf("%s: cluster info %q", n.Addr(), info)
		}
		raw, err := n.Client().ClusterNodes(ctx).Result()
		if err != nil {
			c.t.Fatal(err)
		}
		view, err := formation.ParseClusterNodes(raw)
		if err != nil {
			c.t.Fatal(err)
		}
		self, _ := view.Self()
		if self.IsMaster() && self.SlotCount() > 0 {
			masters[self.ID] = self.SlotCount()
		}
		if self.IsReplica() {
			replicas[self.MasterID]++
		}
	}
	if len(masters) != c.spec.Shards {
		c.t.Errorf("%d masters serve slots, want %d", len(masters), c.spec.Shards)
	}
	for id, n := range masters {
		if want := formation.NumSlots / c.spec.Shards; n < want || n > want+1 {
			c.t.Errorf("master %s serves %d slots, want %d or %d", id[:8], n, want, want+1)
		}
		if replicas[id] != c.spec.ReplicasPerShard {
			c.t.Errorf("master %s has %d replicas, want %d", id[:8], replicas[id], c.spec.ReplicasPerShard)
		}
	}
}

// masterIndex returns the index of a node that serves slots.
func (c *testCluster) masterIndex() int {
	c.t.Helper()
	for i, n := range c.nodes {
		if !n.Running() {
			continue
		}
		raw, err := n.Client().ClusterNodes(c.t.Context()).Result()
		if err != nil {
			c.t.Fatal(err)
		}
		view, _ := formation.ParseClusterNodes(raw)
		if self, _ := view.Self(); self.IsMaster() && self.SlotCount() > 0 {
			return i
		}
	}
	c.t.Fatal("no master")
	return -1
}

func TestFormFromScratch(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, 1, quietNodeTimeout)
	start := time.Now()
	res := c.converge(30 * time.Second)
	t.Logf("3x1 formed in %v", time.Since(start).Round(time.Millisecond))
	c.checkShape()
	h := formation.Assess(res.Snapshot, 1)
	if h.SlotsCovered != formation.NumSlots || h.Primaries != 3 || h.Replicas != 3 || h.Failed != 0 || len(h.Masters) != 3 {
		t.Errorf("health = %+v, want 16384 slots, 3 primaries, 3 replicas, none failed", h)
	}
	// Contiguous ranges in member order, as the planner promises.
	raw, err := c.nodes[0].Client().ClusterNodes(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	view, _ := formation.ParseClusterNodes(raw)
	self, _ := view.Self()
	if got := formation.FormatRanges(self.Slots); got != "0-5461" {
		t.Errorf("node-0 serves %s, want 0-5461", got)
	}

	// Idempotent: a formed cluster needs nothing more.
	again, err := c.sess.Reconcile(t.Context(), c.spec, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Pass.Converged() || len(again.Pass.Actions) != 0 {
		t.Errorf("second pass on a formed cluster: step %s, actions %v, waiting %q", again.Pass.Step, again.Pass.Actions, again.Pass.Waiting)
	}
	kv := c.writeKeys("fresh", 300)
	c.checkKeys(kv)
}

func TestReplicasOnOtherHosts(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, 1, quietNodeTimeout)
	// Pods 0..5 on hosts h0 h1 h2 h0 h1 h2: masters 0,1,2 take one host
	// each, so each replica must be on another host than its master.
	for i := range c.spec.Members {
		c.spec.Members[i].Host = "h" + strconv.Itoa(i%3)
	}
	res := c.converge(30 * time.Second)
	hostOf := map[string]string{}
	for _, n := range res.Snapshot.Nodes {
		hostOf[n.ID] = n.Host
	}
	for _, n := range res.Snapshot.Nodes {
		if n.Self.IsReplica() && hostOf[n.Self.MasterID] == n.Host {
			t.Errorf("%s on %s replicates a master on the same host", n.Name, n.Host)
		}
	}
}

func TestMasterReplacedBeforeFailover(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, 1, faultNodeTimeout)
	c.converge(30 * time.Second)
	kv := c.writeKeys("replaced", 500)
	waitReplicated(t, c)

	// The master's Pod restarts at once, empty and with a new identity,
	// on the same address: peers mark the old ID noaddr and Redis never
	// fails it over on its own. The formation forces the failover.
	m := c.masterIndex()
	c.kill(m)
	c.reschedule(m, false, false)
	start := time.Now()
	c.converge(40 * time.Second)
	t.Logf("healed in %v", time.Since(start).Round(time.Millisecond))
	c.checkShape()
	c.checkKeys(kv)
}

func TestMasterKilledThenReplaced(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, 1, faultNodeTimeout)
	c.converge(30 * time.Second)
	kv := c.writeKeys("killed", 500)
	waitReplicated(t, c)
	m := c.masterIndex()
	c.kill(m)

	// While the node is down, Redis fails over; the pass waits for it and
	// never touches the shard itself.
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := c.sess.Reconcile(t.Context(), c.spec, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range res.Pass.Actions {
			if a.Kind == formation.ActForget || a.Kind == formation.ActAddSlots {
				t.Fatalf("while a member is down the pass did %v", a)
			}
		}
		if h := formation.Assess(res.Snapshot, 1); h.Ready() {
			if !h.Degraded() || h.Primaries != 3 || h.MissingReplicas != 1 {
				t.Errorf("after failover health = %+v, want degraded, 3 primaries, 1 missing replica", h)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover in 20s: %q", res.Pass.Waiting)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.reschedule(m, false, false)
	c.converge(30 * time.Second)
	c.checkShape()
	c.checkKeys(kv)
}

func TestRestartAtNewAddressKeepsIdentity(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, 1, faultNodeTimeout)
	c.converge(30 * time.Second)
	for _, i := range []int{c.masterIndex(), 5} {
		id, addr := c.myID(i), c.nodes[i].Addr()
		c.kill(i)
		c.reschedule(i, true, true)
		if c.nodes[i].Addr() == addr {
			t.Fatalf("node %d came back at its old address %s", i, addr)
		}
		c.refresh()
		res := c.converge(30 * time.Second)
		if got := c.myID(i); got != id {
			t.Fatalf("node came back as %s, want %s", got, id)
		}
		for _, n := range res.Snapshot.Nodes {
			if v, ok := n.View.Node(id); ok && v.Addr != c.nodes[i].Addr() {
				t.Errorf("%s sees %s at %s, want %s", n.Name, id[:8], v.Addr, c.nodes[i].Addr())
			}
			if len(n.View) != 6 {
				t.Errorf("%s knows %d nodes, want 6", n.Name, len(n.View))
			}
		}
	}
	c.checkShape()
}

func TestLostShardWithoutReplica(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, 0, faultNodeTimeout)
	c.converge(30 * time.Second)
	kv := c.writeKeys("lost", 600)
	m := c.masterIndex()
	ctx := t.Context()
	raw, _ := c.nodes[m].Client().ClusterNodes(ctx).Result()
	view, _ := formation.ParseClusterNodes(raw)
	self, _ := view.Self()
	lostSlots := formation.SlotSetOf(self.Slots...)
	c.kill(m)
	c.reschedule(m, true, false)
	c.refresh()
	c.converge(30 * time.Second)
	c.checkShape()
	// The keys of the lost shard are gone (no persistence, no replica);
	// every other key survives.
	cl := c.clusterClient()
	survived := map[string]string{}
	for k, v := range kv {
		slot, err := cl.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !lostSlots.Has(int(slot)) {
			survived[k] = v
		}
	}
	if len(survived) == 0 || len(survived) == len(kv) {
		t.Fatalf("%d of %d keys outside the lost shard; the test needs both kinds", len(survived), len(kv))
	}
	c.checkKeys(survived)
}

func TestScaleUpMigratesKeys(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, 1, quietNodeTimeout)
	c.converge(30 * time.Second)
	kv := c.writeKeys("up", 3000)
	c.spec.Shards = 4
	c.grow(2)
	start := time.Now()
	res := c.converge(60 * time.Second)
	t.Logf("3x1 -> 4x1 with %d keys in %v", len(kv), time.Since(start).Round(time.Millisecond))
	c.checkShape()
	c.checkKeys(kv)
	if h := formation.Assess(res.Snapshot, 1); len(h.Masters) != 4 {
		t.Errorf("masters = %v, want 4", h.Masters)
	}
}

func TestScaleDownDrainsLeavingNodes(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 4, 1, faultNodeTimeout)
	c.converge(30 * time.Second)
	kv := c.writeKeys("down", 2000)
	waitReplicated(t, c)
	c.spec.Shards = 3
	c.spec.Members[6].Leaving = true
	c.spec.Members[7].Leaving = true
	// Pass until the leaving members hold nothing.
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := c.sess.Reconcile(t.Context(), c.spec, 10*time.Second)
		if err == nil && res.Pass.Drained && res.Pass.Converged() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained in 60s: err %v, pass %+v", err, res.Pass)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.checkKeys(kv)
	// Remove the leaving nodes, as the StatefulSet does when scaled down.
	c.kill(6)
	c.kill(7)
	c.nodes = c.nodes[:6]
	c.spec.Members = c.spec.Members[:6]
	res := c.converge(60 * time.Second)
	c.checkShape()
	c.checkKeys(kv)
	for _, n := range res.Snapshot.Nodes {
		if len(n.View) != 6 {
			t.Errorf("%s still knows %d nodes, want the 6 members", n.Name, len(n.View))
		}
	}
}

func TestFinishesInterruptedMigration(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, 0, quietNodeTimeout)
	c.converge(30 * time.Second)
	ctx := t.Context()
	cl := c.clusterClient()
	// Keys in one slot: a hash tag pins them.
	kv := map[string]string{}
	for i := range 50 {
		k := fmt.Sprintf("{moving}:%d", i)
		if err := cl.Set(ctx, k, strconv.Itoa(i), 0).Err(); err != nil {
			t.Fatal(err)
		}
		kv[k] = strconv.Itoa(i)
	}
	slot, err := cl.ClusterKeySlot(ctx, "{moving}").Result()
	if err != nil {
		t.Fatal(err)
	}
	var src, dst *redistest.Node
	var srcID, dstID string
	for _, n := range c.nodes {
		raw, _ := n.Client().ClusterNodes(ctx).Result()
		view, _ := formation.ParseClusterNodes(raw)
		self, _ := view.Self()
		set := formation.SlotSetOf(self.Slots...)
		if set.Has(int(slot)) {
			src, srcID = n, self.ID
		} else if dst == nil {
			dst, dstID = n, self.ID
		}
	}
	// A reshard that died half way: the slot is open on both sides and
	// part of its keys moved.
	if err := dst.Client().Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := src.Client().Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err(); err != nil {
		t.Fatal(err)
	}
	keys, err := src.Client().ClusterGetKeysInSlot(ctx, int(slot), 20).Result()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(dst.Addr(), ":")
	args := []any{"migrate", host, port, "", 0, 5000, "auth", password, "keys"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := src.Client().Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := c.sess.Reconcile(ctx, c.spec, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if res.Pass.Step != formation.StepFixSlots {
		t.Errorf("first pass step = %s, want %s", res.Pass.Step, formation.StepFixSlots)
	}
	c.converge(30 * time.Second)
	c.checkKeys(kv)
	// The fix finishes toward the destination, which now serves the slot;
	// the next passes rebalance, so the slot may have moved on, but it is
	// served and no node has it open.
	for _, n := range c.nodes {
		raw, _ := n.Client().ClusterNodes(ctx).Result()
		if strings.Contains(raw, "->-") || strings.Contains(raw, "-<-") {
			t.Errorf("%s still has open slots: %s", n.Addr(), raw)
		}
	}
}

func TestLeavesAnotherClusterAlone(t *testing.T) {
	t.Parallel()
	a := newTestCluster(t, 3, 0, quietNodeTimeout)
	a.converge(30 * time.Second)
	b := newTestCluster(t, 1, 0, quietNodeTimeout)
	b.converge(30 * time.Second)
	kv := b.writeKeys("other", 50)
	// b's node is listed as a member of a by mistake: it serves slots of
	// its own cluster, so a never meets it.
	spec := a.spec
	spec.Members = append(append([]formation.Member(nil), a.spec.Members...), b.spec.Members[0])
	for range 3 {
		res, err := a.sess.Reconcile(t.Context(), spec, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Pass.Problems) == 0 {
			t.Errorf("no problem reported for a member of another cluster")
		}
		for _, act := range res.Pass.Actions {
			if act.Node == b.nodes[0].Addr() || act.Peer == b.nodes[0].Addr() {
				t.Errorf("pass touched the other cluster's node: %v", act)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.checkShape()
	b.checkKeys(kv)
	a.checkShape()
}

// waitReplicated waits until every replica has caught up with its master.
func waitReplicated(t *testing.T, c *testCluster) {
	t.Helper()
	var clients []*redis.Client
	for _, n := range c.nodes {
		if n.Running() {
			clients = append(clients, n.Client())
		}
	}
	if err := redistest.WaitReplicated(t.Context(), clients, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
