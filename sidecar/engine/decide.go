package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// call is one store call of a decision.
type call struct {
	hit   int
	cost  int64
	entry *denyEntry // the deny-cache entry the call was claimed on
	lease leaseCall  // the lease the call takes, when it refreshes one
	// failed: the store call this request waited for on its key failed;
	// the call is decided by the rule's failure mode without a store call.
	failed bool
	// deadline is the decision's (Options.Budget from its arrival; zero:
	// none): the store call ends by it.
	deadline time.Time
	res      Result
	err      error
}

// errSharedFailure is the error of a call decided on the failed outcome of
// the call its request waited for, or on its budget running out while it
// waited.
var errSharedFailure = fmt.Errorf("the store call this request waited for on its key failed or did not answer within the request's budget: %w", limiter.ErrUnavailable)

// Decide decides hits into v, whose Results it reuses. ctx bounds the
// waits and store calls.
func (e *Engine) Decide(ctx context.Context, hits []Hit, v *Verdict) {
	// Clock reads are a visible share of a decision on machines with a
	// slow clock source, so the decision reads it as few times as it can:
	// now serves the deny cache, the decision latency and the start of
	// the store calls.
	now := e.o.Now()
	start := now
	defer func() { e.o.Metrics.DecisionDuration.Observe(e.o.Now().Sub(start).Seconds()) }()
	v.reset(len(hits))
	// The decision's deadline, set once from its arrival: every wait and
	// store call of the decision ends by it (Options.Budget).
	var deadline time.Time
	if e.o.Budget > 0 {
		arrived := start
		if !e.realClock {
			arrived = time.Now()
		}
		deadline = arrived.Add(e.o.Budget)
	}

	// Enforced calls, shadow calls and their concatenation in one reused
	// slice of three sections.
	if cap(v.scratch) < 3*len(hits) {
		v.scratch = make([]call, 3*len(hits))
	}
	calls := v.scratch[:0]
	shadowCalls := v.scratch[len(hits):len(hits)]
	denied, probing := false, false
	for i := range hits {
		h := &hits[i]
		var lc leaseCall
		var l lookup
		if h.Rule.Delays() {
			// A delaying rule reserves each request's slot on the store:
			// it takes no lease, and the deny cache only remembers its
			// denials, claiming and waiting for nothing (see delay.go).
			l = e.deny.held(h.Key, h.Cost, now)
		} else {
			if e.leases != nil && h.Rule.leases {
				var kind leaseKind
				if kind, lc = e.leases.lookup(h, now, &v.Results[i]); kind == leaseHit {
					continue
				}
			}
			// Never wait for another request's probe while holding one:
			// two requests could otherwise wait on each other.
			l, now = e.check(ctx, h, now, probing, deadline)
			probing = probing || l.kind == lookupGo
		}
		if l.kind == lookupDeny {
			e.leases.release(&lc)
			v.Results[i] = Result{Decision: limiter.Decision{Limit: l.limit, RetryAfter: l.retry}, Source: FromDenyCache}
			h.Rule.m.LocalDenials.Inc()
			if h.Rule.Shadow {
				h.Rule.m.ShadowDenied.Inc()
			} else {
				denied = true
				h.Rule.m.Denied.Inc()
			}
			continue
		}
		c := call{hit: i, cost: h.Cost, entry: l.entry, lease: lc, failed: l.kind == lookupFailed, deadline: deadline}
		if h.Rule.Shadow {
			shadowCalls = append(shadowCalls, c)
		} else {
			calls = append(calls, c)
		}
	}
	if denied {
		// Another enforced rule is already known to deny: take nothing.
		for i := range calls {
			e.abandon(hits[calls[i].hit].Key, &calls[i])
		}
		calls = calls[:0]
	}

	switch {
	case len(calls) <= 1:
		// One enforced call (or none): take directly, together with the
		// shadow calls.
		if len(shadowCalls) == 0 {
			e.run(ctx, hits, calls, now)
		} else {
			all := append(v.scratch[len(hits)+len(shadowCalls):len(hits)+len(shadowCalls)], calls...)
			all = append(all, shadowCalls...)
			e.run(ctx, hits, all, now)
			copy(calls, all[:len(calls)])
			copy(shadowCalls, all[len(calls):])
		}
		for _, c := range calls {
			v.Results[c.hit] = c.res
		}
	default:
		e.decideMany(ctx, hits, calls, shadowCalls, now, v)
	}
	for _, c := range shadowCalls {
		v.Results[c.hit] = c.res
	}
	e.unspendDenied(hits, v)
	e.count(hits, v)
	e.conclude(hits, v)
	if v.Outcome != Allow {
		e.returnDelayed(ctx, hits, v)
	}
	// The calls end with the decision: a Verdict kept for a connection
	// would otherwise hold their deny-cache entries and leases, and
	// through a lease its rule, after a config change has let them go.
	clear(v.scratch[:3*len(hits)])
}

