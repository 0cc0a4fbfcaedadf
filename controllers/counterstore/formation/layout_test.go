package formation

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestSlotTargets(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		masters []string
		current map[string]int
		want    map[string]int
	}{
		{"fresh three", []string{"a", "b", "c"}, nil, map[string]int{"a": 5462, "b": 5461, "c": 5461}},
		{"even layout keeps its extra slot where it is", []string{"a", "b", "c"},
			map[string]int{"a": 5461, "b": 5461, "c": 5462}, map[string]int{"a": 5461, "b": 5461, "c": 5462}},
		{"three to four", []string{"a", "b", "c", "d"},
			map[string]int{"a": 5462, "b": 5461, "c": 5461}, map[string]int{"a": 4096, "b": 4096, "c": 4096, "d": 4096}},
		{"one", []string{"a"}, nil, map[string]int{"a": NumSlots}},
		{"none", nil, nil, map[string]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := SlotTargets(tt.masters, tt.current)
			if !maps.Equal(got, tt.want) {
				t.Errorf("SlotTargets(%v, %v) = %v, want %v", tt.masters, tt.current, got, tt.want)
			}
			sum := 0
			for _, n := range got {
				sum += n
			}
			if len(tt.masters) > 0 && sum != NumSlots {
				t.Errorf("targets sum to %d, want %d", sum, NumSlots)
			}
		})
	}
}

