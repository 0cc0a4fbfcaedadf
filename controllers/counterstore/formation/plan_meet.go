package formation

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
