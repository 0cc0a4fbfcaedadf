package runner

import (
	"context"
	"time"
)

// sweepInterval is how often the in-memory stores give back the memory of
// the keys that have expired.
const sweepInterval = 10 * time.Second

// sweepLocal sweeps the in-memory stores every interval until ctx ends. A
// store reclaims expired keys only a few at a time as new keys arrive, so
// without it a sidecar that goes quiet, or whose config lost most of its
// rules, would keep the counters of the rules that are gone, and the
// tables that held them, for good.
func (r *Runner) sweepLocal(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.sweep()
	}
}

// sweep removes the expired keys of the in-memory stores, on their own
// clocks, gives back the memory they held, and returns how many keys the
// stores still hold. Counters that have not expired are kept: those of a
// rule that leaves the config go when they would have ended anyway, as in
// Redis, so a rule that comes back within its window finds its counts.
func (r *Runner) sweep() int {
	r.mu.Lock()
	local := r.local
	r.mu.Unlock()
	n := 0
	for _, s := range local {
		s.Sweep(time.Time{})
		n += s.Len()
	}
	return n
}
