package memstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

var _ limiter.SlotStore = (*Store)(nil)

// slotShardCount is the number of locks the slot table spreads its keys
// over.
const slotShardCount = 16

// slotTable holds the leases of the keys that have requests in flight, as
// limiter.Slots. A key is dropped when its last lease goes, so the table
// holds no more keys than there are requests in flight (plus the leases of
// callers that never released, until they expire at their next use). It is
// apart from the rate counters: a key with leases is never evicted, which
// would forget requests in flight. The zero value is ready.
type slotTable struct {
	shards [slotShardCount]slotShard
}

type slotShard struct {
	mu   sync.Mutex
	keys map[string]*limiter.Slots
	// free keeps a few emptied Slots (their maps keep their room), so a
	// key that comes and goes with each request allocates nothing.
	free []*limiter.Slots
}

// maxFreeSlots bounds each shard's free list.
const maxFreeSlots = 64

func (t *slotTable) shard(key string) *slotShard {
	return &t.shards[hashKey(key)%slotShardCount]
}

// do runs f on the key's Slots under its shard's lock, creating them when
// create is set, and drops them when empty at now (µs).
func (t *slotTable) do(key string, now int64, create bool, f func(*limiter.Slots)) {
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.keys[key]
	if s == nil {
		if !create {
			return
		}
		if sh.keys == nil {
			sh.keys = map[string]*limiter.Slots{}
		}
		if n := len(sh.free); n > 0 {
			s, sh.free = sh.free[n-1], sh.free[:n-1]
		} else {
			s = &limiter.Slots{}
		}
		sh.keys[key] = s
	}
	f(s)
	if s.Empty(now) {
		delete(sh.keys, key)
		if len(sh.free) < maxFreeSlots {
			sh.free = append(sh.free, s)
		}
	}
}

// slotKeys returns the number of keys with leases, for tests.
func (t *slotTable) slotKeys() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.keys)
		sh.mu.Unlock()
	}
	return n
}

// Acquire implements limiter.SlotStore on the store's clock. It never
// blocks on I/O and never returns ErrUnavailable; errors are for bad input
// only. The shard is always "".
func (s *Store) Acquire(_ context.Context, req limiter.SlotRequest) (limiter.SlotDecision, string, error) {
	if err := req.Check(); err != nil {
		return limiter.SlotDecision{}, "", fmt.Errorf("memstore acquire: %w", err)
	}
	now := s.clock().UnixMicro()
	var d limiter.SlotDecision
	s.slots.do(req.Key, now, true, func(sl *limiter.Slots) { d = sl.Acquire(now, req.Lease, req.Max, req.TTL) })
	return d, "", nil
}

// Renew implements limiter.SlotStore.
func (s *Store) Renew(_ context.Context, req limiter.SlotRequest) (bool, string, error) {
	if err := req.Check(); err != nil {
		return false, "", fmt.Errorf("memstore renew: %w", err)
	}
	now := s.clock().UnixMicro()
	held := false
	s.slots.do(req.Key, now, true, func(sl *limiter.Slots) { held = sl.Renew(now, req.Lease, req.Max, req.TTL) })
	return held, "", nil
}

// Release implements limiter.SlotStore.
func (s *Store) Release(_ context.Context, req limiter.SlotRequest) (string, error) {
	if req.Key == "" || req.Lease == 0 {
		return "", fmt.Errorf("memstore release: key and lease are required")
	}
	now := s.clock().UnixMicro()
	s.slots.do(req.Key, now, false, func(sl *limiter.Slots) { sl.Release(req.Lease) })
	return "", nil
}
