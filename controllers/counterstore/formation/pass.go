package formation

import (
	"fmt"
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
