package engine

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// Concurrency rules
//
// A concurrency rule caps the requests of a key in flight at once. The
// engine takes one slot per matching rule when a request is admitted
// (Acquire) and gives them back when the request ends (Slots.Release). Each
// slot is a lease in the counter store (limiter.SlotStore, which Options.Store
// implements): a lease that is not released expires after the rule's
// LeaseTTL, so the slots of a sidecar that crashed come back; a request that
// lasts longer (a stream, a WebSocket) has its leases renewed every third
// of their TTL.
//
// A request that finds a rule's slots all taken is denied (Deny) and holds
// nothing: the slots it took on other rules are released at once. Releasing
// is exact, unlike spending tokens, so a multi-rule decision has no race
// window that over-charges. When the store is unavailable a rule that
// fails closed makes the request Unavailable, and any other takes a slot of
// its local share (Max / replicas, at least 1) from Options.Fallback: while
// the store is down each replica holds at most its share. A lease taken on
// the fallback is released there.

// ConcurrencyRetryAfter is the Retry-After of a request denied by a
// concurrency rule: a slot may come back at any moment, so the client is
// told to try again soon.
const ConcurrencyRetryAfter = time.Second

// renewTimeout bounds one renewal of a lease.
const renewTimeout = 2 * time.Second

// ConcurrencyRule is a rule that caps a key's requests in flight. It is
// immutable once built.
type ConcurrencyRule struct {
	// Policy and Name identify the rule.
	Policy, Name string
	// Max is the shared cap on a key's requests in flight.
	Max int64
	// Fallback is the local cap while the store is unavailable: Max
	// divided by the replica count, at least 1.
	Fallback int64
	// LeaseTTL is how long a lease outlives its last renewal.
	LeaseTTL time.Duration
	// FailClosed makes the request Unavailable while the store is.
	FailClosed bool
	// Shadow rules take and report slots but never deny.
	Shadow bool

	m        *metrics.Rule
	inFlight prometheus.Gauge
	renewals [3]prometheus.Counter // renewed, lost, error
}

// NewConcurrencyRule validates a concurrency rule and derives its fallback
// share for the given replica count (values below 1 count as 1).
func NewConcurrencyRule(policy, name string, maxN int64, ttl time.Duration, replicas int32, failClosed, shadow bool, m *metrics.Metrics) (*ConcurrencyRule, error) {
	if m == nil {
		return nil, errors.New("engine: nil metrics")
	}
	probe := limiter.SlotRequest{Key: "k", Lease: 1, Max: maxN, TTL: ttl}
	if err := probe.Check(); err != nil {
		return nil, err
	}
	fb := maxN
	if replicas > 1 {
		fb = max(1, maxN/int64(replicas))
	}
	r := &ConcurrencyRule{Policy: policy, Name: name, Max: maxN, Fallback: fb, LeaseTTL: ttl,
		FailClosed: failClosed, Shadow: shadow, m: m.ForRule(policy, name),
		inFlight: m.ConcurrencyInFlight.WithLabelValues(policy, name)}
	for i, res := range [...]string{metrics.RenewalRenewed, metrics.RenewalLost, metrics.RenewalError} {
		r.renewals[i] = m.LeaseRenewalsTotal.WithLabelValues(policy, name, res)
	}
	return r, nil
}

// SlotHit is a concurrency rule that matched a request, with the request's
// key under it.
type SlotHit struct {
	Rule *ConcurrencyRule
	Key  string
}

// SlotResult is the answer on one SlotHit.
type SlotResult struct {
	limiter.SlotDecision
	// Source is where the answer came from: FromStore, FromFallback,
	// FromNowhere (the store is unavailable and the rule fails closed),
	// or NotEvaluated (the request was decided before this hit).
	Source Source
}

