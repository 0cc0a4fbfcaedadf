package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// splitRule is a rule whose keys are spread over k sub-counters.
type splitRule struct {
	k      int
	limits []limiter.Limit // limiter.SplitLimit of each sub-counter
	params []*limiter.Params
	calls  []prometheus.Counter // store calls per sub-counter
}

// Spread sets how the rule's keys are counted beyond one call per request:
// lease lets the sidecar lease the tokens of hot keys (when the engine has
// leases and the algorithm can lease), and split, above 1, spreads each key
// over that many sub-counters of 1/split of the limit (ALGORITHMS.md
// sections 8 and 9). It must be called before the rule decides anything;
// a rule it is not called on neither leases nor splits.
func (r *Rule) Spread(lease bool, split int, m *metrics.Metrics) error {
	if m == nil {
		return fmt.Errorf("engine: nil metrics")
	}
	if err := r.Limit.ValidateSplit(split); err != nil {
		return err
	}
	r.lm = m.Lease.ForLeaseRule(r.Policy, r.Name)
	// A delaying rule reserves each request's slot on the store, one call
	// per request: a lease or a sub-counter could not queue behind the
	// other replicas' reservations.
	r.leases = lease && r.Limit.Algorithm.Leasable() && !r.Delays()
	if split > 1 && r.Delays() {
		return errors.New("split: a rule that delays (onExceed: Delay) is not split")
	}
	if split > 1 {
		sp := &splitRule{k: split, limits: make([]limiter.Limit, split), params: make([]*limiter.Params, split), calls: r.lm.SplitCalls(split)}
		for i := range split {
			sp.limits[i] = limiter.SplitLimit(r.Limit, i, split)
			p, err := limiter.NewParams(sp.limits[i])
			if err != nil {
				return fmt.Errorf("split: sub-counter %d: %w", i, err)
			}
			sp.params[i] = p
		}
		r.split = sp
	}
	return nil
}

// splitK is the number of sub-counters of the rule's keys.
func (r *Rule) splitK() int {
	if r.split == nil {
		return 1
	}
	return r.split.k
}

// subKey is the counter key of sub-counter i of key split k ways: the
// store's own placement when it has one (limiter.Splitter), else key~i.
func (e *Engine) subKey(key string, i, k int) string {
	if s, ok := e.o.Store.(limiter.Splitter); ok {
		return s.SplitKey(key, i, k)
	}
	return key + "~" + strconv.Itoa(i)
}

// takeSpread makes the store calls of c when it takes a lease or its rule
// is split: a lease call on the key, or on a split key one call per
// sub-counter, from the first one up, until one admits (the later ones
// borrow what the first lacked).
func (e *Engine) takeSpread(ctx context.Context, h *Hit, c *call, now time.Time) {
	sp := h.Rule.split
	if sp == nil {
		e.takeLease(ctx, h, c, now)
		return
	}
	lc := &c.lease
	leasing := lc.entry != nil
	start := lc.sub
	if !leasing {
		start = int(e.splitSeq.Add(1) % uint64(sp.k))
	}
	var (
		deny             limiter.Decision
		denied           bool
		lastErr          error
		answered         time.Time
		returnedAnswered bool
		capacity         = h.Rule.Limit.Capacity()
		whole            = func(d limiter.Decision) limiter.Decision { d.Limit = capacity; return d }
	)
	for j := range sp.k {
		i := (start + j) % sp.k
		key := e.subKey(h.Key, i, sp.k)
		sp.calls[i].Inc()
		if j > 0 {
			h.Rule.lm.Borrows.Inc()
		}
		var l limiter.Lease
		var shard string
		var err error
		if leasing {
			args := limiter.LeaseArgs{Cost: c.cost, Want: lc.want}
			if j == 0 {
				args.Return, args.Window = lc.ret, lc.window
			}
			l, shard, err = e.leases.store.Lease(ctx, limiter.LeaseRequest{Key: key, Limit: sp.limits[i], LeaseArgs: args, Deadline: c.deadline})
		} else {
			l.Decision, shard, err = e.o.Store.Take(ctx, limiter.Request{Key: key, Limit: sp.limits[i], Cost: c.cost, Deadline: c.deadline})
		}
		answered = e.o.Now()
		sm := e.observeStore(shard, now, answered)
		if err != nil {
			e.countStoreFailure(sm, err, answered)
			lastErr = err
			continue
		}
		sm.ok.Inc()
		e.markShard(sm, false, answered)
		if j == 0 {
			returnedAnswered = true
		}
		if l.Allowed {
			d := whole(l.Decision)
			d.Remaining = min(capacity, l.Remaining*int64(sp.k))
			if leasing {
				if !returnedAnswered {
					e.leases.lostReturn(h, lc)
				}
				extra := e.leases.settle(h, lc, i, l, c.cost, now, answered)
				d.Remaining = min(capacity, d.Remaining+extra)
			}
			c.res = Result{Decision: d, Source: FromStore, Taken: c.cost > 0}
			if c.entry != nil {
				// Another sub-counter may hold what this one lacks: the
				// key is held only when all deny.
				e.deny.settle(h.Key, c.entry, answered, answer{allowed: true, remaining: d.Remaining, interval: h.Rule.interval, cost: 1, limit: capacity})
				c.entry = nil
			}
			return
		}
		if !denied || l.RetryAfter < deny.RetryAfter {
			deny = l.Decision
		}
		denied = true
	}
	if leasing {
		if !returnedAnswered {
			e.leases.lostReturn(h, lc)
		}
		if denied {
			e.leases.settle(h, lc, lc.sub, limiter.Lease{Decision: deny}, c.cost, now, answered)
		} else if e.leases.failed(h, lc, c.cost, answered, &c.res) {
			if c.entry != nil {
				e.deny.settle(h.Key, c.entry, now, answer{failed: true})
				c.entry = nil
			}
			return
		}
	}
	if !denied {
		// No sub-counter answered: the rule's failure mode decides.
		e.storeFailedCounted(ctx, h, c, lastErr, now)
		return
	}
	d := whole(deny)
	d.Remaining = 0
	c.res = Result{Decision: d, Source: FromStore}
	e.remember(h, c, d, answered)
}

// lostReturn counts the tokens a lease call gave back on a sub-counter
// that did not answer: they may or may not have reached it.
func (t *leaseTable) lostReturn(h *Hit, lc *leaseCall) {
	if lc.ret > 0 {
		h.Rule.lm.LostTokens.Add(float64(lc.ret))
		lc.ret = 0
	}
}

// storeFailedCounted is storeFailed for a failure already counted in the
// store metrics.
func (e *Engine) storeFailedCounted(ctx context.Context, h *Hit, c *call, err error, now time.Time) {
	if c.entry != nil {
		e.deny.settle(h.Key, c.entry, now, answer{failed: true})
		c.entry = nil
	}
	c.err = err
	e.fallBack(ctx, h, c)
}
