package formation

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// fakeNode describes one node of a synthetic snapshot.
type fakeNode struct {
	name     string
	master   string // replica of this node name
	slots    []SlotRange
	keys     int64
	leaving  bool
	down     bool   // the operator cannot reach it; peers flag it fail
	noAddr   bool   // peers see it without an address
	ghost    bool   // no member: a replaced node that peers remember
	alone    bool   // knows only itself and nobody knows it (fresh)
	addr     string // default derived from the name
	migrate  map[int]string
	importng map[int]string
	syncing  bool // a replica whose initial sync is not done
}

func idOf(name string) string { return fmt.Sprintf("%040s", strings.ReplaceAll(name, "-", "0")) }

func addrOf(f fakeNode) string {
	if f.addr != "" {
		return f.addr
	}
	return "10.0.0." + strings.TrimPrefix(f.name, "n") + ":6379"
}

// snapshotOf builds a snapshot in which every reachable node sees every
// non-fresh node the same way.
func snapshotOf(nodes ...fakeNode) *Snapshot {
	line := func(f fakeNode, self bool) NodeView {
		v := NodeView{ID: idOf(f.name), Addr: addrOf(f), Connected: !f.down && !f.ghost, Slots: f.slots}
		if f.master != "" {
			v.Flags |= FlagReplica
			v.MasterID = idOf(f.master)
		} else {
			v.Flags |= FlagMaster
		}
		if f.down || f.ghost {
			v.Flags |= FlagFail
		}
		if f.noAddr {
			v.Flags = v.Flags&^FlagFail | FlagNoAddr
			v.Addr = ""
		}
		if self {
			v.Flags = v.Flags&^(FlagFail|FlagNoAddr) | FlagMyself
			v.Addr = addrOf(f)
			v.Connected = true
			v.Migrating, v.Importing = f.migrate, f.importng
		}
		return v
	}
	snap := &Snapshot{}
	for _, f := range nodes {
		if f.ghost {
			continue
		}
		n := NodeState{Member: Member{Name: f.name, Addr: addrOf(f), Leaving: f.leaving}}
		if !f.down {
			n.Reachable = true
			n.ID = idOf(f.name)
			n.StateOK = true
			n.Keys = f.keys
			n.ReplicaInSync = f.master != "" && !f.syncing
			for _, g := range nodes {
				switch {
				case g.name == f.name:
					n.View = append(n.View, line(g, true))
				case f.alone || g.alone:
				default:
					n.View = append(n.View, line(g, false))
				}
			}
			n.Self, _ = n.View.Self()
		} else {
			n.Err = fmt.Errorf("connection refused")
		}
		snap.Nodes = append(snap.Nodes, n)
	}
	return snap
}

func spec(shards, replicas int) Spec { return Spec{Shards: shards, ReplicasPerShard: replicas} }

// formed33 is a formed 3x1 cluster: n0..n2 masters, n3..n5 replicas.
func formed33() []fakeNode {
	return []fakeNode{
		{name: "n0", slots: []SlotRange{{0, 5461}}},
		{name: "n1", slots: []SlotRange{{5462, 10922}}},
		{name: "n2", slots: []SlotRange{{10923, 16383}}},
		{name: "n3", master: "n0"},
		{name: "n4", master: "n1"},
		{name: "n5", master: "n2"},
	}
}

func kinds(p *Pass) []string {
	var out []string
	for _, a := range p.Actions {
		out = append(out, string(a.Kind)+"@"+a.Node)
	}
	return out
}

func TestPlanFreshMeets(t *testing.T) {
	t.Parallel()
	var nodes []fakeNode
	for i := range 6 {
		nodes = append(nodes, fakeNode{name: fmt.Sprint("n", i), alone: true})
	}
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	if p.Step != StepMeet {
		t.Fatalf("step = %s, want %s", p.Step, StepMeet)
	}
	epochs, meets := 0, 0
	seenEpoch := map[uint64]bool{}
	for _, a := range p.Actions {
		switch a.Kind {
		case ActSetConfigEpoch:
			epochs++
			if seenEpoch[a.Epoch] {
				t.Errorf("epoch %d set twice", a.Epoch)
			}
			seenEpoch[a.Epoch] = true
		case ActMeet:
			meets++
			if a.Node != "10.0.0.0:6379" {
				t.Errorf("meet from %s, want from the anchor n0", a.Node)
			}
		default:
			t.Errorf("unexpected action %v", a)
		}
	}
	if epochs != 6 || meets != 5 {
		t.Errorf("actions %v: want 6 epochs and 5 meets", kinds(p))
	}
}

