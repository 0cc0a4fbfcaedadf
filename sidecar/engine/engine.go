// Package engine is floodgate-sidecar's decision engine. It is transport
// neutral: a front end (the HTTP proxy, later an Envoy rate-limit service)
// matches a request to rules and computes their counter keys, and the engine
// decides the resulting hits against the counter store.
//
// # Semantics
//
// Every hit is checked and the tightest wins: if any enforced rule denies,
// the request is denied. A rule that denies takes no tokens. Shadow rules
// are counted and reported as if each were the only rule, but never change
// the outcome. The headers describe one hit, the binding one: the denying
// rule with the longest wait, or else the enforced rule with least
// remaining.
//
// # Multi-rule atomicity
//
// The Store interface is one key per call, and keys of different rules may
// live on different Redis shards, so a decision over several rules cannot be
// one atomic script. With one enforced hit (the common case) the engine
// makes exactly one Take. With several it first peeks every rule (a Take of
// cost 0, which never writes), denies without taking anything if a peek
// shows a rule short, and otherwise takes every rule. Between the peeks and
// the takes other requests (from this or other replicas) may spend the same
// counters; if one of the takes is then denied, the takes that succeeded
// have been charged for a request that is denied. That race window is the
// length of one store round trip, and it can only over-charge (never
// over-admit) by at most one request's cost per rule per raced request. A
// single-rule decision has no such window.
//
// # Local deny cache
//
// A key the store has denied is denied locally until its RetryAfter, and a
// key that an allowed decision left empty is denied locally until the
// earliest instant it could admit again (exact for TokenBucket, GCRA and
// FixedWindow; the other algorithms are only cached after a deny). When the
// entry expires it keeps gating the key: as many requests go to the store
// at once as the store last said the key had left, and when that is none,
// one probe goes while the others wait for its answer, so a burst of
// concurrent requests on an exhausted key cannot all reach the store. When several replicas share a flooded key, their
// probes race for each token and the losers are denied; a replica's
// consecutive denials double its local hold up to MaxDenyBackoff, so a
// losing replica probes about once a second while the winners keep spending
// the key's full limit. A hot key flooded far beyond its limit therefore
// costs the store about one call per admitted request plus one probe per
// replica per second.
//
// # Failure modes
//
// When the store is unavailable (its error wraps limiter.ErrUnavailable, as
// it does when the Redis breaker is open), a rule with FailClosed makes the
// outcome Unavailable (the HTTP front answers 503), and any other rule is
// decided on a local fallback bucket of limit/replicas.
//
// An Engine is safe for concurrent use.
package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// Rule is one rule as the engine applies it. It is immutable once built.
type Rule struct {
	// Policy and Name identify the rule in metrics, events and headers.
	Policy, Name string
	// Limit is the shared limit.
	Limit limiter.Limit
	// Fallback is the local limit used while the store is unavailable:
	// Limit with Requests and Burst divided by the replica count.
	Fallback limiter.Limit
	// FailClosed makes the request Unavailable, instead of using Fallback,
	// while the store is unavailable.
	FailClosed bool
	// Shadow rules are counted and reported but never deny.
	Shadow bool

	params   *limiter.Params
	interval time.Duration // Period / Requests: the refill spacing
	m        *metrics.Rule
}

// NewRule validates a rule's limit and derives its fallback limit for the
// given replica count (values below 1 count as 1).
func NewRule(policy, name string, lim limiter.Limit, replicas int32, failClosed, shadow bool, m *metrics.Metrics) (*Rule, error) {
	p, err := limiter.NewParams(lim)
	if err != nil {
		return nil, err
	}
	fb := lim
	if replicas > 1 {
		fb.Requests = max(1, lim.Requests/int64(replicas))
		if lim.Burst > 0 {
			fb.Burst = max(1, lim.Burst/int64(replicas))
		}
		if err := fb.Validate(); err != nil {
			return nil, fmt.Errorf("fallback limit %v for %d replicas: %w", fb, replicas, err)
		}
	}
	if m == nil {
		return nil, errors.New("engine: nil metrics")
	}
	return &Rule{Policy: policy, Name: name, Limit: lim, Fallback: fb, FailClosed: failClosed, Shadow: shadow,
		params: p, interval: lim.Period / time.Duration(lim.Requests), m: m.ForRule(policy, name)}, nil
}

// Hit is a rule that matched a request, with the request's counter key and
// cost under that rule.
type Hit struct {
	Rule *Rule
	Key  string
	Cost int64
}

// Outcome is a request's verdict.
type Outcome uint8

