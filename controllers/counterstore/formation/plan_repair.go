package formation

import (
	"cmp"
	"slices"
)

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
