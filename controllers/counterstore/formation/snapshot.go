package formation

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// Member is one node the caller expects in the cluster: for the store
// controller, one Pod of the StatefulSet, in ordinal order.
type Member struct {
	// Name names the member in messages, such as the Pod name.
	Name string
	// Addr is the node's host:port, "" while unknown (a Pod without an IP
	// yet).
	Addr string
	// Host is the member's failure domain, such as the Kubernetes node it
	// runs on; "" when unknown. Replicas are placed on a different Host
	// than their master where possible.
	Host string
	// Leaving marks a member about to be removed: its slots are handed
	// over or migrated away, and it is given neither slots nor a role.
	Leaving bool
}

// Spec is the cluster the caller wants.
type Spec struct {
	// Shards is the number of masters that serve slots.
	Shards int
	// ReplicasPerShard is the number of replicas of each master.
	ReplicasPerShard int
	// Members are the nodes, in a stable order (lower first is preferred
	// as a master).
	Members []Member
}

// Validate reports every problem with s at once.
func (s Spec) Validate() error {
	var errs []error
	if s.Shards < 1 || s.Shards > NumSlots {
		errs = append(errs, fmt.Errorf("shards: must be between 1 and %d, got %d", NumSlots, s.Shards))
	}
	if s.ReplicasPerShard < 0 {
		errs = append(errs, fmt.Errorf("replicasPerShard: must not be negative, got %d", s.ReplicasPerShard))
	}
	seen := map[string]int{}
	for i, m := range s.Members {
		if m.Addr == "" {
			continue
		}
		if _, _, err := splitAddr(m.Addr); err != nil {
			errs = append(errs, fmt.Errorf("members[%d] (%s): %w", i, m.Name, err))
		}
		if j, dup := seen[m.Addr]; dup {
			errs = append(errs, fmt.Errorf("members[%d] (%s): address %s is also members[%d]'s", i, m.Name, m.Addr, j))
		}
		seen[m.Addr] = i
	}
	return errors.Join(errs...)
}

// splitAddr splits host:port and checks the port.
func splitAddr(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535-10000 {
		return "", 0, fmt.Errorf("address %q: port must be 1-%d (the cluster bus uses port+10000)", addr, 65535-10000)
	}
	if host == "" {
		return "", 0, fmt.Errorf("address %q: empty host", addr)
	}
	return host, port, nil
}

// NodeState is what Observe learned about one member.
type NodeState struct {
	Member
	// Reachable reports whether the node answered.
	Reachable bool
	// Err says why the node is unreachable.
	Err error
	// ID is the node's cluster ID (CLUSTER MYID).
	ID string
	// View is the node's CLUSTER NODES.
	View View
	// Self is the node's own line of View.
	Self NodeView
	// StateOK reports cluster_state:ok in CLUSTER INFO.
	StateOK bool
	// Keys is the number of keys the node holds (DBSIZE).
	Keys int64
	// ReplicaInSync reports, for a replica, that its link to its master is
	// up and no sync is in progress (INFO replication): only then does it
	// hold its master's data and add redundancy.
	ReplicaInSync bool
}

// Snapshot is one observation of every member.
type Snapshot struct {
	// Nodes are the members' states, in member order.
	Nodes []NodeState
}

// reachable returns the reachable nodes, in member order.
func (s *Snapshot) reachable() []*NodeState {
	var out []*NodeState
	for i := range s.Nodes {
		if s.Nodes[i].Reachable {
			out = append(out, &s.Nodes[i])
		}
	}
	return out
}

// byID returns the reachable node with id.
func (s *Snapshot) byID(id string) *NodeState {
	for i := range s.Nodes {
		if s.Nodes[i].Reachable && s.Nodes[i].ID == id {
			return &s.Nodes[i]
		}
	}
	return nil
}

// anchor picks the node whose view the plan starts from: the reachable
// node that the most reachable nodes know (so a node of another cluster
// never anchors), then the one serving the most slots, then the one that
// knows the most nodes, then the first.
func (s *Snapshot) anchor() *NodeState {
	reach := s.reachable()
	known := map[string]int{}
	for _, n := range reach {
		for _, v := range n.View {
			if !v.Flags.Has(FlagHandshake) {
				known[v.ID]++
			}
		}
	}
	var best *NodeState
	for _, n := range reach {
		if best == nil {
			best = n
			continue
		}
		if c := cmp.Or(
			cmp.Compare(known[n.ID], known[best.ID]),
			cmp.Compare(n.Self.SlotCount(), best.Self.SlotCount()),
			cmp.Compare(len(n.View), len(best.View)),
		); c > 0 {
			best = n
		}
	}
	return best
}
