package formation

import (
	"cmp"
	"slices"
)

// SlotTargets returns how many slots each master should serve so that the
// NumSlots slots are split evenly: NumSlots/len(masters) each, and one more
// for NumSlots%len(masters) of them. The extra slots go to the masters that
// serve the most now (ties to the earlier in masters), so a layout that is
// already even keeps its targets and moves nothing. current may lack
// masters (they serve nothing).
func SlotTargets(masters []string, current map[string]int) map[string]int {
	if len(masters) == 0 {
		return map[string]int{}
	}
	base, extra := NumSlots/len(masters), NumSlots%len(masters)
	order := slices.Clone(masters)
	idx := indexOf(masters)
	slices.SortStableFunc(order, func(a, b string) int {
		if c := cmp.Compare(current[b], current[a]); c != 0 {
			return c
		}
		return cmp.Compare(idx[a], idx[b])
	})
	out := make(map[string]int, len(masters))
	for i, id := range order {
		out[id] = base
		if i < extra {
			out[id]++
		}
	}
	return out
}

func indexOf(ids []string) map[string]int {
	m := make(map[string]int, len(ids))
	for i, id := range ids {
		m[id] = i
	}
	return m
}

// AssignFree spreads the free (unassigned) slots over masters, filling each
// master up to its SlotTargets target in masters order, so a fresh cluster
// gets one contiguous range per master. held are the slots each master
// serves now. Free slots beyond every target (possible only when masters
// outside the list hold more than their share) go to the masters in turn.
// The result maps a master to the ranges it should add.
func AssignFree(free SlotSet, masters []string, held map[string]int) map[string][]SlotRange {
	out := map[string][]SlotRange{}
	if len(masters) == 0 {
		return out
	}
	targets := SlotTargets(masters, held)
	slots := free.Slots()
	add := map[string][]int{}
	i := 0
	for _, id := range masters {
		for n := targets[id] - held[id]; n > 0 && i < len(slots); n-- {
			add[id] = append(add[id], slots[i])
			i++
		}
	}
	for k := 0; i < len(slots); k++ {
		id := masters[k%len(masters)]
		add[id] = append(add[id], slots[i])
		i++
	}
	for id, s := range add {
		out[id] = toRanges(s)
	}
	return out
}

// Move is one step of a migration plan: Slots go from the master From to
// the master To, keys included.
type Move struct {
	From, To string
	Slots    []SlotRange
}

// PlanMigrations returns the moves that turn the current layout into an
// even one over masters. held maps every master that serves slots to its
// slots; a master in held but not in masters is drained to zero. Each
// source gives up its highest slots, so what it keeps stays contiguous, and
// the destinations take them in masters order. No slot moves when the
// layout is already even.
func PlanMigrations(masters []string, held map[string]SlotSet) []Move {
	counts := make(map[string]int, len(held))
	for id, s := range held {
		counts[id] = s.Len()
	}
	targets := SlotTargets(masters, counts)

	// Sources in a stable order: designated masters in masters order, then
	// the drained ones by ID.
	var sources []string
	for _, id := range masters {
		if counts[id] > targets[id] {
			sources = append(sources, id)
		}
	}
	var drained []string
	for id := range held {
		if _, designated := targets[id]; !designated && counts[id] > 0 {
			drained = append(drained, id)
		}
	}
	slices.Sort(drained)
	sources = append(sources, drained...)

	type need struct {
		id string
		n  int
	}
	var needs []need
	for _, id := range masters {
		if d := targets[id] - counts[id]; d > 0 {
			needs = append(needs, need{id, d})
		}
	}

	var moves []Move
	for _, src := range sources {
		s := held[src]
		slots := s.Slots()
		surplus := counts[src] - targets[src] // targets is 0 for a drained master
		give := slots[len(slots)-surplus:]
		for len(give) > 0 && len(needs) > 0 {
			n := min(len(give), needs[0].n)
			moves = append(moves, Move{From: src, To: needs[0].id, Slots: toRanges(give[:n])})
			give = give[n:]
			needs[0].n -= n
			if needs[0].n == 0 {
				needs = needs[1:]
			}
		}
	}
	return moves
}

