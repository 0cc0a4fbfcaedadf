package formation

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Step names the stage of formation a pass is at. The stages run in this
// order; a pass acts on the first one with work to do and leaves the rest
// to later passes, which observe the result first.
type Step string

// The formation steps.
const (
	// StepMeet introduces unknown nodes (CLUSTER MEET) and re-introduces
	// nodes whose address changed.
	StepMeet Step = "Meet"
	// StepJoin waits until every reachable node sees every other one.
	StepJoin Step = "Join"
	// StepFixSlots finishes slot migrations that a previous pass left
	// half done, or closes them when one side is gone.
	StepFixSlots Step = "FixSlots"
	// StepForget fails over, or forgets, the nodes of the cluster that are
	// no member's any more.
	StepForget Step = "Forget"
	// StepFailover waits for Redis to fail over a master that is down, and
	// takes over when too few masters are left for Redis to do it.
	StepFailover Step = "Failover"
	// StepAssign covers unassigned slots and gives replicas their masters.
	StepAssign Step = "Assign"
	// StepRebalance migrates slots, keys included, to even the layout.
	StepRebalance Step = "Rebalance"
	// StepDone: the cluster has the wanted shape.
	StepDone Step = "Done"
)

// ActionKind is the kind of an Action.
type ActionKind string

// The action kinds, each one Redis command or, for Migrate, one protocol.
const (
	// ActSetConfigEpoch: CLUSTER SET-CONFIG-EPOCH Epoch on Node, before a
	// fresh node meets others, so that masters start with distinct
	// epochs.
	ActSetConfigEpoch ActionKind = "SetConfigEpoch"
	// ActMeet: CLUSTER MEET Peer on Node.
	ActMeet ActionKind = "Meet"
	// ActForget: CLUSTER FORGET PeerID on Node.
	ActForget ActionKind = "Forget"
	// ActReplicate: CLUSTER REPLICATE PeerID on Node.
	ActReplicate ActionKind = "Replicate"
	// ActFailover: CLUSTER FAILOVER [Mode] on the replica Node.
	ActFailover ActionKind = "Failover"
	// ActAddSlots: CLUSTER ADDSLOTSRANGE Slots on Node.
	ActAddSlots ActionKind = "AddSlots"
	// ActMigrate moves Slots from Node to Peer (ID PeerID), keys included:
	// SETSLOT IMPORTING and MIGRATING, GETKEYSINSLOT and MIGRATE ... KEYS
	// until the slot is empty, then SETSLOT NODE on the destination, the
	// source and every other master.
	ActMigrate ActionKind = "Migrate"
	// ActStabilize: CLUSTER SETSLOT slot STABLE on Node for each of Slots,
	// closing an open slot whose other side is gone.
	ActStabilize ActionKind = "Stabilize"
)

// Action is one step the executor takes on one node.
type Action struct {
	// Kind is what to do.
	Kind ActionKind
	// Node is the address of the node the command goes to.
	Node string
	// NodeID is that node's ID, for messages.
	NodeID string
	// Peer is the address to meet (Meet) or to migrate to (Migrate).
	Peer string
	// PeerID is the node to forget (Forget), to replicate (Replicate) or
	// to migrate to (Migrate).
	PeerID string
	// Epoch is the config epoch to set (SetConfigEpoch).
	Epoch uint64
	// Mode is the failover mode: "", "FORCE" or "TAKEOVER".
	Mode string
	// Slots are the slots to add, migrate or stabilize.
	Slots []SlotRange
}

