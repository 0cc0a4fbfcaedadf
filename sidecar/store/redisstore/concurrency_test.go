package redisstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

func TestSlotConformance(t *testing.T) {
	t.Parallel()
	limitertest.RunSlots(t, func(t *testing.T, now func() time.Time) limiter.SlotStore {
		return newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: now})
	})
}

// TestSlotsSharedByFourStores has four stores, like four sidecars, hold
// requests of one key in flight at once: the leases held together never
// exceed the cap, and once all are released the key is empty again.
func TestSlotsSharedByFourStores(t *testing.T) {
	t.Parallel()
	const stores, callers, rounds, maxN = 4, 12, 30, 10
	ss := make([]*redisstore.Store, stores)
	for i := range ss {
		ss[i] = newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout})
	}
	key := uniqueKey(t)
	var held, peak, acquired atomic.Int64
	var lease atomic.Uint64
	var wg sync.WaitGroup
	errs := make(chan error, stores*callers)
	for i := range stores * callers {
		s := ss[i%stores]
		wg.Go(func() {
			for range rounds {
				req := limiter.SlotRequest{Key: key, Lease: lease.Add(1), Max: maxN, TTL: time.Minute}
				d, _, err := s.Acquire(context.Background(), req)
				if err != nil {
					errs <- err
					return
				}
				if !d.Acquired {
					if d.InFlight < maxN {
						t.Errorf("refused with %d in flight, below the cap %d", d.InFlight, maxN)
					}
					continue
				}
				acquired.Add(1)
				n := held.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Millisecond)
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
		t.Errorf("%d requests held slots at once, want at most %d", p, maxN)
	}
	if acquired.Load() < maxN {
		t.Errorf("only %d slots were ever acquired", acquired.Load())
	}
	n, err := cluster.NewClient().Exists(context.Background(), redisstore.SlotKey(key)).Result()
	if err != nil || n != 0 {
		t.Errorf("the leases' key exists (%d, %v) after every release, want it gone", n, err)
	}
}

// TestSlotsOfACrashedStoreComeBack has a store take every slot and
// disappear without releasing: another store is refused until the leases
// expire on Redis's clock, then gets them all, and the key carries a TTL
// all along.
func TestSlotsOfACrashedStoreComeBack(t *testing.T) {
	t.Parallel()
	const maxN, ttl = 3, 1500 * time.Millisecond
	crashed := newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout})
	other := newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout})
	key := uniqueKey(t)
	ctx := context.Background()
	for i := range maxN {
		d, _, err := crashed.Acquire(ctx, limiter.SlotRequest{Key: key, Lease: uint64(100 + i), Max: maxN, TTL: ttl})
		if err != nil || !d.Acquired {
			t.Fatalf("Acquire %d: %v, %v", i, d, err)
		}
	}
	start := time.Now()
	pttl, err := cluster.NewClient().PTTL(ctx, redisstore.SlotKey(key)).Result()
	if err != nil || pttl <= ttl || pttl > ttl+2*time.Second {
		t.Errorf("PTTL of the leases' key = %v, %v; want just over the lease TTL %v", pttl, err, ttl)
	}
	var back time.Duration
	for lease := uint64(1); ; lease++ {
		d, _, err := other.Acquire(ctx, limiter.SlotRequest{Key: key, Lease: lease, Max: maxN, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if d.Acquired {
			back = time.Since(start)
			if d.InFlight != 1 {
				t.Errorf("in flight after the crashed leases expired = %d, want 1", d.InFlight)
			}
			break
		}
		if time.Since(start) > 3*ttl {
			t.Fatalf("slots still taken %v after the crash, with a lease TTL of %v", time.Since(start), ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if back > ttl+500*time.Millisecond {
		t.Errorf("slots came back after %v, want within the lease TTL %v (plus polling)", back, ttl)
	}
	if back < ttl-200*time.Millisecond {
		t.Errorf("slots came back after %v, before the lease TTL %v", back, ttl)
	}
}

// A store that lost its connection fails slot calls as unavailable, so the
// engine can follow the rule's failure mode.
func TestSlotsUnavailableAfterClose(t *testing.T) {
	t.Parallel()
	s := newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.Acquire(context.Background(), limiter.SlotRequest{Key: uniqueKey(t), Lease: 1, Max: 1, TTL: time.Second})
	if !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Acquire on a closed store: %v, want ErrUnavailable", err)
	}
}
