package formation

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// Flags are the flags of a node in CLUSTER NODES.
type Flags uint16

// The node flags of CLUSTER NODES.
const (
	FlagMyself Flags = 1 << iota
	FlagMaster
	FlagReplica
	FlagPFail
	FlagFail
	FlagHandshake
	FlagNoAddr
	FlagNoFailover
)

var flagNames = []struct {
	f    Flags
	name string
}{
	{FlagMyself, "myself"},
	{FlagMaster, "master"},
	{FlagReplica, "slave"},
	{FlagPFail, "fail?"},
	{FlagFail, "fail"},
	{FlagHandshake, "handshake"},
	{FlagNoAddr, "noaddr"},
	{FlagNoFailover, "nofailover"},
}

// Has reports whether every flag of g is set in f.
func (f Flags) Has(g Flags) bool { return f&g == g }

// String formats f the way CLUSTER NODES does.
func (f Flags) String() string {
	var parts []string
	for _, n := range flagNames {
		if f.Has(n.f) {
			parts = append(parts, n.name)
		}
	}
	if len(parts) == 0 {
		return "noflags"
	}
	return strings.Join(parts, ",")
}

// NodeView is one line of CLUSTER NODES: one node as another node (or
// itself, with FlagMyself) sees it.
type NodeView struct {
	// ID is the node's 40-character cluster ID.
	ID string
	// Addr is host:port of the client port, "" when the viewer knows no
	// address (noaddr).
	Addr string
	// Flags are the node's flags.
	Flags Flags
	// MasterID is the master's ID when the node is a replica.
	MasterID string
	// ConfigEpoch is the node's configuration epoch.
	ConfigEpoch uint64
	// Connected reports whether the viewer's link to the node is up.
	Connected bool
	// Slots are the slots the node serves, in the viewer's opinion.
	Slots []SlotRange
	// Migrating maps a slot to the ID of the node it is being migrated
	// to. Only the viewer's own line carries open slots.
	Migrating map[int]string
	// Importing maps a slot to the ID of the node it is being imported
	// from.
	Importing map[int]string
}

// IsMaster reports whether the node is a master.
func (v *NodeView) IsMaster() bool { return v.Flags.Has(FlagMaster) }

// IsReplica reports whether the node is a replica.
func (v *NodeView) IsReplica() bool { return v.Flags.Has(FlagReplica) }

// Failing reports whether the viewer considers the node failed, possibly
// failed, or has lost its address.
func (v *NodeView) Failing() bool {
	return v.Flags&(FlagFail|FlagPFail|FlagNoAddr) != 0
}

// SlotCount returns the number of slots the node serves.
func (v *NodeView) SlotCount() int {
	n := 0
	for _, r := range v.Slots {
		n += r.Len()
	}
	return n
}

