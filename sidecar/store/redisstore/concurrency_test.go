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
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
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
	n, err := cluster.NewClient().Exists(context.Background(), redislayout.SlotKey(key)).Result()
	if err != nil || n != 0 {
		t.Errorf("the leases' key exists (%d, %v) after every release, want it gone", n, err)
	}
}

// TestSlotsOfACrashedStoreComeBack has a store take every slot and
// disappear without releasing: another store is refused while every lease
// is live, on Redis's clock, and takes a slot as soon as one has expired,
// with as many still held as are live then; the key outlives its latest
// lease by a second all along. The leases' expiries are read from Redis
// (their scores), and Redis's clock is this machine's: every call is
// judged against the instants bracketing it, not against a guess of how
// long the calls took.
func TestSlotsOfACrashedStoreComeBack(t *testing.T) {
	t.Parallel()
	const maxN, ttl = 3, 1500 * time.Millisecond
	crashed := newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout})
	other := newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout})
	key := uniqueKey(t)
	ctx := context.Background()
	// The last Acquire ran between sent and answered.
	var sent, answered time.Time
	for i := range maxN {
		sent = time.Now()
		d, _, err := crashed.Acquire(ctx, limiter.SlotRequest{Key: key, Lease: uint64(100 + i), Max: maxN, TTL: ttl})
		answered = time.Now()
		if err != nil || !d.Acquired {
			t.Fatalf("Acquire %d: %v, %v", i, d, err)
		}
	}
	cl := cluster.NewClient()
	defer func() { _ = cl.Close() }()
	leases, err := cl.ZRangeWithScores(ctx, redislayout.SlotKey(key), 0, -1).Result()
	if err != nil || len(leases) != maxN {
		t.Fatalf("the leases' key holds %v, %v; want %d leases", leases, err, maxN)
	}
	expiries := make([]time.Time, maxN)
	for i, z := range leases {
		expiries[i] = time.UnixMicro(int64(z.Score))
	}
	// The key's TTL, set by the last Acquire: a second past its lease,
	// which ends ttl after the script ran, within the call's instants
	// (to the millisecond Redis keeps expiries in).
	ms, err := cl.PExpireTime(ctx, redislayout.SlotKey(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	expireAt := time.UnixMilli(int64(ms / time.Millisecond))
	if lo, hi := sent.Add(ttl+time.Second-time.Millisecond), answered.Add(ttl+time.Second+time.Millisecond); expireAt.Before(lo) || expireAt.After(hi) {
		t.Errorf("the leases' key expires at %v, %v after its latest lease; want a second after it, within [%v, %v]", expireAt, expireAt.Sub(expiries[maxN-1]), lo, hi)
	}
	// live returns how many of the crashed store's leases are live at t.
	live := func(at time.Time) int64 {
		n := int64(0)
		for _, e := range expiries {
			if e.After(at) {
				n++
			}
		}
		return n
	}
	var refused int
	for lease := uint64(1); ; lease++ {
		before := time.Now()
		d, _, err := other.Acquire(ctx, limiter.SlotRequest{Key: key, Lease: lease, Max: maxN, TTL: ttl})
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		// The script ran in [before, after]: as many leases were live
		// then as at some instant of it.
		if !d.Acquired {
			if live(before) < maxN {
				t.Fatalf("refused at %v, %v after the first lease expired: want the slot back once a lease expires", before, before.Sub(expiries[0]))
			}
			refused++
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if live(after) == maxN {
			t.Errorf("a slot was taken by %v, %v before the first lease expired", after, expiries[0].Sub(after))
		}
		if hi, lo := live(before)+1, live(after)+1; d.InFlight > hi || d.InFlight < lo {
			t.Errorf("in flight after the crashed leases began to expire = %d, want %d to %d (this lease and the crashed ones live then)", d.InFlight, lo, hi)
		}
		t.Logf("refused %d times while every lease was live; a slot taken %v after the first lease expired, with %d in flight", refused, after.Sub(expiries[0]).Round(time.Millisecond), d.InFlight)
		return
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
