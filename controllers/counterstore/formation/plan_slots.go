package formation

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