// String describes the action for logs and events.
func (a Action) String() string {
	switch a.Kind {
	case ActSetConfigEpoch:
		return fmt.Sprintf("set config epoch %d on %s", a.Epoch, a.Node)
	case ActMeet:
		return fmt.Sprintf("meet %s from %s", a.Peer, a.Node)
	case ActForget:
		return fmt.Sprintf("forget %s on %s", short(a.PeerID), a.Node)
	case ActReplicate:
		return fmt.Sprintf("make %s a replica of %s", a.Node, short(a.PeerID))
	case ActFailover:
		mode := a.Mode
		if mode == "" {
			mode = "manual"
		}
		return fmt.Sprintf("%s failover to replica %s", strings.ToLower(mode), a.Node)
	case ActAddSlots:
		return fmt.Sprintf("add slots %s to %s", FormatRanges(a.Slots), a.Node)
	case ActMigrate:
		return fmt.Sprintf("migrate %d slots %s from %s to %s", countSlots(a.Slots), abbreviate(a.Slots), a.Node, a.Peer)
	case ActStabilize:
		return fmt.Sprintf("close open slots %s on %s", FormatRanges(a.Slots), a.Node)
	}
	return string(a.Kind)
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func countSlots(rs []SlotRange) int {
	n := 0
	for _, r := range rs {
		n += r.Len()
	}
	return n
}

func abbreviate(rs []SlotRange) string {
	if len(rs) > 4 {
		return FormatRanges(rs[:4]) + ",..."
	}
	return FormatRanges(rs)
}

// Pass is what one pass of the formation does: the actions of its step,
// or why it waits.
type Pass struct {
	// Step is the stage the pass is at.
	Step Step
	// Actions are the commands to run, in order.
	Actions []Action
	// Waiting says what the pass waits for when it cannot act.
	Waiting []string
	// Problems are conditions the formation will not resolve on its own,
	// such as a node that belongs to another cluster.
	Problems []string
	// Drained reports that no leaving member serves slots or has a slot
	// migration open, so the caller may remove them.
	Drained bool
}

// Converged reports whether the cluster has the wanted shape and nothing
// needs doing.
func (p *Pass) Converged() bool {
	return p.Step == StepDone && len(p.Waiting) == 0 && len(p.Problems) == 0
}

// planner holds one snapshot and what is derived from it.
type planner struct {
	snap   *Snapshot
	spec   Spec
	reach  []*NodeState
	anchor *NodeState
	// excluded are reachable members kept out of the cluster: nodes of
	// another cluster.
	excluded map[string]bool
	// unreachableIDs maps the ID the anchor sees at an unreachable
	// member's address to that member.
	unreachableIDs map[string]*NodeState
	pass           *Pass
	cached         *layout
}

// Plan decides the next pass from one snapshot. It is pure: it only reads
// snap and spec. Run the pass's actions, observe again and plan again
// until the pass is converged.
func Plan(snap *Snapshot, spec Spec) *Pass {
	p := &planner{snap: snap, spec: spec, excluded: map[string]bool{}, unreachableIDs: map[string]*NodeState{}, pass: &Pass{}}
	p.reach = snap.reachable()
	p.anchor = snap.anchor()
	if p.anchor == nil {
		p.pass.Step = StepMeet
		p.pass.Waiting = append(p.pass.Waiting, "no node is reachable")
		return p.pass
	}
	p.mapUnreachable()
	p.pass.Drained = p.drained()
	for _, step := range []func() bool{p.meet, p.join, p.fixSlots, p.forget, p.failover, p.assign, p.rebalance} {
		if step() {
			return p.pass
		}
	}
	p.pass.Step = StepDone
	return p.pass
}

func (p *planner) waitf(format string, args ...any) {
	p.pass.Waiting = append(p.pass.Waiting, fmt.Sprintf(format, args...))
}

func (p *planner) problemf(format string, args ...any) {
	p.pass.Problems = append(p.pass.Problems, fmt.Sprintf(format, args...))
}

// members returns the reachable members that take part: not excluded.
func (p *planner) members() []*NodeState {
	var out []*NodeState
	for _, n := range p.reach {
		if !p.excluded[n.ID] {
			out = append(out, n)
		}
	}
	return out
}

func (p *planner) allReachable() bool {
	for i := range p.snap.Nodes {
		if !p.snap.Nodes[i].Reachable {
			return false
		}
	}
	return true
}

func (p *planner) mapUnreachable() {
	for i := range p.snap.Nodes {
		n := &p.snap.Nodes[i]
		if n.Reachable || n.Addr == "" {
			continue
		}
		for _, id := range p.anchor.View.AtAddr(n.Addr) {
			if p.snap.byID(id) == nil {
				p.unreachableIDs[id] = n
			}
		}
	}
}

// drained reports whether no leaving member serves slots or has slots
// open.
func (p *planner) drained() bool {
	owners := p.anchor.View
	for i := range p.snap.Nodes {
		n := &p.snap.Nodes[i]
		if !n.Leaving {
			continue
		}
		if n.Reachable {
			if n.Self.IsMaster() && (n.Self.SlotCount() > 0 || len(n.Self.Migrating) > 0 || len(n.Self.Importing) > 0) {
				return false
			}
			if v, ok := owners.Node(n.ID); ok && v.IsMaster() && v.SlotCount() > 0 {
				return false
			}
			continue
		}
		if n.Addr == "" {
			continue
		}
		for _, id := range owners.AtAddr(n.Addr) {
			if v, _ := owners.Node(id); v.IsMaster() && v.SlotCount() > 0 {
				return false
			}
		}
	}
	return true
}

// meet introduces the nodes the anchor does not know, re-introduces nodes
// at their new address, and marks nodes of another cluster.
func (p *planner) meet() bool {
	a := p.anchor
	anySlots := false
	for _, n := range p.reach {
		if n.Self.SlotCount() > 0 {
			anySlots = true
		}
	}
	for _, n := range p.reach {
		if n == a {
			continue
		}
		_, known := a.View.Node(n.ID)
		_, knowsAnchor := n.View.Node(a.ID)
		if !known && !knowsAnchor && n.Self.SlotCount() > 0 {
			p.excluded[n.ID] = true
			p.problemf("%s (%s) serves slots but belongs to another cluster; leaving it alone", n.Name, n.Addr)
		}
	}
	// Fresh nodes get distinct config epochs before they meet, as
	// redis-cli --cluster create does, so that masters do not start with
	// colliding epochs.
	if !anySlots {
		for i, n := range p.reach {
			if len(n.View) == 1 && n.Self.ConfigEpoch == 0 {
				p.pass.Actions = append(p.pass.Actions, Action{Kind: ActSetConfigEpoch, Node: n.Addr, NodeID: n.ID, Epoch: uint64(i + 1)})
			}
		}
	}
	meets := 0
	for _, n := range p.members() {
		if n == a {
			continue
		}
		v, known := a.View.Node(n.ID)
		if known && v.Addr == n.Addr && !v.Flags.Has(FlagHandshake) {
			continue
		}
		if a.View.InHandshake(n.Addr) {
			p.waitf("%s is in handshake with %s", a.Name, n.Name)
			continue
		}
		p.pass.Actions = append(p.pass.Actions, Action{Kind: ActMeet, Node: a.Addr, NodeID: a.ID, Peer: n.Addr})
		meets++
	}
	// A node that still has another node at an old address meets it at the
	// new one, so the address is updated without waiting for gossip.
	for _, m := range p.members() {
		if m == a {
			continue
		}
		for _, n := range p.members() {
			if n == m {
				continue
			}
			if v, ok := m.View.Node(n.ID); ok && v.Addr != n.Addr && !m.View.InHandshake(n.Addr) {
				p.pass.Actions = append(p.pass.Actions, Action{Kind: ActMeet, Node: m.Addr, NodeID: m.ID, Peer: n.Addr})
				meets++
			}
		}
	}
	if meets == 0 && len(p.pass.Waiting) == 0 {
		p.pass.Actions = nil // epochs only matter before a meet
		return false
	}
	p.pass.Step = StepMeet
	return true
}

// join waits until every member sees every other, connected and at its
// address.
func (p *planner) join() bool {
	ms := p.members()
	for _, m := range ms {
		for _, n := range ms {
			if m == n {
				continue
			}
			v, ok := m.View.Node(n.ID)
			switch {
			case !ok:
				p.waitf("%s does not know %s yet", m.Name, n.Name)
			case v.Flags.Has(FlagHandshake) || !v.Connected:
				p.waitf("%s has no link to %s yet", m.Name, n.Name)
			case v.Addr != n.Addr:
				p.waitf("%s sees %s at %s, not %s", m.Name, n.Name, v.Addr, n.Addr)
			default:
				continue
			}
			p.pass.Step = StepJoin
			return true
		}
	}
	return false
}

// fixSlots finishes migrations left open: toward the importing side when
// both sides are reachable masters, else it closes the slot.
func (p *planner) fixSlots() bool {
	owners := p.anchor.View.Owners()
	type pair struct{ from, to *NodeState }
	moves := map[pair]*SlotSet{}
	stable := map[*NodeState]*SlotSet{}
	add := func(m map[pair]*SlotSet, k pair, slot int) {
		if m[k] == nil {
			m[k] = &SlotSet{}
		}
		m[k].Add(slot)
	}
	addStable := func(n *NodeState, slot int) {
		if stable[n] == nil {
			stable[n] = &SlotSet{}
		}
		stable[n].Add(slot)
	}
	for _, o := range p.members() {
		for slot, dst := range o.Self.Migrating {
			if d := p.snap.byID(dst); d != nil && d.Self.IsMaster() && !p.excluded[d.ID] {
				add(moves, pair{o, d}, slot)
			} else {
				addStable(o, slot)
			}
		}
	}
	for _, n := range p.members() {
		for slot, src := range n.Self.Importing {
			if s := p.snap.byID(src); s != nil && s.Self.Migrating[slot] == n.ID {
				continue // handled as the source's migration
			}
			owner := owners[slot]
			if o := p.snap.byID(owner); o != nil && o != n && o.Self.IsMaster() && !p.excluded[o.ID] {
				add(moves, pair{o, n}, slot)
			} else {
				addStable(n, slot)
			}
		}
	}
	if len(moves) == 0 && len(stable) == 0 {
		return false
	}
	for _, n := range p.reach {
		if s := stable[n]; s != nil {
			p.pass.Actions = append(p.pass.Actions, Action{Kind: ActStabilize, Node: n.Addr, NodeID: n.ID, Slots: s.Ranges()})
		}
	}
	keys := make([]pair, 0, len(moves))
	for k := range moves {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b pair) int {
		return cmp.Or(cmp.Compare(a.from.Addr, b.from.Addr), cmp.Compare(a.to.Addr, b.to.Addr))
	})
	for _, k := range keys {
		p.pass.Actions = append(p.pass.Actions, Action{Kind: ActMigrate, Node: k.from.Addr, NodeID: k.from.ID, Peer: k.to.Addr, PeerID: k.to.ID, Slots: moves[k].Ranges()})
	}
	p.pass.Step = StepFixSlots
	return true
}