// SlotVerdict is the decision on a request's concurrency rules and the
// slots it holds. Reuse one per connection or request; Acquire resets it.
type SlotVerdict struct {
	// Outcome is Allow, Deny (an enforced rule's slots are all taken) or
	// Unavailable (a fail-closed rule cannot reach the store).
	Outcome Outcome
	// Results has one entry per hit.
	Results []SlotResult
	// Binding is the index of the hit that denied or was unavailable, or
	// -1.
	Binding int
	// RetryAfter is the wait to report when the outcome is not Allow.
	RetryAfter time.Duration
	// Held are the slots the request holds when the outcome is Allow;
	// release them when the request ends.
	Held Slots
}

// Slots are the leases a request holds. Release them exactly once, from
// any goroutine; the zero value holds nothing.
type Slots struct {
	leases []*lease
}

// Len returns the number of leases held.
func (s *Slots) Len() int { return len(s.leases) }

// lease is one slot a request holds, with its renewal timer.
type lease struct {
	e     *Engine
	rule  *ConcurrencyRule
	req   limiter.SlotRequest
	store limiter.SlotStore
	// mu serialises a renewal with the release: a renewal never runs
	// after the release, which could take the slot again.
	mu       sync.Mutex
	released bool
	timer    *time.Timer
}

// leaseSeq numbers leases; it starts at a random point, so that the ids of
// two sidecars' leases on one key do not meet.
var leaseSeq atomic.Uint64

func init() {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	leaseSeq.Store(binary.LittleEndian.Uint64(b[:]))
}

// nextLease returns a lease id between 1 and 2^63-1.
func nextLease() uint64 {
	for {
		if id := leaseSeq.Add(1) & (1<<63 - 1); id != 0 {
			return id
		}
	}
}

// slotStores returns the stores of concurrency slots: the counter store and
// the fallback store, each nil when it does not keep slots.
func (e *Engine) slotStores() (main, fallback limiter.SlotStore) {
	main, _ = e.o.Store.(limiter.SlotStore)
	fallback, _ = e.o.Fallback.(limiter.SlotStore)
	return main, fallback
}

// errNoSlots is the error of a counter store that keeps no slots.
var errNoSlots = fmt.Errorf("the counter store keeps no concurrency slots: %w", limiter.ErrUnavailable)

// Acquire takes a slot of every hit for a request, into v. When an
// enforced hit is denied or unavailable, v holds nothing: the slots taken
// on the other hits are released. ctx bounds the store calls.
func (e *Engine) Acquire(ctx context.Context, hits []SlotHit, v *SlotVerdict) {
	v.Outcome, v.Binding, v.RetryAfter = Allow, -1, 0
	v.Held.leases = v.Held.leases[:0]
	if cap(v.Results) < len(hits) {
		v.Results = make([]SlotResult, len(hits))
	}
	v.Results = v.Results[:len(hits)]
	clear(v.Results)
	main, fallback := e.slotStores()
	for i := range hits {
		h := &hits[i]
		r := h.Rule
		req := limiter.SlotRequest{Key: h.Key, Lease: nextLease(), Max: r.Max, TTL: r.LeaseTTL}
		res, store := e.acquireOne(ctx, main, fallback, r, req)
		v.Results[i] = res
		switch {
		case res.Source == FromNowhere:
			r.m.Unavailable.Inc()
			if r.Shadow {
				continue
			}
			v.Outcome, v.Binding, v.RetryAfter = Unavailable, i, UnavailableRetryAfter
		case res.Acquired:
			r.m.Allowed.Inc()
			v.Held.leases = append(v.Held.leases, e.hold(r, req, store))
			continue
		case r.Shadow:
			r.m.ShadowDenied.Inc()
			continue
		default:
			r.m.Denied.Inc()
			v.Outcome, v.Binding, v.RetryAfter = Deny, i, ConcurrencyRetryAfter
		}
		// Denied or unavailable: hold nothing.
		v.Held.Release()
		return
	}
}

