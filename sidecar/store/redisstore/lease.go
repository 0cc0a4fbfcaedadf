package redisstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
)

var _ limiter.Leaser = (*Store)(nil)

// leaseCache holds the lease script arguments of the limits seen. They
// depend on the limit alone, so every Store shares them.
var leaseCache = struct {
	sync.Mutex
	m map[limiter.Limit]*limitArgs
}{m: map[limiter.Limit]*limitArgs{}}

// leaseArgs returns the validated parameters of l with its lease script
// and constant arguments, cached.
func leaseArgs(l limiter.Limit) (*limitArgs, error) {
	leaseCache.Lock()
	la, ok := leaseCache.m[l]
	leaseCache.Unlock()
	if ok {
		return la, nil
	}
	p, err := limiter.NewParams(l)
	if err != nil {
		return nil, err
	}
	if !l.Algorithm.Leasable() {
		return nil, fmt.Errorf("lease with %v: %w", l.Algorithm, limiter.ErrNotLeasable)
	}
	la = buildLimitArgs(p, redislayout.Leases[l.Algorithm], 3)
	leaseCache.Lock()
	if len(leaseCache.m) >= paramsCacheSize {
		clear(leaseCache.m)
	}
	leaseCache.m[l] = la
	leaseCache.Unlock()
	return la, nil
}

// Lease implements limiter.Leaser with one lease script run on the master
// of req.Key's slot, under the call discipline of Take: it returns within
// Options.Timeout, and an error wrapping limiter.ErrUnavailable means the
// script may have run (tokens may have been taken, or returned, and the
// caller cannot know). A lease call is never sent twice.
func (s *Store) Lease(ctx context.Context, req limiter.LeaseRequest) (limiter.Lease, string, error) {
	la, err := leaseArgs(req.Limit)
	if err != nil {
		return limiter.Lease{}, UnknownShard, fmt.Errorf("redisstore: %w", err)
	}
	a := la.p.LeaseArgsFor(req.LeaseArgs)
	if req.Want < 0 || req.Return < 0 {
		a = req.LeaseArgs // let the check name the bad value
	}
	o, addr, err := s.send(ctx, req.Key, la, req.Cost, &a, req.Deadline)
	if err != nil {
		return limiter.Lease{}, addr, err
	}
	l, err := leaseReply(o.res, la.p)
	if err != nil {
		err = fmt.Errorf("redisstore: %s script on %s: %w", la.sc.Name, o.addr, err)
	}
	putOp(o)
	return l, addr, err
}

// leaseReply checks a lease script's reply, {allowed, remaining, reset_us,
// retry_us, granted, window, valid_for_us} as a RESP2 array of integers,
// and turns it into a Lease under p.
func leaseReply(res any, p *limiter.Params) (limiter.Lease, error) {
	arr, ok := res.([]any)
	if !ok || len(arr) != 7 {
		return limiter.Lease{}, fmt.Errorf("reply is %T (%v), want an array of 7 integers", res, res)
	}
	var v [7]int64
	for i, e := range arr {
		n, ok := e.(int64)
		if !ok {
			return limiter.Lease{}, fmt.Errorf("reply element %d is %T (%v), want an integer", i, e, e)
		}
		v[i] = n
	}
	d, err := checkReply([4]int64{v[0], v[1], v[2], v[3]}, p)
	if err != nil {
		return limiter.Lease{}, err
	}
	g, window, valid := v[4], v[5], v[6]
	windowed := p.Limit.Algorithm == limiter.FixedWindow || p.Limit.Algorithm == limiter.SlidingWindow
	switch {
	case g < 0 || g > p.Capacity || (!d.Allowed && g != 0):
		return limiter.Lease{}, fmt.Errorf("reply granted = %d on %v, want 0 to %d, 0 on a deny", g, d, p.Capacity)
	case windowed && (window < 0 || valid < 1):
		return limiter.Lease{}, fmt.Errorf("reply window = %d, valid for %dµs, want a window start and a positive time", window, valid)
	case !windowed && (window != 0 || valid != 0):
		return limiter.Lease{}, fmt.Errorf("reply window = %d, valid for %dµs, want 0 for %v", window, valid, p.Limit.Algorithm)
	}
	return limiter.Lease{Decision: d, Granted: g, Window: window, ValidFor: time.Duration(valid) * time.Microsecond}, nil
}