// ghosts returns the IDs, in a stable order, of the nodes some member knows
// that are no member's: nodes whose Pod was replaced or removed. It is only
// meaningful when every member is reachable.
func (p *planner) ghosts() []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range p.members() {
		for _, v := range n.View {
			if v.Flags.Has(FlagHandshake) || seen[v.ID] || p.excluded[v.ID] {
				continue
			}
			seen[v.ID] = true
			if p.snap.byID(v.ID) == nil {
				out = append(out, v.ID)
			}
		}
	}
	slices.Sort(out)
	return out
}

// lineOf returns how the anchor, or else the first member that knows it,
// sees node id.
func (p *planner) lineOf(id string) NodeView {
	if v, ok := p.anchor.View.Node(id); ok {
		return v
	}
	for _, n := range p.members() {
		if v, ok := n.View.Node(id); ok {
			return v
		}
	}
	return NodeView{ID: id}
}

// replicasOf returns the reachable members that replicate id, by their
// own account, in member order.
func (p *planner) replicasOf(id string) []*NodeState {
	var out []*NodeState
	for _, n := range p.members() {
		if n.Self.IsReplica() && n.Self.MasterID == id && !n.Leaving {
			out = append(out, n)
		}
	}
	for _, n := range p.members() {
		if n.Self.IsReplica() && n.Self.MasterID == id && n.Leaving {
			out = append(out, n)
		}
	}
	return out
}

