package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
)

func TestSlotConformance(t *testing.T) {
	t.Parallel()
	limitertest.RunSlots(t, func(t *testing.T, now func() time.Time) limiter.SlotStore {
		var opts []Option
		if now != nil {
			opts = append(opts, WithClock(now))
		}
		s, err := New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// The slot table keeps no key without a live lease: released keys go at
// once, expired ones at their next use.
func TestSlotKeysAreDropped(t *testing.T) {
	t.Parallel()
	clk := limitertest.NewClock(time.Unix(1_700_000_000, 0))
	s, err := New(WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 100 {
		req := limiter.SlotRequest{Key: "k" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Lease: 1, Max: 1, TTL: time.Second}
		if d, _, err := s.Acquire(ctx, req); err != nil || !d.Acquired {
			t.Fatalf("Acquire: %v, %v", d, err)
		}
		if _, err := s.Release(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.slots.slotKeys(); got != 0 {
		t.Errorf("%d keys after every lease was released, want 0", got)
	}
	req := limiter.SlotRequest{Key: "crashed", Lease: 7, Max: 1, TTL: time.Second}
	if _, _, err := s.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Second)
	req.Lease = 8
	if d, _, err := s.Acquire(ctx, req); err != nil || !d.Acquired || d.InFlight != 1 {
		t.Fatalf("Acquire after the first lease expired = %v, %v; want acquired, 1 in flight", d, err)
	}
	if _, err := s.Release(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := s.slots.slotKeys(); got != 0 {
		t.Errorf("%d keys after the expired and the released lease, want 0", got)
	}
}

func BenchmarkSlotAcquireRelease(b *testing.B) {
	s, err := New()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := limiter.SlotRequest{Key: "bench", Max: 1 << 10, TTL: 10 * time.Second}
	b.ReportAllocs()
	for i := range b.N {
		req.Lease = uint64(i) + 1
		if _, _, err := s.Acquire(ctx, req); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Release(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
