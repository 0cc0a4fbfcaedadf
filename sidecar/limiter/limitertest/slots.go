package limitertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// SlotOp is an operation of a slot step table.
type SlotOp uint8

// The slot operations.
const (
	Acquire SlotOp = iota + 1
	Renew
	Release
)

func (o SlotOp) String() string {
	switch o {
	case Acquire:
		return "Acquire"
	case Renew:
		return "Renew"
	case Release:
		return "Release"
	}
	return fmt.Sprintf("SlotOp(%d)", uint8(o))
}

// SlotStep is one operation at an instant and what it must answer: for
// Acquire, OK is Acquired and InFlight the leases after it; for Renew, OK is
// held (InFlight is not checked); for Release nothing is checked.
type SlotStep struct {
	At       time.Duration
	Op       SlotOp
	Lease    uint64
	OK       bool
	InFlight int64
}

// SlotTable is a sequence of slot operations on one key under one cap and
// lease TTL.
type SlotTable struct {
	Name  string
	Max   int64
	TTL   time.Duration
	Steps []SlotStep
}

// SlotTables are the conformance tables of slot stores.
func SlotTables() []SlotTable {
	s := time.Second
	return []SlotTable{{
		Name: "cap and release", Max: 2, TTL: 10 * s,
		Steps: []SlotStep{
			{0, Acquire, 1, true, 1},
			{0, Acquire, 2, true, 2},
			{0, Acquire, 3, false, 2},
			{s, Release, 1, false, 0},
			{s, Acquire, 3, true, 2},
			{s, Acquire, 4, false, 2},
			{2 * s, Release, 2, false, 0},
			{2 * s, Release, 3, false, 0},
			{2 * s, Acquire, 4, true, 1},
		},
	}, {
		Name: "a lease not renewed expires at its TTL", Max: 1, TTL: 10 * s,
		Steps: []SlotStep{
			{0, Acquire, 1, true, 1},
			{10*s - time.Microsecond, Acquire, 2, false, 1},
			{10 * s, Acquire, 2, true, 1}, // lease 1 expired exactly now
			{10 * s, Renew, 1, false, 0},  // and cannot come back: no room
			{11 * s, Release, 2, false, 0},
			{11 * s, Renew, 1, true, 0}, // room again: taken again
			{11 * s, Acquire, 3, false, 1},
		},
	}, {
		Name: "renewal keeps a lease past its first TTL", Max: 1, TTL: 3 * s,
		Steps: []SlotStep{
			{0, Acquire, 1, true, 1},
			{2 * s, Renew, 1, true, 0},
			{4 * s, Acquire, 2, false, 1}, // renewed at 2s: lives to 5s
			{4 * s, Renew, 1, true, 0},
			{6 * s, Acquire, 2, false, 1},
			{7 * s, Acquire, 2, true, 1}, // not renewed since 4s: gone at 7s
		},
	}, {
		Name: "acquiring a held lease renews it", Max: 1, TTL: 2 * s,
		Steps: []SlotStep{
			{0, Acquire, 1, true, 1},
			{s, Acquire, 1, true, 1},
			{2 * s, Acquire, 2, false, 1},
			{3 * s, Acquire, 2, true, 1},
		},
	}, {
		Name: "releasing an unknown lease changes nothing", Max: 1, TTL: 2 * s,
		Steps: []SlotStep{
			{0, Release, 9, false, 0},
			{0, Acquire, 1, true, 1},
			{0, Release, 9, false, 0},
			{0, Acquire, 2, false, 1},
		},
	}, {
		Name: "a cap of one hundred", Max: 100, TTL: 2 * s,
		Steps: func() []SlotStep {
			var st []SlotStep
			for i := uint64(1); i <= 100; i++ {
				st = append(st, SlotStep{0, Acquire, i, true, int64(i)})
			}
			st = append(st, SlotStep{0, Acquire, 101, false, 100}, SlotStep{s, Release, 50, false, 0},
				SlotStep{s, Acquire, 101, true, 100}, SlotStep{3 * s, Acquire, 102, true, 1})
			return st
		}(),
	}}
}

// slotKey returns a key unique to this process, subtest and run.
func slotKey(t *testing.T) string { return keyPrefix(t) + "slots" }