// forget deals with ghosts once every member is reachable, so every
// member's ID is known: a ghost master that serves slots is failed over to
// its replica (forced: a replaced node can keep its address and never be
// flagged failed), or forgotten when it has none, which leaves its slots
// unassigned for the assign step; other ghosts are forgotten on every
// node.
func (p *planner) forget() bool {
	if !p.allReachable() {
		return false
	}
	for _, g := range p.ghosts() {
		v := p.lineOf(g)
		if v.IsMaster() && v.SlotCount() > 0 {
			if reps := p.replicasOf(g); len(reps) > 0 {
				if v.Flags.Has(FlagFail) && !v.Flags.Has(FlagNoAddr) {
					p.waitf("Redis fails over the slots of the removed node %s to %s", short(g), reps[0].Name)
				} else {
					r := reps[0]
					p.pass.Actions = append(p.pass.Actions, Action{Kind: ActFailover, Node: r.Addr, NodeID: r.ID, Mode: "FORCE"})
				}
				continue
			}
		} else if v.Connected && !v.Failing() {
			p.problemf("node %s at %s is connected to the cluster but is no member; leaving it alone", short(g), v.Addr)
			continue
		}
		for _, n := range p.members() {
			if _, ok := n.View.Node(g); !ok || n.Self.MasterID == g {
				continue // a replica cannot forget its master; it is moved first
			}
			p.pass.Actions = append(p.pass.Actions, Action{Kind: ActForget, Node: n.Addr, NodeID: n.ID, PeerID: g})
		}
	}
	if len(p.pass.Actions) == 0 && len(p.pass.Waiting) == 0 {
		return false
	}
	p.pass.Step = StepForget
	return true
}

