package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/resp"
)

var _ limiter.SlotStore = (*Store)(nil)

// releaseArgs are the release script's: no constants.
var releaseArgs = newScriptArgs(redislayout.Release, nil)

// newScriptArgs formats a script's command head and constant ARGV tail, as
// newLimitArgs does for the rate scripts. The result has no Params.
func newScriptArgs(sc *script, tail []int64) *limitArgs {
	la := &limitArgs{sc: sc, tail: make([]string, len(tail))}
	for i, v := range tail {
		la.tail[i] = strconv.FormatInt(v, 10)
		la.tailRESP = resp.AppendBulk(la.tailRESP, la.tail[i])
	}
	la.head = fcallHead(sc, len(tail))
	return la
}

// acquireArgs caches the acquire script's arguments per cap and TTL: the
// values a config has are few, and a cache that grows past its bound is
// emptied.
var acquireArgs struct {
	mu sync.Mutex
	m  map[[2]int64]*limitArgs
}

func slotAcquireArgs(maxN int64, ttl time.Duration) *limitArgs {
	k := [2]int64{maxN, ttl.Microseconds()}
	acquireArgs.mu.Lock()
	defer acquireArgs.mu.Unlock()
	if la, ok := acquireArgs.m[k]; ok {
		return la
	}
	if acquireArgs.m == nil || len(acquireArgs.m) >= paramsCacheSize {
		acquireArgs.m = map[[2]int64]*limitArgs{}
	}
	la := newScriptArgs(redislayout.Acquire, k[:])
	acquireArgs.m[k] = la
	return la
}

// Acquire implements limiter.SlotStore with one script run on the master
// of the key's slot, under the call discipline of Take: it returns within
// Options.Timeout, never sends the script twice unless the answer proves
// it did not run, and fails with limiter.ErrUnavailable when the outcome is
// unknown. An unknown outcome may have taken the lease: it then expires by
// its TTL.
func (s *Store) Acquire(ctx context.Context, req limiter.SlotRequest) (limiter.SlotDecision, string, error) {
	if err := req.Check(); err != nil {
		return limiter.SlotDecision{}, UnknownShard, fmt.Errorf("redisstore: %w", err)
	}
	vals, addr, err := s.slotCall(ctx, req, slotAcquireArgs(req.Max, req.TTL))
	if err != nil {
		return limiter.SlotDecision{}, addr, err
	}
	if (vals[0] != 0 && vals[0] != 1) || vals[1] < 0 {
		return limiter.SlotDecision{}, addr, fmt.Errorf("redisstore: %s script on %s: reply {%d, %d}, want {0 or 1, in flight >= 0}",
			redislayout.Acquire.Name, addr, vals[0], vals[1])
	}
	return limiter.SlotDecision{Acquired: vals[0] == 1, InFlight: vals[1], Max: req.Max}, addr, nil
}

// Renew implements limiter.SlotStore: it is the acquire script, which
// renews a lease the key holds and takes an expired one again when there
// is room.
func (s *Store) Renew(ctx context.Context, req limiter.SlotRequest) (bool, string, error) {
	d, addr, err := s.Acquire(ctx, req)
	return d.Acquired, addr, err
}

// Release implements limiter.SlotStore. A release whose outcome is unknown
// (the store is unreachable) leaves the lease to expire by its TTL.
func (s *Store) Release(ctx context.Context, req limiter.SlotRequest) (string, error) {
	if req.Key == "" || req.Lease == 0 || req.Lease > 1<<63-1 {
		return UnknownShard, errors.New("redisstore: release: key and a lease between 1 and 2^63-1 are required")
	}
	vals, addr, err := s.slotCall(ctx, req, releaseArgs)
	if err != nil {
		return addr, err
	}
	if vals[0] != 0 && vals[0] != 1 {
		return addr, fmt.Errorf("redisstore: %s script on %s: reply removed = %d, want 0 or 1", redislayout.Release.Name, addr, vals[0])
	}
	return addr, nil
}

// slotCall runs a slot script for req on the master of its key's slot and
// returns the script's four integers.
func (s *Store) slotCall(ctx context.Context, req limiter.SlotRequest, la *limitArgs) ([4]int64, string, error) {
	var now string
	if s.opts.Now != nil {
		us := limiter.Micros(s.opts.Now())
		if err := limiter.CheckInput(us, 0); err != nil {
			return [4]int64{}, UnknownShard, fmt.Errorf("redisstore: %w", err)
		}
		now = strconv.FormatInt(us, 10)
	}
	if s.closed.Load() {
		return [4]int64{}, UnknownShard, unavailable("store", errors.New("store is closed"))
	}
	deadline := time.Now().Add(s.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	key := s.keys.Slots(req.Key)
	sh, err := s.shardFor(ctx, deadline, key)
	if err != nil {
		return [4]int64{}, UnknownShard, err
	}
	o := getOp()
	o.ctx, o.deadline, o.la, o.key, o.n, o.now = ctx, deadline, la, key, int64(req.Lease), now
	addr, err := sh.do(ctx, o)
	if err != nil {
		return [4]int64{}, addr, err // o may still be in flight: not reused
	}
	vals, res := o.vals, o.res
	putOp(o)
	if res != nil {
		return [4]int64{}, addr, fmt.Errorf("redisstore: %s script on %s: reply is %T (%v), want an array of 4 integers", la.sc.Name, addr, res, res)
	}
	return vals, addr, nil
}