func TestPlanFreshAssigns(t *testing.T) {
	t.Parallel()
	var nodes []fakeNode
	for i := range 6 {
		nodes = append(nodes, fakeNode{name: fmt.Sprint("n", i)})
	}
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	if p.Step != StepAssign {
		t.Fatalf("step = %s (waiting %q), want %s", p.Step, p.Waiting, StepAssign)
	}
	got := map[string]string{}
	for _, a := range p.Actions {
		switch a.Kind {
		case ActAddSlots:
			got[a.Node] = FormatRanges(a.Slots)
		case ActReplicate:
			got[a.Node] = "replica of " + a.PeerID[len(a.PeerID)-2:]
		}
	}
	want := map[string]string{
		"10.0.0.0:6379": "0-5461", "10.0.0.1:6379": "5462-10922", "10.0.0.2:6379": "10923-16383",
		"10.0.0.3:6379": "replica of n0", "10.0.0.4:6379": "replica of n1", "10.0.0.5:6379": "replica of n2",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("assign = %v\nwant %v", got, want)
	}
}

func TestPlanFreshWaitsForEnoughNodes(t *testing.T) {
	t.Parallel()
	p := Plan(snapshotOf(fakeNode{name: "n0"}, fakeNode{name: "n1"}, fakeNode{name: "n2", down: true}), spec(3, 0))
	if len(p.Actions) != 0 || len(p.Waiting) == 0 {
		t.Errorf("with 2 of 3 masters: actions %v, waiting %q; want to wait, not form a 2-master cluster", kinds(p), p.Waiting)
	}
}

func TestPlanFormedIsDone(t *testing.T) {
	t.Parallel()
	p := Plan(snapshotOf(formed33()...), spec(3, 1))
	if !p.Converged() || len(p.Actions) != 0 || !p.Drained {
		t.Errorf("formed cluster: step %s, actions %v, waiting %q, drained %v; want done", p.Step, kinds(p), p.Waiting, p.Drained)
	}
}

func TestPlanRemeetsChangedAddress(t *testing.T) {
	t.Parallel()
	snap := snapshotOf(formed33()...)
	// n4 came back at a new address with its identity: the others still
	// have the old one.
	snap.Nodes[4].Addr = "10.0.1.4:6379"
	for _, v := range snap.Nodes[4].View {
		if v.Flags.Has(FlagMyself) {
			snap.Nodes[4].View[slices.IndexFunc(snap.Nodes[4].View, func(x NodeView) bool { return x.ID == v.ID })].Addr = "10.0.1.4:6379"
		}
	}
	p := Plan(snap, spec(3, 1))
	if p.Step != StepMeet {
		t.Fatalf("step = %s, want %s", p.Step, StepMeet)
	}
	for _, a := range p.Actions {
		if a.Kind != ActMeet || a.Peer != "10.0.1.4:6379" {
			t.Errorf("action %v, want only meets of the new address", a)
		}
	}
	if len(p.Actions) == 0 {
		t.Error("no meet")
	}
}

func TestPlanForcesFailoverOfReplacedMaster(t *testing.T) {
	t.Parallel()
	nodes := formed33()
	// n0 was replaced by n6 at its address before anyone flagged it: the
	// peers dropped its address (noaddr).
	nodes[0] = fakeNode{name: "n0", slots: nodes[0].slots, ghost: true, noAddr: true}
	nodes = append(nodes, fakeNode{name: "n6", addr: "10.0.0.0:6379", alone: false})
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	if p.Step != StepForget || len(p.Actions) != 1 || p.Actions[0].Kind != ActFailover || p.Actions[0].Mode != "FORCE" || p.Actions[0].Node != "10.0.0.3:6379" {
		t.Errorf("step %s, actions %v; want a forced failover to n3", p.Step, p.Actions)
	}
}