// failover waits for Redis to fail over masters the operator cannot
// reach, and takes over (without the cluster's agreement) when too few
// masters are up for Redis to elect anyone. A master that is down and has
// no replica leaves its slots uncovered until its member returns as a new
// node (then it is a ghost, forgotten, and its slots are reassigned).
func (p *planner) failover() bool {
	var serving, down []NodeView
	failing := 0
	for _, v := range p.anchor.View {
		if !v.IsMaster() || v.SlotCount() == 0 {
			continue
		}
		serving = append(serving, v)
		if p.snap.byID(v.ID) == nil {
			down = append(down, v)
			if v.Failing() {
				failing++
			}
		}
	}
	if len(down) == 0 {
		return false
	}
	noMajority := 2*failing >= len(serving)
	for _, v := range down {
		name := short(v.ID)
		if m := p.unreachableIDs[v.ID]; m != nil {
			name = m.Name
		}
		reps := p.replicasOf(v.ID)
		switch {
		case len(reps) == 0:
			p.waitf("master %s is down and has no replica: slots %s are unserved until it returns", name, abbreviate(v.Slots))
		case noMajority && v.Failing():
			p.pass.Actions = append(p.pass.Actions, Action{Kind: ActFailover, Node: reps[0].Addr, NodeID: reps[0].ID, Mode: "TAKEOVER"})
		case !v.Failing():
			p.waitf("master %s is unreachable from the operator but not failing in the cluster", name)
		default:
			p.waitf("master %s is down; waiting for Redis to fail over to %s", name, reps[0].Name)
		}
	}
	p.pass.Step = StepFailover
	return true
}