// Outcomes.
const (
	Allow Outcome = iota
	Deny
	// Unavailable means a fail-closed rule could not reach the store.
	Unavailable
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	case Unavailable:
		return "unavailable"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Source says where a hit's decision came from.
type Source uint8

// Sources.
const (
	// NotEvaluated: the request was decided before this hit was checked.
	NotEvaluated Source = iota
	// FromStore: the counter store decided.
	FromStore
	// FromDenyCache: the local deny cache denied without a store call.
	FromDenyCache
	// FromFallback: the local fallback bucket decided (store unavailable).
	FromFallback
	// FromNowhere: the store was unavailable and the rule fails closed.
	FromNowhere
)

// String returns the source's name, as deny events report it.
func (s Source) String() string {
	return [...]string{"none", "store", "local", "fallback", "unavailable"}[s]
}

// Result is the decision on one hit.
type Result struct {
	limiter.Decision
	Source Source
	// Taken reports that the hit's cost was spent.
	Taken bool
}

// Verdict is the decision on a request.
type Verdict struct {
	Outcome Outcome
	// Results has one entry per hit, in the order of the hits.
	Results []Result
	// Binding is the index of the hit the response headers describe, or -1
	// when no enforced hit was evaluated.
	Binding int
	// RetryAfter is how long the client should wait when the outcome is
	// not Allow.
	RetryAfter time.Duration

	scratch []call // reused store calls
}

func (v *Verdict) reset(n int) {
	v.Outcome, v.Binding, v.RetryAfter = Allow, -1, 0
	if cap(v.Results) < n {
		v.Results = make([]Result, n)
	}
	v.Results = v.Results[:n]
	clear(v.Results)
}

// UnavailableRetryAfter is the Retry-After given when a fail-closed rule
// cannot reach the store.
const UnavailableRetryAfter = time.Second

// Options configure an Engine.
type Options struct {
	// Store holds the shared counters. Required.
	Store limiter.Store
	// StoreName labels store metrics ("memory", "redis").
	StoreName string
	// Fallback holds the local fallback buckets. Required.
	Fallback limiter.Store
	// Metrics receives the engine's metrics. Required.
	Metrics *metrics.Metrics
	// DenyCacheKeys bounds the local deny cache; default 100000.
	DenyCacheKeys int
	// Parallel issues a decision's store calls concurrently, which pays
	// off for a remote store.
	Parallel bool
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Engine decides hits. See the package documentation.
type Engine struct {
	o        Options
	deny     *denyCache
	fallback atomic.Bool // some shard's last call found it unavailable
	// downShards counts the shards whose last call failed; fallbackMu
	// serialises its changes with the gauge's.
	downShards int
	fallbackMu sync.Mutex
	nextExpiry atomic.Int64  // Unix nanoseconds of the next expireShards
	all        *shardMetrics // store metrics of an unsharded store
	// shardObs maps a shard to its store metrics. It is copied on write:
	// the shards are few (the store's masters) and read on every store
	// call, where a plain map read costs less than a sync.Map's.
	shardObs atomic.Pointer[map[string]*shardMetrics]
	shardMu  sync.Mutex // serialises the writes of shardObs
}

type shardMetrics struct {
	obs             prometheus.Observer
	ok, unav, error prometheus.Counter
	// down is set while the shard's last call failed; lastFail is when
	// (Unix nanoseconds).
	down     atomic.Bool
	lastFail atomic.Int64
}

// fallbackHold is how long a shard whose last call failed counts as down
// when no call to it succeeds. Its own failed calls renew it; a shard that
// gets no more calls, such as a failed master whose keys a promoted replica
// now serves under another address, stops counting after it.
const fallbackHold = 5 * time.Second

// New returns an engine.
func New(o Options) (*Engine, error) {
	if o.Store == nil || o.Fallback == nil || o.Metrics == nil {
		return nil, errors.New("engine: Store, Fallback and Metrics are required")
	}
	if o.StoreName == "" {
		o.StoreName = "store"
	}
	if o.DenyCacheKeys <= 0 {
		o.DenyCacheKeys = 100000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	e := &Engine{o: o, deny: newDenyCache(o.DenyCacheKeys)}
	e.all = e.shardMetrics("all")
	o.Metrics.SetDenyCacheSize(func() float64 { return float64(e.deny.len()) })
	return e, nil
}

func (e *Engine) shardMetrics(shard string) *shardMetrics {
	if m := e.shardObs.Load(); m != nil {
		if sm, ok := (*m)[shard]; ok {
			return sm
		}
	}
	e.shardMu.Lock()
	defer e.shardMu.Unlock()
	var old map[string]*shardMetrics
	if m := e.shardObs.Load(); m != nil {
		old = *m
	}
	if sm, ok := old[shard]; ok {
		return sm
	}
	m := e.o.Metrics
	sm := &shardMetrics{
		obs:   m.StoreOpDuration.WithLabelValues(e.o.StoreName, shard),
		ok:    m.StoreOpsTotal.WithLabelValues(e.o.StoreName, shard, "ok"),
		unav:  m.StoreOpsTotal.WithLabelValues(e.o.StoreName, shard, "unavailable"),
		error: m.StoreOpsTotal.WithLabelValues(e.o.StoreName, shard, "error"),
	}
	next := make(map[string]*shardMetrics, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[shard] = sm
	e.shardObs.Store(&next)
	return sm
}

// ForgetLocalState drops the local deny cache, as after a config change
// that may have raised a limit. Counters in the stores are kept.
func (e *Engine) ForgetLocalState() { e.deny.clear() }

// FallbackActive reports whether the last call to some shard of the store
// found it unavailable: while one shard of several is down, decisions on
// its keys fall back and the others do not, and this stays true until a
// call to that shard succeeds or, when it gets no more calls, for
// fallbackHold (5s) after its last failure.
func (e *Engine) FallbackActive() bool { return e.fallback.Load() }

// markShard records whether sm's last call, at now, failed, and keeps
// FallbackActive and its gauge true while any shard counts as down. Only a
// change takes the lock; while some shard is down, a successful call also
// expires, at most every fallbackHold/4, the shards that have had no call
// for fallbackHold.
func (e *Engine) markShard(sm *shardMetrics, down bool, now time.Time) {
	if down {
		sm.lastFail.Store(now.UnixNano())
	} else if e.fallback.Load() {
		if next := e.nextExpiry.Load(); now.UnixNano() >= next && e.nextExpiry.CompareAndSwap(next, now.Add(fallbackHold/4).UnixNano()) {
			e.expireShards(now)
		}
	}
	if sm.down.Load() == down {
		return
	}
	e.fallbackMu.Lock()
	defer e.fallbackMu.Unlock()
	e.setDownLocked(sm, down)
}

// setDownLocked changes sm's state and the gauge; e.fallbackMu is held.
func (e *Engine) setDownLocked(sm *shardMetrics, down bool) {
	if sm.down.Load() == down {
		return
	}
	sm.down.Store(down)
	if down {
		e.downShards++
	} else {
		e.downShards--
	}
	active := e.downShards > 0
	e.fallback.Store(active)
	if active {
		e.o.Metrics.FallbackActive.Set(1)
	} else {
		e.o.Metrics.FallbackActive.Set(0)
	}
}

// expireShards stops counting as down the shards whose last failed call is
// older than fallbackHold.
func (e *Engine) expireShards(now time.Time) {
	horizon := now.Add(-fallbackHold).UnixNano()
	e.fallbackMu.Lock()
	defer e.fallbackMu.Unlock()
	expire := func(sm *shardMetrics) {
		if sm.down.Load() && sm.lastFail.Load() < horizon {
			e.setDownLocked(sm, false)
		}
	}
	// e.all is in the map too.
	if m := e.shardObs.Load(); m != nil {
		for _, sm := range *m {
			expire(sm)
		}
	}
}

// call is one store call of a decision.
type call struct {
	hit   int
	cost  int64
	entry *denyEntry // the deny-cache entry the call was claimed on
	res   Result
	err   error
}

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
		// Never wait for another request's probe while holding one: two
		// requests could otherwise wait on each other.
		var l lookup
		l, now = e.check(ctx, h, now, probing)
		probing = probing || l.kind == lookupGo
		if l.kind == lookupDeny {
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
		c := call{hit: i, cost: h.Cost, entry: l.entry}
		if h.Rule.Shadow {
			shadowCalls = append(shadowCalls, c)
		} else {
			calls = append(calls, c)
		}
	}
	if denied {
		// Another enforced rule is already known to deny: take nothing.
		for i := range calls {
			e.abandon(hits[calls[i].hit].Key, calls[i].entry)
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
	e.count(hits, calls, v)
	e.conclude(hits, v)
}

// decideMany decides several enforced hits: peek all, then take all.
func (e *Engine) decideMany(ctx context.Context, hits []Hit, calls, shadowCalls []call, now time.Time, v *Verdict) {
	peeks := make([]call, 0, len(calls)+len(shadowCalls))
	for _, c := range calls {
		peeks = append(peeks, call{hit: c.hit, cost: 0})
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
				e.abandon(hits[calls[j].hit].Key, calls[j].entry)
			}
			v.Results[p.hit] = p.res
			return
		}
		if short < 0 && p.res.Remaining < hits[p.hit].Cost {
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
					e.abandon(hits[calls[j].hit].Key, calls[j].entry)
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
// wait. While other calls on the key
// are in flight and it holds no room, it waits for their answers, unless
// noWait; every call in flight ends within the store's deadline, and each
// answer either denies the key or lets at least one waiter through, so the
// wait is a few store round trips at most. A cancelled request stops
// waiting and is left to the store call, which fails at once.
func (e *Engine) check(ctx context.Context, h *Hit, now time.Time, noWait bool) (lookup, time.Time) {
	for {
		l := e.deny.lookup(h.Key, h.Cost, now)
		if l.kind != lookupWait {
			return l, now
		}
		if noWait || e.deny.wait(ctx, l.ch) != nil {
			return lookup{kind: lookupMiss}, now
		}
		now = e.o.Now()
	}
}

// abandon releases the claim of a call that was not sent.
func (e *Engine) abandon(key string, entry *denyEntry) {
	if entry != nil {
		e.deny.release(key, entry)
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
	r := h.Rule
	d, shard, err := e.o.Store.Take(ctx, limiter.Request{Key: h.Key, Limit: r.Limit, Cost: c.cost})
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
		if c.cost > 0 {
			// The store decided at some instant between the call and its
			// answer. Holds count from the answer, the later bound, so a
			// probe never goes out before the store could admit it.
			e.remember(h, c, d, answered)
		}
		return
	}
	if errors.Is(err, limiter.ErrUnavailable) {
		sm.unav.Inc()
	} else {
		// Any other error also leaves the shared count unknown.
		sm.error.Inc()
	}
	if c.entry != nil {
		e.deny.settle(h.Key, c.entry, now, answer{failed: true})
		c.entry = nil
	}
	e.markShard(sm, true, answered)
	c.err = err
	if r.FailClosed {
		c.res = Result{Decision: limiter.Decision{Limit: r.Limit.Capacity(), RetryAfter: UnavailableRetryAfter}, Source: FromNowhere}
		return
	}
	d, _, ferr := e.o.Fallback.Take(ctx, limiter.Request{Key: h.Key, Limit: r.Fallback, Cost: c.cost})
	if ferr != nil {
		// The local store failing is a bug; admit rather than block on it.
		c.res = Result{Decision: limiter.Decision{Allowed: true, Limit: r.Limit.Capacity()}, Source: FromFallback}
		return
	}
	c.res = Result{Decision: d, Source: FromFallback, Taken: d.Allowed && c.cost > 0}
	if c.cost > 0 {
		if d.Allowed {
			r.m.FallbackAllowed.Inc()
		} else {
			r.m.FallbackDenied.Inc()
		}
	}
}

// remember updates the deny cache with a store decision.
func (e *Engine) remember(h *Hit, c *call, d limiter.Decision, now time.Time) {
	hold, cost := d.RetryAfter, c.cost
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

// count records the decisions of the evaluated calls in metrics.
func (e *Engine) count(hits []Hit, _ []call, v *Verdict) {
	for i, r := range v.Results {
		if r.Source == NotEvaluated || r.Source == FromDenyCache {
			continue
		}
		rm := hits[i].Rule.m
		switch {
		case r.Source == FromNowhere:
			rm.Unavailable.Inc()
		case r.Allowed:
			rm.Allowed.Inc()
		case hits[i].Rule.Shadow:
			rm.ShadowDenied.Inc()
		default:
			rm.Denied.Inc()
		}
	}
}

// conclude sets the outcome and the binding hit from the results.
func (e *Engine) conclude(hits []Hit, v *Verdict) {
	for i, r := range v.Results {
		if hits[i].Rule.Shadow || r.Source == NotEvaluated {
			continue
		}
		switch {
		case r.Source == FromNowhere:
			if v.Outcome != Unavailable {
				v.Outcome, v.Binding, v.RetryAfter = Unavailable, i, r.RetryAfter
			}
		case !r.Allowed:
			if v.Outcome == Allow || (v.Outcome == Deny && r.RetryAfter > v.RetryAfter) {
				v.Outcome, v.Binding, v.RetryAfter = Deny, i, r.RetryAfter
			}
		case v.Outcome == Allow:
			if v.Binding < 0 || tighter(r.Decision, v.Results[v.Binding].Decision) {
				v.Binding = i
			}
		}
	}
}

// tighter reports whether a leaves less room than b.
func tighter(a, b limiter.Decision) bool {
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.Limit < b.Limit
}