func TestPlanWaitsForRedisFailoverOfFailedGhost(t *testing.T) {
	t.Parallel()
	nodes := formed33()
	nodes[0] = fakeNode{name: "n0", slots: nodes[0].slots, ghost: true}
	nodes = append(nodes, fakeNode{name: "n6"})
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	if len(p.Actions) != 0 || len(p.Waiting) == 0 {
		t.Errorf("actions %v, waiting %q; want to wait for Redis's own failover of a failed master", kinds(p), p.Waiting)
	}
}

func TestPlanForgetsGhosts(t *testing.T) {
	t.Parallel()
	nodes := formed33()
	// n3, n0's replica, was replaced by n6.
	nodes[3] = fakeNode{name: "n3", master: "n0", ghost: true}
	nodes = append(nodes, fakeNode{name: "n6"})
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	if p.Step != StepForget {
		t.Fatalf("step = %s, want %s", p.Step, StepForget)
	}
	if len(p.Actions) != 6 {
		t.Errorf("actions %v, want a forget on each of the 6 members", kinds(p))
	}
	for _, a := range p.Actions {
		if a.Kind != ActForget || a.PeerID != idOf("n3") {
			t.Errorf("action %v, want forget n3", a)
		}
	}
}

func TestPlanKeepsGhostsWhileAMemberIsDown(t *testing.T) {
	t.Parallel()
	nodes := formed33()
	nodes[3] = fakeNode{name: "n3", master: "n0", ghost: true}
	nodes = append(nodes, fakeNode{name: "n6", down: true})
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	for _, a := range p.Actions {
		if a.Kind == ActForget {
			t.Errorf("forgot %v while member n6 is unreachable (its ID is unknown)", a)
		}
	}
}

func TestPlanWaitsForFailoverOfDownMember(t *testing.T) {
	t.Parallel()
	nodes := formed33()
	nodes[1].down = true
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	if p.Step != StepFailover || len(p.Actions) != 0 || len(p.Waiting) != 1 {
		t.Errorf("step %s, actions %v, waiting %q; want to wait for Redis to fail n1 over", p.Step, kinds(p), p.Waiting)
	}
}

func TestPlanTakesOverWithoutMajority(t *testing.T) {
	t.Parallel()
	nodes := formed33()
	nodes[1].down = true
	nodes[2].down = true
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	var got []string
	for _, a := range p.Actions {
		got = append(got, fmt.Sprintf("%s %s@%s", a.Kind, a.Mode, a.Node))
	}
	want := []string{"Failover TAKEOVER@10.0.0.4:6379", "Failover TAKEOVER@10.0.0.5:6379"}
	if !slices.Equal(got, want) {
		t.Errorf("two of three masters down: actions %v, want %v", got, want)
	}
}

func TestPlanLostShardWaitsForItsMember(t *testing.T) {
	t.Parallel()
	nodes := []fakeNode{
		{name: "n0", slots: []SlotRange{{0, 5461}}},
		{name: "n1", slots: []SlotRange{{5462, 10922}}, down: true},
		{name: "n2", slots: []SlotRange{{10923, 16383}}},
	}
	p := Plan(snapshotOf(nodes...), spec(3, 0))
	if len(p.Actions) != 0 || len(p.Waiting) == 0 || !strings.Contains(p.Waiting[0], "no replica") {
		t.Errorf("actions %v, waiting %q; want to wait and say the shard has no replica", kinds(p), p.Waiting)
	}
}