// decideMany decides several enforced hits: peek all, then take all.
func (e *Engine) decideMany(ctx context.Context, hits []Hit, calls, shadowCalls []call, now time.Time, v *Verdict) {
	peeks := make([]call, 0, len(calls)+len(shadowCalls))
	for _, c := range calls {
		peeks = append(peeks, call{hit: c.hit, cost: 0, failed: c.failed, deadline: c.deadline})
	}
	peeks = append(peeks, shadowCalls...)
	e.run(ctx, hits, peeks, now)
	copy(shadowCalls, peeks[len(calls):])
	peeks = peeks[:len(calls)]

	short := -1
	for i, p := range peeks {
		if p.res.Source == FromNowhere {
			// A fail-closed rule cannot reach the store: take nothing.
			for j := range calls {
				e.abandon(hits[calls[j].hit].Key, &calls[j])
			}
			v.Results[p.hit] = p.res
			return
		}
		// A peek is decided as a cost of 1: a denied one is short for
		// any cost, a request of cost 0 included.
		if short < 0 && (!p.res.Allowed || p.res.Remaining < hits[p.hit].Cost) {
			short = i
		}
	}
	rest := calls
	if short >= 0 {
		// The peek says this rule denies: confirm with a Take, which
		// spends nothing when it denies and reports the wait.
		one := calls[short : short+1]
		e.run(ctx, hits, one, now)
		v.Results[one[0].hit] = one[0].res
		if !one[0].res.Allowed {
			for j := range calls {
				if j != short {
					// Not taken: the request is denied by another rule.
					e.abandon(hits[calls[j].hit].Key, &calls[j])
				}
			}
			return
		}
		// Tokens came back between peek and take: it is taken, take
		// the others.
		rest = append(append([]call(nil), calls[:short]...), calls[short+1:]...)
	}
	e.run(ctx, hits, rest, now)
	for _, c := range rest {
		v.Results[c.hit] = c.res
	}
}

// check consults the deny cache for a hit and returns the clock after any
// wait. While other calls on the key are in flight and it holds no room,
// it waits for their answers, unless noWait; every call in flight ends
// within the store's deadline, and each answer either denies the key, lets
// at least one waiter through, or fails. A failure ends the wait of every
// waiter at once (lookupFailed): they fall back instead of sending calls
// one after the other, each of which would wait its own deadline on a
// stalled shard. The wait also ends at the decision's deadline
// (Options.Budget; zero: none), as a failure: the store has not answered
// on the key within the request's budget. So no request waits for the
// store longer than one call budget in all. A cancelled request stops
// waiting and is left to the store call, which fails at once.
func (e *Engine) check(ctx context.Context, h *Hit, now time.Time, noWait bool, deadline time.Time) (lookup, time.Time) {
	for {
		l := e.deny.lookup(h.Key, h.Cost, now)
		if l.kind != lookupWait {
			return l, now
		}
		if noWait {
			return lookup{kind: lookupMiss}, now
		}
		failed, err := e.deny.wait(ctx, l.round, deadline)
		if errors.Is(err, errBudgetSpent) {
			return lookup{kind: lookupFailed}, e.o.Now()
		}
		if err != nil {
			return lookup{kind: lookupMiss}, now
		}
		now = e.o.Now()
		if failed {
			return lookup{kind: lookupFailed}, now
		}
	}
}

// abandon releases the claims of a call that was not sent.
func (e *Engine) abandon(key string, c *call) {
	if c.entry != nil {
		e.deny.release(key, c.entry)
		c.entry = nil
	}
	if e.leases != nil {
		e.leases.release(&c.lease)
	}
}

// run makes the store calls, concurrently when the engine is Parallel.
func (e *Engine) run(ctx context.Context, hits []Hit, calls []call, now time.Time) {
	// One call (or none, when the deny cache decided) runs inline: a
	// WaitGroup here would cost an allocation and a goroutine for nothing.
	if len(calls) <= 1 || !e.o.Parallel {
		for i := range calls {
			e.take(ctx, &hits[calls[i].hit], &calls[i], now)
		}
		return
	}
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { e.take(ctx, &hits[calls[i].hit], &calls[i], now) })
	}
	wg.Wait()
}

// take makes one store call, falls back when the store is unavailable, and
// maintains the deny cache.
func (e *Engine) take(ctx context.Context, h *Hit, c *call, now time.Time) {
	if c.failed {
		c.err = errSharedFailure
		e.fallBack(ctx, h, c)
		return
	}
	if c.lease.entry != nil || h.Rule.split != nil {
		e.takeSpread(ctx, h, c, now)
		return
	}
	d, shard, err := e.o.Store.Take(ctx, limiter.Request{Key: h.Key, Limit: h.Rule.Limit, Cost: c.cost, Deadline: c.deadline})
	answered := e.o.Now()
	sm := e.all
	if shard != "" {
		sm = e.shardMetrics(shard)
	}
	// The store latency counts from the decision's start, which is at most
	// a deny-cache lookup earlier than the call.
	sm.obs.Observe(answered.Sub(now).Seconds())
	if err == nil {
		sm.ok.Inc()
		e.markShard(sm, false, answered)
		c.res = Result{Decision: d, Source: FromStore, Taken: d.Allowed && c.cost > 0}
		if h.Rule.Delays() {
			if !d.Allowed && d.RetryAfter > 0 {
				// Nothing of this cost is let in within maxDelay before
				// then: later requests are denied locally until it.
				e.deny.put(h.Key, answered, d.RetryAfter, max(c.cost, 1), d.Limit)
			}
			return
		}
		// The store decided at some instant between the call and its
		// answer. Holds count from the answer, the later bound, so a
		// probe never goes out before the store could admit it.
		e.remember(h, c, d, answered)
		return
	}
	e.storeFailed(ctx, h, c, sm, err, now, answered)
}

// remember updates the deny cache with a store decision. A peek's (cost
// 0) is a cost of 1's: a denied peek holds the key for every cost, and an
// allowed one left at least one unit.
func (e *Engine) remember(h *Hit, c *call, d limiter.Decision, now time.Time) {
	hold, cost := d.RetryAfter, max(c.cost, 1)
	if d.Allowed {
		hold, cost = h.Rule.params.EmptyFor(d), 1
	}
	switch {
	case c.entry != nil:
		e.deny.settle(h.Key, c.entry, now, answer{allowed: d.Allowed, remaining: d.Remaining, hold: hold,
			interval: h.Rule.interval, cost: cost, limit: d.Limit})
		c.entry = nil
	case hold > 0:
		e.deny.put(h.Key, now, hold, cost, d.Limit)
	}
}