// PlacementNode is a node as replica placement sees it.
type PlacementNode struct {
	// ID is the node's cluster ID.
	ID string
	// Host is its failure domain; "" when unknown.
	Host string
	// Master is the ID of the master it replicates now; "" for a node
	// without a role. Only used for candidates.
	Master string
}

// differentHost reports whether a and b are known to be apart, or not
// known to be together.
func differentHost(a, b PlacementNode) bool {
	return a.Host == "" || b.Host == "" || a.Host != b.Host
}

// PlaceReplicas decides which master each candidate replicates, so that
// every master has replicasPerShard replicas, each on a different host
// than its master where possible. candidates are the nodes that may serve
// as replicas (replicas now, and empty nodes without a role), in order of
// preference. A replica of a master that keeps it stays put; a master's
// surplus replicas, the replicas of nodes that are not in masters, and the
// empty nodes form a pool that fills the masters' needs, round by round
// (every master gets its first replica before any gets its second), with a
// maximum matching on the different-host preference. The result maps the
// candidates that must change master to their new master; a pool node
// that is not needed stays as it is.
func PlaceReplicas(masters []PlacementNode, replicasPerShard int, candidates []PlacementNode) map[string]string {
	out := map[string]string{}
	if replicasPerShard <= 0 || len(masters) == 0 {
		return out
	}
	byID := map[string]PlacementNode{}
	for _, m := range masters {
		byID[m.ID] = m
	}
	kept := map[string]int{}
	var pool []PlacementNode
	// Keep each master's current replicas, different-host ones first.
	current := map[string][]PlacementNode{}
	for _, c := range candidates {
		if _, ok := byID[c.Master]; ok {
			current[c.Master] = append(current[c.Master], c)
		} else {
			pool = append(pool, c)
		}
	}
	for _, m := range masters {
		reps := current[m.ID]
		slices.SortStableFunc(reps, func(a, b PlacementNode) int {
			return boolRank(differentHost(b, m)) - boolRank(differentHost(a, m))
		})
		for i, r := range reps {
			if i < replicasPerShard {
				kept[m.ID]++
			} else {
				pool = append(pool, r)
			}
		}
	}

	// Needs, round by round.
	var needs []PlacementNode
	for round := range replicasPerShard {
		for _, m := range masters {
			if kept[m.ID] <= round {
				needs = append(needs, m)
			}
		}
	}

	// Maximum matching of needs to pool nodes on different hosts (Kuhn).
	owner := make([]int, len(pool)) // pool index -> need index
	for i := range owner {
		owner[i] = -1
	}
	var try func(need int, seen []bool) bool
	try = func(need int, seen []bool) bool {
		// A free node first, in pool order, so that an easy layout stays
		// in order; then an augmenting path through a taken one.
		for c := range pool {
			if owner[c] < 0 && differentHost(needs[need], pool[c]) {
				owner[c] = need
				return true
			}
		}
		for c := range pool {
			if seen[c] || !differentHost(needs[need], pool[c]) {
				continue
			}
			seen[c] = true
			if try(owner[c], seen) {
				owner[c] = need
				return true
			}
		}
		return false
	}
	matched := make([]bool, len(needs))
	for i := range needs {
		matched[i] = try(i, make([]bool, len(pool)))
	}
	// Fill what the matching could not, same host or not.
	for i := range needs {
		if matched[i] {
			continue
		}
		for c := range pool {
			if owner[c] < 0 {
				owner[c] = i
				matched[i] = true
				break
			}
		}
	}
	for c, i := range owner {
		if i >= 0 && pool[c].Master != needs[i].ID {
			out[pool[c].ID] = needs[i].ID
		}
	}
	return out
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}
