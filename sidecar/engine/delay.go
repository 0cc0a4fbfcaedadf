package engine

import (
	"context"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// A delaying rule (Limit.MaxDelay, a rule's onExceed: Delay) decides each
// request with one store call that reserves the request's slot, its GCRA
// theoretical arrival time, and answers the wait (limiter.Decision.Wait;
// ALGORITHMS.md section 11). It takes no lease, no sub-counter and no
// deny-cache entry: a local answer could not queue behind the other
// replicas' reservations. Its fallback, while the store is unreachable,
// never delays.
//
// Decide leaves the wait in Verdict.Wait; the front then calls Await,
// which holds the request on a runtime timer, not in a loop, until its
// slot comes, bounded per rule, and gives the slots back when the request
// does not go on.

// AwaitOutcome is how Await ended.
type AwaitOutcome uint8

// The outcomes of Await.
const (
	// Released: the slot came; the request goes on.
	Released AwaitOutcome = iota
	// Abandoned: ctx ended first (the client went away); the reserved
	// slots were given back.
	Abandoned
	// Overflow: a rule already had maxWaiting requests waiting; the
	// reserved slots were given back and the request is refused.
	Overflow
)

// Await holds an allowed request whose verdict has a Wait until its
// reserved slots come, counting it as waiting under each delaying rule
// that made it wait. A rule with maxWaiting requests waiting already
// refuses it (Overflow; maxWaiting 0 means no bound). When ctx ends first,
// or sleep reports the client gone, the request is Abandoned. Either way
// its reserved slots are given back (the reservation's cost returned to
// the store, as a lease's unused tokens are). The wait counts from the
// call, which follows Decide: a slot is never released early.
//
// sleep, when not nil, does the waiting: it returns after d, or early and
// false when the client goes away (a front that can watch its client
// while it waits, such as the lean core's read deadline, which costs no
// goroutine of its own). nil waits on a runtime timer and ctx.
func (e *Engine) Await(ctx context.Context, hits []Hit, v *Verdict, maxWaiting int64, sleep func(context.Context, time.Duration) bool) AwaitOutcome {
	if v.Wait <= 0 || v.Outcome != Allow {
		return Released
	}
	var waiting [8]*Rule
	held := waiting[:0]
	over := false
	for i := range v.Results {
		r := hits[i].Rule
		if v.Results[i].Wait <= 0 || r.Shadow || r.dm == nil {
			continue
		}
		if n := r.Waiting.Add(1); maxWaiting > 0 && n > maxWaiting {
			over = true
		}
		r.dm.Waiting.Inc()
		held = append(held, r)
	}
	defer func() {
		for _, r := range held {
			r.Waiting.Add(-1)
			r.dm.Waiting.Dec()
		}
	}()
	if over {
		for _, r := range held {
			r.dm.Overflow.Inc()
		}
		e.returnDelayed(ctx, hits, v)
		return Overflow
	}
	if wait := v.Wait; wait > 0 {
		if sleep == nil || e.o.After != nil {
			sleep = e.sleep
		}
		if !sleep(ctx, wait) {
			for _, r := range held {
				r.dm.Abandoned.Inc()
			}
			e.returnDelayed(ctx, hits, v)
			return Abandoned
		}
	}
	for _, r := range held {
		r.dm.Released.Inc()
		r.dm.Seconds.Observe(v.Wait.Seconds())
	}
	return Released
}

// returnDelayed gives back what the delaying hits of v took on the store:
// for a request another rule refused, or one that will not go on. It
// returns each hit's cost as a lease's unused tokens (ALGORITHMS.md
// section 9), under the rule's limit without MaxDelay (the same scale),
// and clears the hit's Wait and Taken.
func (e *Engine) returnDelayed(ctx context.Context, hits []Hit, v *Verdict) {
	leaser, ok := e.o.Store.(limiter.Leaser)
	for i := range v.Results {
		res := &v.Results[i]
		r := hits[i].Rule
		if !r.Delays() || !res.Taken || res.Source != FromStore {
			continue
		}
		res.Taken, res.Wait = false, 0
		if !ok || hits[i].Cost <= 0 {
			continue
		}
		lim := r.Limit
		lim.MaxDelay = 0
		// The request's own context may have ended (its client left):
		// the return is bounded as a lease's return outside a request.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), returnTimeout)
		_, _, err := leaser.Lease(cctx, limiter.LeaseRequest{Key: hits[i].Key, Limit: lim,
			LeaseArgs: limiter.LeaseArgs{Return: hits[i].Cost}})
		cancel()
		if err != nil && e.o.Log != nil {
			e.o.Log.Warn("a delayed request's slot could not be given back; it stays reserved until it passes",
				"policy", r.Policy, "rule", r.Name, "error", err.Error())
		}
	}
	v.Wait = 0
}

// sleep waits d on Options.After's clock, or Sleep's.
func (e *Engine) sleep(ctx context.Context, d time.Duration) bool {
	if e.o.After == nil {
		return Sleep(ctx, d)
	}
	select {
	case <-e.o.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}

// Sleep waits d on a runtime timer, or until ctx ends, which it reports
// false: Await's wait when the front does not watch its client itself.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// RefuseDelayed makes an allowed verdict with a Wait a Deny, for a caller
// that can only answer yes or no (Envoy's rate-limit API: the gateway
// cannot be told to hold the request): the slots its delaying rules
// reserved are given back, and RetryAfter, on the verdict and on the
// binding result, is the wait the request would have had.
func (e *Engine) RefuseDelayed(ctx context.Context, hits []Hit, v *Verdict) {
	if v.Outcome != Allow || v.Wait <= 0 {
		return
	}
	wait := v.Wait
	e.returnDelayed(ctx, hits, v)
	v.Outcome, v.RetryAfter = Deny, wait
	if v.Binding >= 0 {
		v.Results[v.Binding].RetryAfter = wait
	}
}