func TestAssignFreeFresh(t *testing.T) {
	t.Parallel()
	free := SlotSetOf(SlotRange{0, NumSlots - 1})
	got := AssignFree(free, []string{"a", "b", "c"}, nil)
	want := map[string][]SlotRange{
		"a": {{0, 5461}},
		"b": {{5462, 10922}},
		"c": {{10923, 16383}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("AssignFree(all, a b c) = %v, want %v", got, want)
	}
}

func TestAssignFreeLostShard(t *testing.T) {
	t.Parallel()
	// a and b keep their shards; c is the new, empty node in place of the
	// lost shard: it takes exactly the free slots.
	free := SlotSetOf(SlotRange{10923, 16383})
	got := AssignFree(free, []string{"a", "b", "c"}, map[string]int{"a": 5462, "b": 5461})
	want := map[string][]SlotRange{"c": {{10923, 16383}}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("AssignFree = %v, want %v", got, want)
	}
	// Without a new node the two survivors split the free slots.
	got = AssignFree(free, []string{"a", "b"}, map[string]int{"a": 5462, "b": 5461})
	total := 0
	for _, rs := range got {
		total += countSlots(rs)
	}
	if total != free.Len() {
		t.Errorf("AssignFree over two masters assigned %d slots, want %d: %v", total, free.Len(), got)
	}
}

// applyMoves returns held after moves, failing on a move whose source
// does not hold a slot.
func applyMoves(t *testing.T, held map[string]SlotSet, moves []Move) map[string]SlotSet {
	t.Helper()
	out := map[string]SlotSet{}
	for id, s := range held {
		out[id] = s
	}
	for _, m := range moves {
		from, to := out[m.From], out[m.To]
		for _, r := range m.Slots {
			for s := r.Start; s <= r.End; s++ {
				if !from.Has(s) {
					t.Fatalf("move %v: %s does not hold slot %d", m, m.From, s)
				}
				from.Remove(s)
				to.Add(s)
			}
		}
		out[m.From], out[m.To] = from, to
	}
	return out
}

func TestPlanMigrationsScaleUp(t *testing.T) {
	t.Parallel()
	held := map[string]SlotSet{
		"a": SlotSetOf(SlotRange{0, 5461}),
		"b": SlotSetOf(SlotRange{5462, 10922}),
		"c": SlotSetOf(SlotRange{10923, 16383}),
	}
	moves := PlanMigrations([]string{"a", "b", "c", "d"}, held)
	moved := 0
	for _, m := range moves {
		if m.To != "d" {
			t.Errorf("move %v goes to %s, want d: only the new master gains", m, m.To)
		}
		moved += countSlots(m.Slots)
	}
	if moved != 4096 {
		t.Errorf("moved %d slots, want 4096 (the new master's share, nothing more)", moved)
	}
	after := applyMoves(t, held, moves)
	for id, s := range after {
		if s.Len() != 4096 {
			t.Errorf("%s holds %d slots after the moves, want 4096", id, s.Len())
		}
	}
	// Each source gives its top slots, so what it keeps stays contiguous.
	for _, id := range []string{"a", "b", "c"} {
		if rs := after[id]; len(rs.Ranges()) != 1 {
			t.Errorf("%s keeps %v, want one range", id, rs.Ranges())
		}
	}
}

func TestPlanMigrationsDrain(t *testing.T) {
	t.Parallel()
	held := map[string]SlotSet{
		"a": SlotSetOf(SlotRange{0, 4095}),
		"b": SlotSetOf(SlotRange{4096, 8191}),
		"c": SlotSetOf(SlotRange{8192, 12287}),
		"x": SlotSetOf(SlotRange{12288, 16383}),
	}
	moves := PlanMigrations([]string{"a", "b", "c"}, held)
	after := applyMoves(t, held, moves)
	if n := after["x"]; n.Len() != 0 {
		t.Errorf("drained master x still holds %d slots", n.Len())
	}
	for _, m := range moves {
		if m.From != "x" {
			t.Errorf("move %v takes from %s; only x should give", m, m.From)
		}
	}
	a, b, c := after["a"], after["b"], after["c"]
	if got := []int{a.Len(), b.Len(), c.Len()}; slices.Max(got)-slices.Min(got) > 1 {
		t.Errorf("slots after drain = %v, want within one of each other", got)
	}
}

func TestPlanMigrationsEvenIsNoop(t *testing.T) {
	t.Parallel()
	held := map[string]SlotSet{
		"a": SlotSetOf(SlotRange{0, 5460}),
		"b": SlotSetOf(SlotRange{5461, 10922}),
		"c": SlotSetOf(SlotRange{10923, 16383}),
	}
	if moves := PlanMigrations([]string{"a", "b", "c"}, held); len(moves) != 0 {
		t.Errorf("PlanMigrations on an even layout = %v, want no move", moves)
	}
}

// TestPlanMigrationsRandom checks on random layouts that the moves are
// valid, end even, and move exactly the surplus.
func TestPlanMigrationsRandom(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 100 {
		nOld := 1 + r.IntN(8)
		owners := make([]string, nOld)
		for i := range owners {
			owners[i] = fmt.Sprintf("m%d", i)
		}
		sets := make([]SlotSet, nOld)
		for s := range NumSlots {
			sets[r.IntN(nOld)].Add(s)
		}
		held := map[string]SlotSet{}
		for i, id := range owners {
			held[id] = sets[i]
		}
		// Keep a random subset, add some new masters.
		var masters []string
		for _, id := range owners {
			if r.IntN(3) > 0 {
				masters = append(masters, id)
			}
		}
		for i := range r.IntN(3) {
			masters = append(masters, fmt.Sprintf("n%d", i))
		}
		if len(masters) == 0 {
			masters = []string{"n9"}
		}
		counts := map[string]int{}
		for id, s := range held {
			counts[id] = s.Len()
		}
		targets := SlotTargets(masters, counts)
		surplus := 0
		for id, c := range counts {
			if c > targets[id] {
				surplus += c - targets[id]
			}
		}
		moves := PlanMigrations(masters, held)
		after := applyMoves(t, held, moves)
		moved := 0
		for _, m := range moves {
			moved += countSlots(m.Slots)
		}
		if moved != surplus {
			t.Fatalf("iter %d: moved %d slots, want the surplus %d", iter, moved, surplus)
		}
		for id, s := range after {
			if want := targets[id]; s.Len() != want {
				t.Fatalf("iter %d: %s holds %d after the moves, want %d", iter, id, s.Len(), want)
			}
		}
	}
}

func TestPlaceReplicasAcrossHosts(t *testing.T) {
	t.Parallel()
	// A greedy pick gives m0 the node on h1 and m1 the node on h0, and
	// leaves m2 only its own host; the matching finds a layout where every
	// replica is on another host.
	masters := []PlacementNode{{ID: "m0", Host: "h0"}, {ID: "m1", Host: "h1"}, {ID: "m2", Host: "h2"}}
	cands := []PlacementNode{{ID: "r3", Host: "h0"}, {ID: "r4", Host: "h1"}, {ID: "r5", Host: "h2"}}
	got := PlaceReplicas(masters, 1, cands)
	if len(got) != 3 {
		t.Fatalf("PlaceReplicas = %v, want all three placed", got)
	}
	hostOf := map[string]string{"m0": "h0", "m1": "h1", "m2": "h2", "r3": "h0", "r4": "h1", "r5": "h2"}
	seen := map[string]bool{}
	for r, m := range got {
		if hostOf[r] == hostOf[m] {
			t.Errorf("replica %s is on its master %s's host %s", r, m, hostOf[m])
		}
		if seen[m] {
			t.Errorf("master %s got two replicas: %v", m, got)
		}
		seen[m] = true
	}
}

func TestPlaceReplicasKeepsAndMoves(t *testing.T) {
	t.Parallel()
	masters := []PlacementNode{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	cands := []PlacementNode{
		{ID: "r1", Master: "a"},
		{ID: "r2", Master: "a"}, // surplus: a needs one
		{ID: "r3", Master: "c"},
		{ID: "r4", Master: "gone"}, // its master is not designated
	}
	got := PlaceReplicas(masters, 1, cands)
	if _, moved := got["r1"]; moved {
		t.Errorf("r1 moved (%v); a keeps its first replica", got)
	}
	if _, moved := got["r3"]; moved {
		t.Errorf("r3 moved (%v); c keeps its replica", got)
	}
	if got["r2"] != "b" && got["r4"] != "b" {
		t.Errorf("PlaceReplicas = %v, want b to get r2 or r4", got)
	}
	if len(got) != 1 {
		t.Errorf("PlaceReplicas = %v, want exactly one move: only b needs a replica", got)
	}
}

func TestPlaceReplicasRoundRobinWhenShort(t *testing.T) {
	t.Parallel()
	masters := []PlacementNode{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	cands := []PlacementNode{{ID: "s1"}, {ID: "s2"}, {ID: "s3"}}
	got := PlaceReplicas(masters, 2, cands)
	per := map[string]int{}
	for _, m := range got {
		per[m]++
	}
	if per["a"] != 1 || per["b"] != 1 || per["c"] != 1 {
		t.Errorf("PlaceReplicas with 3 spares for 3x2 = %v, want one each before any gets two", got)
	}
	if got := PlaceReplicas(masters, 0, cands); len(got) != 0 {
		t.Errorf("PlaceReplicas with 0 replicas per shard = %v, want none", got)
	}
}