func TestPlanCoversForgottenShard(t *testing.T) {
	t.Parallel()
	// The lost master was forgotten: its slots are free, and the new node
	// n3 takes them.
	nodes := []fakeNode{
		{name: "n0", slots: []SlotRange{{0, 5461}}},
		{name: "n1", slots: []SlotRange{{5462, 10922}}},
		{name: "n3"},
	}
	p := Plan(snapshotOf(nodes...), spec(3, 0))
	if p.Step != StepAssign || len(p.Actions) != 1 || p.Actions[0].Kind != ActAddSlots || p.Actions[0].Node != "10.0.0.3:6379" ||
		FormatRanges(p.Actions[0].Slots) != "10923-16383" {
		t.Errorf("step %s, actions %v; want n3 to add 10923-16383", p.Step, p.Actions)
	}
}

func TestPlanLeavingMasterHandsOver(t *testing.T) {
	t.Parallel()
	nodes := formed33()
	nodes[0].leaving = true
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	if p.Drained {
		t.Error("drained while a leaving member serves slots")
	}
	if len(p.Actions) != 1 || p.Actions[0].Kind != ActFailover || p.Actions[0].Mode != "" || p.Actions[0].Node != "10.0.0.3:6379" {
		t.Errorf("actions %v, want a manual failover to n3", p.Actions)
	}
}

func TestPlanLeavingMasterWithoutReplicaIsMigrated(t *testing.T) {
	t.Parallel()
	nodes := []fakeNode{
		{name: "n0", slots: []SlotRange{{0, 4095}}},
		{name: "n1", slots: []SlotRange{{4096, 8191}}},
		{name: "n2", slots: []SlotRange{{8192, 12287}}},
		{name: "n3", slots: []SlotRange{{12288, 16383}}, leaving: true},
	}
	p := Plan(snapshotOf(nodes...), spec(3, 0))
	if p.Step != StepRebalance {
		t.Fatalf("step = %s (waiting %q), want %s", p.Step, p.Waiting, StepRebalance)
	}
	moved := 0
	for _, a := range p.Actions {
		if a.Kind != ActMigrate || a.Node != "10.0.0.3:6379" {
			t.Errorf("action %v, want migrations from n3", a)
		}
		moved += countSlots(a.Slots)
	}
	if moved != 4096 {
		t.Errorf("moved %d slots, want 4096", moved)
	}
}

func TestPlanScaleUpPromotesSpare(t *testing.T) {
	t.Parallel()
	nodes := append(formed33(), fakeNode{name: "n6"}, fakeNode{name: "n7"})
	p := Plan(snapshotOf(nodes...), spec(4, 1))
	// The first spare becomes the fourth master, the second its replica.
	if p.Step != StepAssign || len(p.Actions) != 1 || p.Actions[0].Kind != ActReplicate || p.Actions[0].Node != "10.0.0.7:6379" || p.Actions[0].PeerID != idOf("n6") {
		t.Fatalf("step %s, actions %v; want n7 to replicate n6", p.Step, p.Actions)
	}
	// Once placed, the slots move to n6.
	nodes[7].master = "n6"
	p = Plan(snapshotOf(nodes...), spec(4, 1))
	if p.Step != StepRebalance {
		t.Fatalf("step = %s, want %s", p.Step, StepRebalance)
	}
	for _, a := range p.Actions {
		if a.Kind != ActMigrate || a.PeerID != idOf("n6") {
			t.Errorf("action %v, want migrations to n6", a)
		}
	}
}

func TestPlanExcludesForeignNode(t *testing.T) {
	t.Parallel()
	nodes := formed33()
	nodes = append(nodes, fakeNode{name: "n9", slots: []SlotRange{{0, 16383}}, alone: true})
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	if len(p.Problems) != 1 {
		t.Errorf("problems %q, want one about n9", p.Problems)
	}
	for _, a := range p.Actions {
		if a.Node == "10.0.0.9:6379" || a.Peer == "10.0.0.9:6379" {
			t.Errorf("action %v touches the foreign node", a)
		}
	}
}

