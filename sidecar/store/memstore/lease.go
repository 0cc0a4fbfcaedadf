package memstore

import (
	"context"
	"fmt"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

var _ limiter.Leaser = (*Store)(nil)

// Lease implements limiter.Leaser: it applies req to its key atomically,
// as the Redis store's lease scripts do, so that the engine and its tests
// can lease from either store. Errors are for bad input only, including
// limiter.ErrNotLeasable for SlidingLog. The shard is always "".
func (s *Store) Lease(_ context.Context, req limiter.LeaseRequest) (limiter.Lease, string, error) {
	lp, err := s.limits.get(&req.Limit)
	if err != nil {
		return limiter.Lease{}, "", fmt.Errorf("memstore lease: %w", err)
	}
	now := s.clock().UnixMicro()
	if err := limiter.CheckLease(req.Limit.Algorithm, now, req.LeaseArgs); err != nil {
		return limiter.Lease{}, "", fmt.Errorf("memstore lease: %w", err)
	}
	h := hashKey(req.Key)
	sh := s.shardOf(h)
	sh.mu.Lock()
	l, err := sh.lease(h, lp, now, req.LeaseArgs)
	sh.mu.Unlock()
	if err != nil {
		return limiter.Lease{}, "", fmt.Errorf("memstore lease: %w", err)
	}
	return l, "", nil
}

// lease is take for a lease call on a fixed-size state.
func (sh *shard) lease(h uint64, lp *limitParams, now int64, a limiter.LeaseArgs) (limiter.Lease, error) {
	i, found := sh.find(h)
	if found && sh.table[i].expired(now) {
		sh.deleteAt(i)
		i, found = sh.find(h)
	}
	i, found, st, sp := sh.load(h, i, found, lp.p)
	l, write, err := lp.p.Lease(&st, sp, now, a)
	if err != nil || !write {
		return l, err
	}
	sh.store(h, i, found, lp, now, st, l.ResetAfter)
	return l, nil
}
