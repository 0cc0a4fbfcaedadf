package redistest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// SlotRange is an inclusive range of hash slots.
type SlotRange struct {
	Start, End int
}

// NodeInfo is one line of CLUSTER NODES: one node as another node sees it.
type NodeInfo struct {
	// ID is the node's 40-character cluster ID.
	ID string
	// Addr is host:port, without the bus port.
	Addr string
	// Flags are the raw flags: myself, master, slave, fail?, fail,
	// handshake, noaddr, nofailover.
	Flags []string
	// MasterID is the master's ID for a replica, empty for a master.
	MasterID string
	// Connected reports the link state to the node.
	Connected bool
	// Slots are the slots the node serves, stable ones only (slots being
	// imported or migrated are left out).
	Slots []SlotRange
}

// HasFlag reports whether the node carries flag f.
func (i NodeInfo) HasFlag(f string) bool { return slices.Contains(i.Flags, f) }

// IsMaster reports whether the node is a master.
func (i NodeInfo) IsMaster() bool { return i.HasFlag("master") }

// Failing reports whether the viewer considers the node failed or possibly
// failed.
func (i NodeInfo) Failing() bool { return i.HasFlag("fail") || i.HasFlag("fail?") }

// Owns reports whether the node serves slot.
func (i NodeInfo) Owns(slot int) bool {
	for _, r := range i.Slots {
		if slot >= r.Start && slot <= r.End {
			return true
		}
	}
	return false
}

// parseClusterNodes parses the reply of CLUSTER NODES.
func parseClusterNodes(s string) ([]NodeInfo, error) {
	var out []NodeInfo
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("redistest: CLUSTER NODES line has %d fields, want at least 8: %q", len(f), line)
		}
		addr := f[1]
		if i := strings.IndexAny(addr, "@,"); i >= 0 {
			addr = addr[:i]
		}
		info := NodeInfo{
			ID:        f[0],
			Addr:      addr,
			Flags:     strings.Split(f[2], ","),
			Connected: f[7] == "connected",
		}
		if f[3] != "-" {
			info.MasterID = f[3]
		}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				continue // importing or migrating
			}
			r, err := parseSlotRange(s)
			if err != nil {
				return nil, fmt.Errorf("redistest: CLUSTER NODES line %q: %w", line, err)
			}
			info.Slots = append(info.Slots, r)
		}
		out = append(out, info)
	}
	return out, nil
}

func parseSlotRange(s string) (SlotRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	start, err := strconv.Atoi(lo)
	if err != nil {
		return SlotRange{}, fmt.Errorf("bad slot %q", s)
	}
	end := start
	if isRange {
		if end, err = strconv.Atoi(hi); err != nil {
			return SlotRange{}, fmt.Errorf("bad slot range %q", s)
		}
	}
	if start < 0 || end < start || end >= 16384 {
		return SlotRange{}, fmt.Errorf("slot range %q out of bounds", s)
	}
	return SlotRange{Start: start, End: end}, nil
}

// slotOwners summarises a view as "start-end=id" ranges in slot order so
// that two views can be compared.
func slotOwners(view []NodeInfo) string {
	type owned struct {
		r  SlotRange
		id string
	}
	var all []owned
	for _, n := range view {
		if !n.IsMaster() {
			continue
		}
		for _, r := range n.Slots {
			all = append(all, owned{r, n.ID})
		}
	}
	slices.SortFunc(all, func(a, b owned) int { return a.r.Start - b.r.Start })
	var sb strings.Builder
	for _, o := range all {
		fmt.Fprintf(&sb, "%d-%d=%s ", o.r.Start, o.r.End, o.id)
	}
	return sb.String()
}
