package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// denyCache remembers keys that the store has denied, or that an allowed
// decision left empty, until the store could next admit a request on them.
// While an entry is current, requests on its key are denied locally; a hot
// abusive key then costs the store nothing.
//
// An entry outlives its deny: it then gates the store calls on its key.
// The store's last answer says how much the key had left (permits); up to
// that many requests go to the store at once, and when none is left, one
// request (the probe) goes while the others wait for its answer instead of
// all reaching the store together. A key that was never exhausted has no
// entry and is never gated.
//
// The cache is bounded: each of its shards holds at most max/len(shards)
// keys and evicts expired, then arbitrary, idle entries to make room. All
// methods are safe for concurrent use.
type denyCache struct {
	shards [64]denyShard
	perMax int
}

type denyShard struct {
	mu sync.Mutex
	m  map[string]*denyEntry
}

type denyEntry struct {
	until int64 // unix nanoseconds; deny locally before it
	cost  int64 // the entry applies to requests costing at least this (>= 1)
	limit int64 // the key's capacity, for the response headers
	// streak counts the store's consecutive denials of this key to this
	// sidecar, which lengthen the local deny (see backoff).
	streak uint8
	// permits is what the store last said the key had left, less what
	// calls sent since then may spend.
	permits int64
	// inflight counts the store calls sent through this entry and not yet
	// answered; round, non-nil while inflight > 0, is what the requests
	// waiting on them wait for: the next answer.
	inflight int32
	round    *round
}

// round is one wait for the next answer on an entry: done is closed when it
// comes, and failed then says whether the call failed. The waiters of a
// failed call share its outcome (the store is unavailable) instead of
// sending calls of their own one after the other, each waiting its own
// deadline on a stalled shard.
type round struct {
	done   chan struct{}
	failed bool // set before done is closed
}

func newDenyCache(maxKeys int) *denyCache {
	c := &denyCache{perMax: max(1, maxKeys/64)}
	for i := range c.shards {
		c.shards[i].m = map[string]*denyEntry{}
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[xxhash.Sum64String(key)%uint64(len(c.shards))]
}

type lookupKind uint8

const (
	lookupMiss lookupKind = iota // no entry: ask the store
	lookupDeny                   // deny locally
	lookupGo                     // ask the store, then settle the entry
	lookupWait                   // wait on round, then look up again
	// lookupFailed: the call this request waited for failed; decide by
	// the rule's failure mode without a store call.
	lookupFailed
)

type lookup struct {
	kind  lookupKind
	retry time.Duration
	limit int64
	entry *denyEntry
	round *round
}

// lookup decides what a request of cost on key does with the cache. A
// peek (cost 0) is decided as a cost of 1, as the store decides it: it is
// denied while a key is held, and waits for a probe as a cost of 1 does,
// but it takes no permit, since it spends nothing.
func (c *denyCache) lookup(key string, cost int64, now time.Time) lookup {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	need := max(cost, 1)
	if e == nil || need < e.cost {
		return lookup{kind: lookupMiss}
	}
	n := now.UnixNano()
	if n < e.until {
		return lookup{kind: lookupDeny, retry: time.Duration(e.until - n), limit: e.limit}
	}
	switch {
	case e.permits >= need:
		e.permits -= cost
	case e.inflight > 0:
		return lookup{kind: lookupWait, round: e.round}
	}
	e.inflight++
	if e.round == nil {
		e.round = &round{done: make(chan struct{})}
	}
	return lookup{kind: lookupGo, entry: e}
}

// held is lookup without claims: lookupDeny while key is held for a
// request of cost at now, else lookupMiss. A delaying rule uses the cache
// so, remembering only its denials: a local answer could not reserve a
// slot.
func (c *denyCache) held(key string, cost int64, now time.Time) lookup {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	if e == nil || max(cost, 1) < e.cost {
		return lookup{kind: lookupMiss}
	}
	if n := now.UnixNano(); n < e.until {
		return lookup{kind: lookupDeny, retry: time.Duration(e.until - n), limit: e.limit}
	}
	return lookup{kind: lookupMiss}
}

// errBudgetSpent ends a wait that reached the decision's deadline.
var errBudgetSpent = errors.New("the request's store budget is spent")

// wait blocks until a call in flight is answered, ctx ends or the deadline
// (unless zero) passes, which it reports as errBudgetSpent. It reports
// whether the answer was a failure.
func (c *denyCache) wait(ctx context.Context, r *round, deadline time.Time) (failed bool, err error) {
	var expired <-chan time.Time
	if !deadline.IsZero() {
		// A timer of the waiter's own, rather than the call's: it wakes
		// this goroutine at its deadline directly, however late the
		// machine runs the goroutines that end the call.
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-r.done:
		return r.failed, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-expired:
		return false, errBudgetSpent
	}
}

// MaxDenyBackoff bounds how far repeated store denials stretch a key's
// local deny beyond the store's RetryAfter.
const MaxDenyBackoff = time.Second

// backoff returns how long to deny a key locally after a probe of this
// sidecar was denied with retry, the streak-th such denial in a row; interval
// is the rule's refill spacing (period / requests).
//
// When several replicas flood one key, each refilled token goes to the
// replica whose probe arrives first, and every other probe costs a store
// call for nothing. A replica that wins keeps probing at the exact refill
// instants (limiter.Params.EmptyFor). A replica that loses skips to the middle of a
// later refill interval, (2^(streak-1) - 1/2) intervals after the next
// refill: its probes fall where the winner has already taken the token, so
// it rarely races the winner again, and the doubling brings it down to
// about one probe per MaxDenyBackoff. The cost is fairness between replicas
// on a key that is over its limit anyway, never admission beyond the limit.
func backoff(retry, interval time.Duration, streak uint8) time.Duration {
	if streak == 0 || retry >= MaxDenyBackoff {
		return retry
	}
	d := retry + interval<<min(2*(streak-1), 30) - interval/2
	return max(retry, min(d, MaxDenyBackoff))
}

// put records the answer to a call that was not gated by an entry: nothing
// costing cost or more is admitted until now+hold. Such calls run
// concurrently, so their denials do not count towards the backoff streak.
func (c *denyCache) put(key string, now time.Time, hold time.Duration, cost, limit int64) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	if e == nil {
		if len(s.m) >= c.perMax {
			s.evict(time.Now().UnixNano())
		}
		e = &denyEntry{}
		s.m[key] = e
	}
	e.record(now, hold, false, 0, cost, limit)
}