// layout derives the designated masters and the nodes that may be
// replicas.
type layout struct {
	designated []*NodeState // serve slots after the pass, in member order
	drain      []*NodeState // masters that give all their slots away
	spares     []*NodeState // masters without slots or keys, not designated
	held       map[string]SlotSet
}

// layout computes the layout once per plan.
func (p *planner) layout() layout {
	if p.cached == nil {
		l := p.computeLayout()
		p.cached = &l
	}
	return *p.cached
}

func (p *planner) computeLayout() layout {
	var l layout
	l.held = map[string]SlotSet{}
	var kept []*NodeState
	for _, n := range p.members() {
		if !n.Self.IsMaster() {
			continue
		}
		v, _ := p.anchor.View.Node(n.ID)
		if v.SlotCount() > 0 {
			l.held[n.ID] = SlotSetOf(v.Slots...)
			if n.Leaving {
				l.drain = append(l.drain, n)
			} else {
				kept = append(kept, n)
			}
			continue
		}
		if n.Leaving || len(n.Self.Migrating) > 0 || len(n.Self.Importing) > 0 {
			continue
		}
		if n.Keys > 0 {
			p.problemf("%s serves no slot but holds %d keys; it is given no role", n.Name, n.Keys)
			continue
		}
		l.spares = append(l.spares, n)
	}
	slices.SortStableFunc(kept, func(a, b *NodeState) int {
		ha, hb := l.held[a.ID], l.held[b.ID]
		return cmp.Compare(hb.Len(), ha.Len())
	})
	if len(kept) > p.spec.Shards {
		l.drain = append(l.drain, kept[p.spec.Shards:]...)
		kept = kept[:p.spec.Shards]
	}
	for len(kept) < p.spec.Shards && len(l.spares) > 0 {
		kept = append(kept, l.spares[0])
		l.spares = l.spares[1:]
	}
	order := map[*NodeState]int{}
	for i := range p.snap.Nodes {
		order[&p.snap.Nodes[i]] = i
	}
	slices.SortFunc(kept, func(a, b *NodeState) int { return cmp.Compare(order[a], order[b]) })
	l.designated = kept
	return l
}

func ids(ns []*NodeState) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.ID
	}
	return out
}

// assign hands leaving shards to their replicas, covers unassigned slots
// and places replicas.
func (p *planner) assign() bool {
	// A leaving master with a replica that stays hands over by a manual
	// failover: no data moves.
	for _, n := range p.members() {
		if !n.Leaving || !n.Self.IsMaster() || n.Self.SlotCount() == 0 {
			continue
		}
		for _, r := range p.replicasOf(n.ID) {
			if !r.Leaving {
				p.pass.Actions = append(p.pass.Actions, Action{Kind: ActFailover, Node: r.Addr, NodeID: r.ID})
				break
			}
		}
	}
	if len(p.pass.Actions) > 0 {
		p.pass.Step = StepAssign
		return true
	}

	l := p.layout()
	blocked := false
	if len(l.designated) < p.spec.Shards {
		p.waitf("%d of %d masters available; waiting for more nodes", len(l.designated), p.spec.Shards)
		blocked = true
	}

	// Slots no member's view assigns.
	var free SlotSet
	var disputed int
	all := make([]*[NumSlots]string, 0, len(p.members()))
	for _, n := range p.members() {
		all = append(all, n.View.Owners())
	}
	for s := range NumSlots {
		assigned := 0
		for _, o := range all {
			if o[s] != "" {
				assigned++
			}
		}
		switch assigned {
		case 0:
			free.Add(s)
		case len(all):
		default:
			disputed++
		}
	}
	fresh := free.Len() == NumSlots
	switch {
	case free.Len() == 0:
	case fresh && len(l.designated) < p.spec.Shards:
		// Wait for enough nodes rather than migrate right after forming.
	case len(l.designated) == 0:
		p.waitf("slots %s are unassigned and no node can take them", abbreviate(free.Ranges()))
	default:
		counts := map[string]int{}
		for id, s := range l.held {
			counts[id] = s.Len()
		}
		add := AssignFree(free, ids(l.designated), counts)
		for _, d := range l.designated {
			if rs := add[d.ID]; len(rs) > 0 {
				p.pass.Actions = append(p.pass.Actions, Action{Kind: ActAddSlots, Node: d.Addr, NodeID: d.ID, Slots: rs})
			}
		}
	}
	if disputed > 0 {
		p.waitf("%d slots are assigned in some nodes' views only", disputed)
		blocked = true
	}

	// Replica placement over the designated masters.
	if !fresh || len(l.designated) >= p.spec.Shards {
		p.placeReplicas(l)
	}
	if len(p.pass.Actions) == 0 && !blocked {
		return false // a missing replica does not hold the rebalance back
	}
	p.pass.Step = StepAssign
	return true
}

