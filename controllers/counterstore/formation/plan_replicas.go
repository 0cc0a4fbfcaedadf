package formation

// placeReplicas makes replicas and spares replicate the designated
// masters, on another host where it can (PlaceReplicas), and says how many
// replicas are missing when no move can supply them.
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
