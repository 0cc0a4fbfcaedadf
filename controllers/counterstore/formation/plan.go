package formation

import (
	"cmp"
	"fmt"
	"slices"
)

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