// record holds the key for hold, stretched by backoff when a gated call was
// denied (denied), over the rule's refill interval.
func (e *denyEntry) record(now time.Time, hold time.Duration, denied bool, interval time.Duration, cost, limit int64) {
	if denied {
		if e.streak < 255 {
			e.streak++
		}
		hold = backoff(hold, interval, e.streak)
	}
	if u := now.Add(hold).UnixNano(); u > e.until || cost < e.cost {
		e.until = u
	}
	e.cost, e.limit, e.permits = cost, limit, 0
}

// answer is a store answer settled on an entry.
type answer struct {
	failed    bool
	allowed   bool
	remaining int64
	hold      time.Duration // deny or exhaustion hold; 0 when the key has room
	interval  time.Duration // the rule's refill spacing, for backoff
	cost      int64
	limit     int64
}

// settle records the answer to a call sent through entry e and wakes the
// requests waiting on it.
func (c *denyCache) settle(key string, e *denyEntry, now time.Time, a answer) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e.inflight--
	switch {
	case a.failed:
		e.permits = 0
		if e.round != nil {
			e.round.failed = true
		}
	case a.hold > 0:
		if a.allowed {
			// A win halves the streak rather than clearing it, so a
			// replica that has mostly lost the key's tokens goes on
			// probing rarely after an occasional win.
			e.streak /= 2
		}
		e.record(now, a.hold, !a.allowed, a.interval, a.cost, a.limit)
	default:
		// The key has room: let that much through at once, less what
		// the calls still in flight may take.
		e.streak /= 2
		e.permits = max(0, a.remaining-int64(e.inflight))
	}
	e.wake()
}

// release returns the claim of a call that was not sent.
func (c *denyCache) release(key string, e *denyEntry) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e.inflight--
	e.wake()
}

// wake ends the waiters' round and, while calls remain in flight, opens a
// new one for the next answer. The caller holds the shard's lock.
func (e *denyEntry) wake() {
	if e.round != nil {
		close(e.round.done)
		e.round = nil
	}
	if e.inflight > 0 {
		e.round = &round{done: make(chan struct{})}
	}
}

// evict frees room in a full shard: every expired entry without calls in
// flight, or else one arbitrary such entry. The caller holds s.mu.
func (s *denyShard) evict(now int64) {
	freed := false
	for k, e := range s.m {
		if e.inflight == 0 && e.until <= now {
			delete(s.m, k)
			freed = true
		}
	}
	if freed {
		return
	}
	for k, e := range s.m {
		if e.inflight == 0 {
			delete(s.m, k)
			return
		}
	}
}

// clear drops every entry, as after a config change that may have raised
// limits. Calls in flight settle on their detached entries.
func (c *denyCache) clear() {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.m = map[string]*denyEntry{}
		s.mu.Unlock()
	}
}

func (c *denyCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
