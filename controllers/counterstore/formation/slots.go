package formation

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// NumSlots is the number of hash slots of a Redis Cluster.
const NumSlots = 16384

// SlotRange is an inclusive range of hash slots.
type SlotRange struct {
	Start, End int
}

// Len returns the number of slots in r.
func (r SlotRange) Len() int { return r.End - r.Start + 1 }

// String formats r the way CLUSTER NODES does: "5" or "0-5460".
func (r SlotRange) String() string {
	if r.Start == r.End {
		return strconv.Itoa(r.Start)
	}
	return strconv.Itoa(r.Start) + "-" + strconv.Itoa(r.End)
}

// SlotSet is a set of hash slots. The zero value is empty and ready to
// use. It is a value type: copying it copies the set.
type SlotSet struct {
	w [NumSlots / 64]uint64
}

// Add adds slot s. Slots outside [0, NumSlots) are ignored.
func (s *SlotSet) Add(slot int) {
	if slot >= 0 && slot < NumSlots {
		s.w[slot/64] |= 1 << (slot % 64)
	}
}

// AddRange adds every slot of r.
func (s *SlotSet) AddRange(r SlotRange) {
	for i := max(r.Start, 0); i <= min(r.End, NumSlots-1); i++ {
		s.Add(i)
	}
}

// Remove removes slot s.
func (s *SlotSet) Remove(slot int) {
	if slot >= 0 && slot < NumSlots {
		s.w[slot/64] &^= 1 << (slot % 64)
	}
}

// Has reports whether slot s is in the set.
func (s *SlotSet) Has(slot int) bool {
	return slot >= 0 && slot < NumSlots && s.w[slot/64]&(1<<(slot%64)) != 0
}

// Len returns the number of slots in the set.
func (s *SlotSet) Len() int {
	n := 0
	for _, w := range s.w {
		n += bits.OnesCount64(w)
	}
	return n
}

// Union adds every slot of o to s.
func (s *SlotSet) Union(o *SlotSet) {
	for i := range s.w {
		s.w[i] |= o.w[i]
	}
}

// Slots returns the slots in ascending order.
func (s *SlotSet) Slots() []int {
	out := make([]int, 0, s.Len())
	for i, w := range s.w {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			out = append(out, i*64+b)
			w &^= 1 << b
		}
	}
	return out
}

// Ranges returns the set as ascending, maximal ranges.
func (s *SlotSet) Ranges() []SlotRange { return toRanges(s.Slots()) }

// SlotSetOf returns the set of the slots in ranges.
func SlotSetOf(ranges ...SlotRange) SlotSet {
	var s SlotSet
	for _, r := range ranges {
		s.AddRange(r)
	}
	return s
}

// toRanges folds ascending slots into maximal ranges.
func toRanges(slots []int) []SlotRange {
	var out []SlotRange
	for _, s := range slots {
		if n := len(out); n > 0 && out[n-1].End+1 == s {
			out[n-1].End = s
			continue
		}
		out = append(out, SlotRange{Start: s, End: s})
	}
	return out
}

// FormatRanges formats ranges as "0-5460,5461-10922".
func FormatRanges(ranges []SlotRange) string {
	parts := make([]string, len(ranges))
	for i, r := range ranges {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// parseRange parses "5" or "0-5460".
func parseRange(s string) (SlotRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	start, err := strconv.Atoi(lo)
	if err != nil {
		return SlotRange{}, fmt.Errorf("slot range %q: %w", s, err)
	}
	end := start
	if isRange {
		if end, err = strconv.Atoi(hi); err != nil {
			return SlotRange{}, fmt.Errorf("slot range %q: %w", s, err)
		}
	}
	if start < 0 || end >= NumSlots || start > end {
		return SlotRange{}, fmt.Errorf("slot range %q: outside [0, %d] or reversed", s, NumSlots-1)
	}
	return SlotRange{Start: start, End: end}, nil
}