// RunSlots runs the slot conformance suite against the stores newStore
// returns, with the clock now (nil: the store's own clock), as Run does for
// limiter.Store.
func RunSlots(t *testing.T, newStore func(t *testing.T, now func() time.Time) limiter.SlotStore) {
	base := time.Unix(1_700_000_000, 0)
	t.Run("Tables", func(t *testing.T) {
		t.Parallel()
		for _, tb := range SlotTables() {
			t.Run(tb.Name, func(t *testing.T) {
				t.Parallel()
				clk := NewClock(base)
				s, key := newStore(t, clk.Now), slotKey(t)
				for i, st := range tb.Steps {
					clk.Set(base.Add(st.At))
					req := limiter.SlotRequest{Key: key, Lease: st.Lease, Max: tb.Max, TTL: tb.TTL}
					switch st.Op {
					case Acquire:
						d, _, err := s.Acquire(t.Context(), req)
						if err != nil {
							t.Fatalf("step %d: Acquire(%v, lease %d): %v", i, st.At, st.Lease, err)
						}
						if want := (limiter.SlotDecision{Acquired: st.OK, InFlight: st.InFlight, Max: tb.Max}); d != want {
							t.Errorf("step %d: Acquire(%v, lease %d) = %v, want %v", i, st.At, st.Lease, d, want)
						}
					case Renew:
						held, _, err := s.Renew(t.Context(), req)
						if err != nil {
							t.Fatalf("step %d: Renew(%v, lease %d): %v", i, st.At, st.Lease, err)
						}
						if held != st.OK {
							t.Errorf("step %d: Renew(%v, lease %d) = %v, want %v", i, st.At, st.Lease, held, st.OK)
						}
					case Release:
						if _, err := s.Release(t.Context(), req); err != nil {
							t.Fatalf("step %d: Release(%v, lease %d): %v", i, st.At, st.Lease, err)
						}
					}
				}
			})
		}
	})
	t.Run("Model", func(t *testing.T) {
		t.Parallel()
		clk := NewClock(base)
		s, key := newStore(t, clk.Now), slotKey(t)
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
		const maxN, ttl = 5, 3 * time.Second
		var model limiter.Slots
		at := base
		for i := range 2000 {
			at = at.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
			clk.Set(at)
			now := at.UnixMicro()
			lease := uint64(rng.IntN(12) + 1)
			req := limiter.SlotRequest{Key: key, Lease: lease, Max: maxN, TTL: ttl}
			switch rng.IntN(3) {
			case 0:
				want := model.Acquire(now, lease, maxN, ttl)
				d, _, err := s.Acquire(t.Context(), req)
				if err != nil || d != want {
					t.Fatalf("step %d: Acquire(lease %d) = %v, %v; the model says %v", i, lease, d, err, want)
				}
			case 1:
				want := model.Renew(now, lease, maxN, ttl)
				held, _, err := s.Renew(t.Context(), req)
				if err != nil || held != want {
					t.Fatalf("step %d: Renew(lease %d) = %v, %v; the model says %v", i, lease, held, err, want)
				}
			default:
				model.Release(lease)
				if _, err := s.Release(t.Context(), req); err != nil {
					t.Fatalf("step %d: Release(lease %d): %v", i, lease, err)
				}
			}
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		// Many callers race for a few slots on the store's own clock: the
		// leases held at once never exceed the cap, and every slot is back
		// when all are released.
		s, key := newStore(t, nil), slotKey(t)
		const maxN, callers, rounds = 4, 16, 40
		var held, peak atomic.Int64
		var next atomic.Uint64
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for range callers {
			wg.Go(func() {
				for range rounds {
					req := limiter.SlotRequest{Key: key, Lease: next.Add(1), Max: maxN, TTL: time.Minute}
					d, _, err := s.Acquire(context.Background(), req)
					if err != nil {
						errs <- err
						return
					}
					if !d.Acquired {
						continue
					}
					n := held.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					held.Add(-1)
					if _, err := s.Release(context.Background(), req); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if p := peak.Load(); p > maxN {
			t.Errorf("%d leases held at once, want at most %d", p, maxN)
		}
		d, _, err := s.Acquire(context.Background(), limiter.SlotRequest{Key: key, Lease: next.Add(1), Max: maxN, TTL: time.Minute})
		if err != nil || !d.Acquired || d.InFlight != 1 {
			t.Errorf("Acquire after every release = %v, %v; want the only lease", d, err)
		}
	})
	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, nil)
		for _, req := range []limiter.SlotRequest{
			{Key: "", Lease: 1, Max: 1, TTL: time.Second},
			{Key: "k", Lease: 0, Max: 1, TTL: time.Second},
			{Key: "k", Lease: 1, Max: 0, TTL: time.Second},
			{Key: "k", Lease: 1, Max: limiter.MaxSlots + 1, TTL: time.Second},
			{Key: "k", Lease: 1, Max: 1, TTL: 0},
			{Key: "k", Lease: 1, Max: 1, TTL: 2 * time.Hour},
		} {
			if _, _, err := s.Acquire(t.Context(), req); err == nil {
				t.Errorf("Acquire(%+v) succeeded, want an error", req)
			}
			if _, _, err := s.Renew(t.Context(), req); err == nil {
				t.Errorf("Renew(%+v) succeeded, want an error", req)
			}
		}
	})
}
