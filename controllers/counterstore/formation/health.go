package formation

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Health is the state of the cluster as one snapshot shows it, the
// material of the CounterStore status.
type Health struct {
	// Assigned is the number of slots the cluster assigns to some master.
	Assigned int
	// SlotsCovered is the number of slots whose master the operator
	// reaches and the cluster does not flag as failing.
	SlotsCovered int
	// StateOK reports that every serving master says cluster_state:ok.
	StateOK bool
	// Primaries counts the reachable masters that serve slots.
	Primaries int
	// Replicas counts the reachable replicas of those masters that are in
	// sync with them (link up, initial sync done).
	Replicas int
	// Failed counts the nodes the cluster flags as failed or without an
	// address.
	Failed int
	// Masters are the addresses of the reachable serving masters, sorted.
	Masters []string
	// Unreachable names the members the operator cannot reach.
	Unreachable []string
	// MissingReplicas is how many replicas the serving masters lack, with
	// replicasPerShard as the goal; 0 when the goal is unknown.
	MissingReplicas int
}

// Ready reports a usable cluster: every slot is covered and every serving
// master reports cluster_state:ok.
func (h Health) Ready() bool {
	return h.SlotsCovered == NumSlots && h.StateOK && h.Primaries > 0
}

// Degraded reports a ready cluster that has lost redundancy: a failed or
// unreachable node, or a master short of replicas in sync (a replica still
// copying its master's data does not count yet).
func (h Health) Degraded() bool {
	return h.Ready() && (h.Failed > 0 || len(h.Unreachable) > 0 || h.MissingReplicas > 0)
}

// Assess computes the health of the cluster in snap. replicasPerShard is
// the replica goal per master; negative when unknown (an external store).
func Assess(snap *Snapshot, replicasPerShard int) Health {
	var h Health
	for i := range snap.Nodes {
		if n := &snap.Nodes[i]; !n.Reachable {
			h.Unreachable = append(h.Unreachable, n.Name)
		}
	}
	a := snap.anchor()
	if a == nil {
		return h
	}
	h.StateOK = true
	for _, v := range a.View {
		if v.Flags&(FlagFail|FlagNoAddr) != 0 {
			h.Failed++
		}
		if !v.IsMaster() || v.SlotCount() == 0 {
			continue
		}
		h.Assigned += v.SlotCount()
		m := snap.byID(v.ID)
		if m == nil || v.Failing() {
			continue
		}
		h.SlotsCovered += v.SlotCount()
		h.Primaries++
		h.Masters = append(h.Masters, m.Addr)
		if !m.StateOK {
			h.StateOK = false
		}
		healthy := 0
		for _, r := range snap.reachable() {
			if !r.Self.IsReplica() || r.Self.MasterID != v.ID {
				continue
			}
			if rv, ok := a.View.Node(r.ID); ok && !rv.Failing() && r.ReplicaInSync {
				healthy++
			}
		}
		h.Replicas += healthy
		if replicasPerShard > healthy {
			h.MissingReplicas += replicasPerShard - healthy
		}
	}
	if h.Primaries == 0 {
		h.StateOK = false
	}
	slices.Sort(h.Masters)
	return h
}

// ObserveCluster observes a cluster known only by seed addresses, as for
// an external store: it observes the seeds, then every other node the best
// seed's view lists, so that Assess sees every master.
func (s *Session) ObserveCluster(ctx context.Context, seeds []string) (*Snapshot, error) {
	members := make([]Member, len(seeds))
	for i, a := range seeds {
		members[i] = Member{Name: a, Addr: a}
	}
	snap, err := s.Observe(ctx, members)
	if err != nil {
		return nil, err
	}
	a := snap.anchor()
	if a == nil {
		return snap, nil
	}
	seen := map[string]bool{}
	for _, m := range members {
		seen[m.Addr] = true
	}
	var more []Member
	for _, v := range a.View {
		if v.Addr != "" && !seen[v.Addr] && !v.Flags.Has(FlagHandshake) {
			seen[v.Addr] = true
			more = append(more, Member{Name: v.Addr, Addr: v.Addr})
		}
	}
	if len(more) == 0 {
		return snap, nil
	}
	rest, err := s.Observe(ctx, more)
	if err != nil {
		return nil, err
	}
	snap.Nodes = append(snap.Nodes, rest.Nodes...)
	return snap, nil
}

// Result is one pass of Reconcile.
type Result struct {
	// Snapshot is the observation the pass planned from.
	Snapshot *Snapshot
	// Pass is the plan.
	Pass *Pass
	// Outcome is what the actions did.
	Outcome Outcome
}

// Reconcile runs one pass: observe the members of spec, plan, and run the
// plan's actions, migrations bounded by budget. Call it again, after a
// short pause that lets gossip spread, until Result.Pass is converged. It
// fails on an invalid spec, on ctx's end, and when an action fails.
func (s *Session) Reconcile(ctx context.Context, spec Spec, budget time.Duration) (Result, error) {
	if err := spec.Validate(); err != nil {
		return Result{}, fmt.Errorf("invalid formation spec: %w", err)
	}
	snap, err := s.Observe(ctx, spec.Members)
	if err != nil {
		return Result{}, err
	}
	pass := Plan(snap, spec)
	out, err := s.Execute(ctx, snap, pass, budget)
	return Result{Snapshot: snap, Pass: pass, Outcome: out}, err
}