func (p *planner) placeReplicas(l layout) {
	masters := make([]PlacementNode, len(l.designated))
	for i, d := range l.designated {
		masters[i] = PlacementNode{ID: d.ID, Host: d.Host}
	}
	var cands []PlacementNode
	byID := map[string]*NodeState{}
	for _, n := range p.members() {
		if n.Leaving || !n.Self.IsReplica() {
			continue
		}
		cands = append(cands, PlacementNode{ID: n.ID, Host: n.Host, Master: n.Self.MasterID})
		byID[n.ID] = n
	}
	for _, n := range l.spares {
		cands = append(cands, PlacementNode{ID: n.ID, Host: n.Host})
		byID[n.ID] = n
	}
	moves := PlaceReplicas(masters, p.spec.ReplicasPerShard, cands)
	for _, c := range cands {
		if m, ok := moves[c.ID]; ok {
			n := byID[c.ID]
			p.pass.Actions = append(p.pass.Actions, Action{Kind: ActReplicate, Node: n.Addr, NodeID: n.ID, PeerID: m})
		}
	}
	short := 0
	for _, d := range l.designated {
		have := 0
		for _, r := range p.replicasOf(d.ID) {
			if !r.Leaving {
				have++
			}
		}
		for _, m := range moves {
			if m == d.ID {
				have++
			}
		}
		if have < p.spec.ReplicasPerShard {
			short += p.spec.ReplicasPerShard - have
		}
	}
	if short > 0 && len(p.pass.Actions) == 0 {
		p.waitf("%d replicas missing; waiting for more nodes", short)
	}
}

// rebalance evens the slot layout once every view agrees on it.
func (p *planner) rebalance() bool {
	ms := p.members()
	first := ms[0].View.Owners()
	for _, n := range ms[1:] {
		if *n.View.Owners() != *first {
			p.waitf("nodes disagree on slot owners; waiting for the cluster to agree")
			p.pass.Step = StepRebalance
			return true
		}
	}
	l := p.layout()
	if len(l.designated) == 0 {
		return false
	}
	for _, d := range l.designated {
		for _, n := range ms {
			if v, ok := n.View.Node(d.ID); ok && v.Failing() {
				p.waitf("%s flags master %s as failing", n.Name, d.Name)
				p.pass.Step = StepRebalance
				return true
			}
		}
	}
	byID := map[string]*NodeState{}
	for _, n := range ms {
		byID[n.ID] = n
	}
	for _, mv := range PlanMigrations(ids(l.designated), l.held) {
		from, to := byID[mv.From], byID[mv.To]
		p.pass.Actions = append(p.pass.Actions, Action{Kind: ActMigrate, Node: from.Addr, NodeID: from.ID, Peer: to.Addr, PeerID: to.ID, Slots: mv.Slots})
	}
	if len(p.pass.Actions) == 0 {
		return false
	}
	p.pass.Step = StepRebalance
	return true
}