func TestPlanFinishesOpenSlots(t *testing.T) {
	t.Parallel()
	nodes := []fakeNode{
		{name: "n0", slots: []SlotRange{{0, 5461}}, migrate: map[int]string{100: idOf("n1")}},
		{name: "n1", slots: []SlotRange{{5462, 10922}}, importng: map[int]string{100: idOf("n0"), 12000: idOf("n7")}},
		{name: "n2", slots: []SlotRange{{10923, 16383}}},
	}
	p := Plan(snapshotOf(nodes...), spec(3, 0))
	if p.Step != StepFixSlots {
		t.Fatalf("step = %s, want %s", p.Step, StepFixSlots)
	}
	got := map[string]string{}
	for _, a := range p.Actions {
		got[string(a.Kind)+"@"+a.Node] = FormatRanges(a.Slots)
	}
	// Slot 100 is finished toward n1. Slot 12000 is served by n2, so
	// n1's import of it from an unknown node is finished from n2.
	want := map[string]string{"Migrate@10.0.0.0:6379": "100", "Migrate@10.0.0.2:6379": "12000"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("fix = %v, want %v", got, want)
	}
}

func TestPlanStabilizesWhenOtherSideIsGone(t *testing.T) {
	t.Parallel()
	nodes := []fakeNode{
		{name: "n0", slots: []SlotRange{{0, 5461}}, migrate: map[int]string{7: idOf("n8")}},
		{name: "n1", slots: []SlotRange{{5462, 10922}}},
		{name: "n2", slots: []SlotRange{{10923, 16383}}},
	}
	p := Plan(snapshotOf(nodes...), spec(3, 0))
	if len(p.Actions) != 1 || p.Actions[0].Kind != ActStabilize || FormatRanges(p.Actions[0].Slots) != "7" {
		t.Errorf("actions %v, want to stabilize slot 7 on n0", p.Actions)
	}
}

func TestPlanSpareWithKeysIsAProblem(t *testing.T) {
	t.Parallel()
	nodes := append(formed33(), fakeNode{name: "n6", keys: 3})
	p := Plan(snapshotOf(nodes...), spec(3, 1))
	if len(p.Problems) != 1 || p.Converged() {
		t.Errorf("problems %q, converged %v; want one problem about n6's keys", p.Problems, p.Converged())
	}
	for _, a := range p.Actions {
		if a.Node == "10.0.0.6:6379" {
			t.Errorf("action %v on a node holding keys outside its slots", a)
		}
	}
}

func TestPlanNoReachableNode(t *testing.T) {
	t.Parallel()
	p := Plan(snapshotOf(fakeNode{name: "n0", down: true}), spec(1, 0))
	if len(p.Actions) != 0 || len(p.Waiting) == 0 {
		t.Errorf("actions %v, waiting %q", kinds(p), p.Waiting)
	}
}

func TestAssessCountsOnlyReplicasInSync(t *testing.T) {
	t.Parallel()
	nodes := formed33()
	if h := Assess(snapshotOf(nodes...), 1); !h.Ready() || h.Degraded() || h.Replicas != 3 {
		t.Fatalf("formed cluster: %+v, want ready, not degraded, 3 replicas", h)
	}
	// A replica still loading its master's data adds no redundancy yet:
	// promoting it would lose the keys it has not received.
	nodes[4].syncing = true
	h := Assess(snapshotOf(nodes...), 1)
	if !h.Ready() || !h.Degraded() || h.Replicas != 2 || h.MissingReplicas != 1 {
		t.Errorf("one replica syncing: %+v, want ready and degraded, 2 replicas, 1 missing", h)
	}
}

func TestReplicaInSync(t *testing.T) {
	t.Parallel()
	for info, want := range map[string]bool{
		"# Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\nmaster_link_status:up\r\nmaster_sync_in_progress:0\r\n":        true,
		"# Replication\r\nrole:slave\r\nmaster_link_status:down\r\nmaster_sync_in_progress:0\r\n":                              false,
		"# Replication\r\nrole:slave\r\nmaster_link_status:down\r\nmaster_sync_in_progress:1\r\nmaster_sync_total_bytes:9\r\n": false,
		"# Replication\r\nrole:master\r\nconnected_slaves:1\r\n":                                                               false,
		"": false,
	} {
		if got := ReplicaInSync(info); got != want {
			t.Errorf("ReplicaInSync(%q) = %v, want %v", info, got, want)
		}
	}
}