// acquireOne takes one slot from the counter store, or from the fallback
// when the store is unavailable, and returns the answer and the store that
// holds the lease.
func (e *Engine) acquireOne(ctx context.Context, main, fallback limiter.SlotStore, r *ConcurrencyRule, req limiter.SlotRequest) (SlotResult, limiter.SlotStore) {
	start := e.o.Now()
	var d limiter.SlotDecision
	var shard string
	err := errNoSlots
	if main != nil {
		d, shard, err = main.Acquire(ctx, req)
	}
	answered := e.o.Now()
	sm := e.all
	if shard != "" {
		sm = e.shardMetrics(shard)
	}
	sm.obs.Observe(answered.Sub(start).Seconds())
	if err == nil {
		sm.ok.Inc()
		e.markShard(sm, false, answered)
		return SlotResult{SlotDecision: d, Source: FromStore}, main
	}
	e.countStoreFailure(sm, err, answered)
	if r.FailClosed {
		return SlotResult{SlotDecision: limiter.SlotDecision{Max: r.Max}, Source: FromNowhere}, nil
	}
	// The local share: while the store is down, this replica holds at
	// most Max / replicas of the key's slots.
	req.Max = r.Fallback
	if fallback == nil {
		return SlotResult{SlotDecision: limiter.SlotDecision{Max: r.Fallback}, Source: FromNowhere}, nil
	}
	d, _, err = fallback.Acquire(ctx, req)
	if err != nil {
		// The local store failing is a bug; admit rather than block on
		// it, holding nothing.
		return SlotResult{SlotDecision: limiter.SlotDecision{Max: r.Fallback}, Source: FromFallback}, nil
	}
	if d.Acquired {
		r.m.FallbackAllowed.Inc()
	} else {
		r.m.FallbackDenied.Inc()
	}
	return SlotResult{SlotDecision: d, Source: FromFallback}, fallback
}

// hold records a lease taken from store and arms its renewal. A nil store
// (a fallback that failed) holds nothing to release.
func (e *Engine) hold(r *ConcurrencyRule, req limiter.SlotRequest, store limiter.SlotStore) *lease {
	l := &lease{e: e, rule: r, req: req, store: store}
	r.inFlight.Inc()
	if store != nil {
		// The renewal takes l.mu first, so it sees the timer set.
		l.mu.Lock()
		l.timer = time.AfterFunc(renewEvery(req.TTL), l.renew)
		l.mu.Unlock()
	}
	return l
}

// renewEvery is how often a held lease is renewed: a third of its TTL, so
// that a renewal that fails once still leaves another chance.
func renewEvery(ttl time.Duration) time.Duration { return ttl / 3 }

// renew extends the lease, and arms the next renewal unless the request
// has ended.
func (l *lease) renew() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), renewTimeout)
	held, _, err := l.store.Renew(ctx, l.req)
	cancel()
	switch {
	case err != nil:
		l.rule.renewals[2].Inc()
	case held:
		l.rule.renewals[0].Inc()
	default:
		// The lease expired (the store was unreachable for a whole TTL)
		// and its slot went to another request. The request goes on;
		// later renewals take the slot again when there is room.
		l.rule.renewals[1].Inc()
	}
	l.timer.Reset(renewEvery(l.req.TTL))
}

// release gives the lease back once.
func (l *lease) release() {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return
	}
	l.released = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	l.rule.inFlight.Dec()
	if l.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), renewTimeout)
	// A release that fails leaves the lease to expire by its TTL.
	_, _ = l.store.Release(ctx, l.req)
	cancel()
}

// Release gives every slot back and empties s. Releases to a remote store
// (Options.Parallel) go out in the background, so the request's end waits
// for none of them; a release that fails leaves the lease to expire by its
// TTL.
func (s *Slots) Release() {
	if len(s.leases) == 0 {
		return
	}
	if s.leases[0].e.o.Parallel {
		leases := append([]*lease(nil), s.leases...)
		go func() {
			for _, l := range leases {
				l.release()
			}
		}()
	} else {
		for _, l := range s.leases {
			l.release()
		}
	}
	clear(s.leases)
	s.leases = s.leases[:0]
}