// ParseClusterNodes parses the reply of CLUSTER NODES.
func ParseClusterNodes(s string) (View, error) {
	var out View
	for line := range strings.SplitSeq(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		v, err := parseNodeLine(line)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func parseNodeLine(line string) (NodeView, error) {
	f := strings.Fields(line)
	if len(f) < 8 {
		return NodeView{}, fmt.Errorf("CLUSTER NODES line has %d fields, want at least 8: %q", len(f), line)
	}
	v := NodeView{ID: f[0], Connected: f[7] == "connected"}
	if len(v.ID) != 40 {
		return NodeView{}, fmt.Errorf("CLUSTER NODES line: node ID %q is not 40 characters", v.ID)
	}
	addr, err := parseNodeAddr(f[1])
	if err != nil {
		return NodeView{}, fmt.Errorf("CLUSTER NODES line %q: %w", line, err)
	}
	v.Addr = addr
	for name := range strings.SplitSeq(f[2], ",") {
		for _, n := range flagNames {
			if n.name == name {
				v.Flags |= n.f
			}
		}
	}
	if f[3] != "-" {
		v.MasterID = f[3]
	}
	if v.ConfigEpoch, err = strconv.ParseUint(f[6], 10, 64); err != nil {
		return NodeView{}, fmt.Errorf("CLUSTER NODES line %q: config epoch: %w", line, err)
	}
	for _, s := range f[8:] {
		if strings.HasPrefix(s, "[") {
			if err := v.parseOpenSlot(s); err != nil {
				return NodeView{}, fmt.Errorf("CLUSTER NODES line %q: %w", line, err)
			}
			continue
		}
		r, err := parseRange(s)
		if err != nil {
			return NodeView{}, fmt.Errorf("CLUSTER NODES line %q: %w", line, err)
		}
		v.Slots = append(v.Slots, r)
	}
	return v, nil
}

// parseOpenSlot parses "[93->-<id>]" (migrating to) or "[93-<-<id>]"
// (importing from).
func (v *NodeView) parseOpenSlot(s string) error {
	body := strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if slot, id, ok := strings.Cut(body, "->-"); ok {
		n, err := strconv.Atoi(slot)
		if err != nil || n < 0 || n >= NumSlots {
			return fmt.Errorf("open slot %q: bad slot", s)
		}
		if v.Migrating == nil {
			v.Migrating = map[int]string{}
		}
		v.Migrating[n] = id
		return nil
	}
	if slot, id, ok := strings.Cut(body, "-<-"); ok {
		n, err := strconv.Atoi(slot)
		if err != nil || n < 0 || n >= NumSlots {
			return fmt.Errorf("open slot %q: bad slot", s)
		}
		if v.Importing == nil {
			v.Importing = map[int]string{}
		}
		v.Importing[n] = id
		return nil
	}
	return fmt.Errorf("open slot %q: neither migrating nor importing", s)
}

// parseNodeAddr turns "ip:port@cport[,hostname]" into host:port, or ""
// for a node without an address (":0@0").
func parseNodeAddr(s string) (string, error) {
	s, _, _ = strings.Cut(s, ",")
	s, _, _ = strings.Cut(s, "@")
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", fmt.Errorf("address %q has no port", s)
	}
	host, port := strings.Trim(s[:i], "[]"), s[i+1:]
	if host == "" {
		return "", nil
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("address %q: bad port", s)
	}
	return net.JoinHostPort(host, port), nil
}

// View is one node's CLUSTER NODES, indexed.
type View []NodeView

// Self returns the viewer's own line.
func (vw View) Self() (NodeView, bool) {
	for _, v := range vw {
		if v.Flags.Has(FlagMyself) {
			return v, true
		}
	}
	return NodeView{}, false
}

// Node returns the line of the node with id.
func (vw View) Node(id string) (NodeView, bool) {
	for _, v := range vw {
		if v.ID == id {
			return v, true
		}
	}
	return NodeView{}, false
}

// AtAddr returns the IDs of the nodes the viewer places at addr, handshake
// entries left out.
func (vw View) AtAddr(addr string) []string {
	var ids []string
	for _, v := range vw {
		if v.Addr == addr && !v.Flags.Has(FlagHandshake) {
			ids = append(ids, v.ID)
		}
	}
	return ids
}

// InHandshake reports whether the viewer has a handshake in progress with
// addr.
func (vw View) InHandshake(addr string) bool {
	return slices.ContainsFunc(vw, func(v NodeView) bool {
		return v.Addr == addr && v.Flags.Has(FlagHandshake)
	})
}

// Owners returns, for every slot, the ID of the master the viewer routes it
// to ("" for an unassigned slot).
func (vw View) Owners() *[NumSlots]string {
	var owners [NumSlots]string
	for _, v := range vw {
		if !v.IsMaster() {
			continue
		}
		for _, r := range v.Slots {
			for s := r.Start; s <= r.End; s++ {
				owners[s] = v.ID
			}
		}
	}
	return &owners
}

// ReplicasOf returns the IDs of the nodes the viewer sees replicating id.
func (vw View) ReplicasOf(id string) []string {
	var out []string
	for _, v := range vw {
		if v.IsReplica() && v.MasterID == id {
			out = append(out, v.ID)
		}
	}
	return out
}
