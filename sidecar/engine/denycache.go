package engine

import (
	"context"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// denyCache remembers keys that the store has denied, or that an allowed
// decision left empty, until the store could next admit a request on them.
// While an entry is current, requests on its key are denied locally; a hot
// abusive key then costs the store nothing.
//
// When an entry expires, exactly one request (the probe) goes to the store;
// requests that arrive while the probe is in flight wait for its answer
// instead of all reaching the store at once. Keys that were never exhausted
// have no entry and are never gated.
//
// The cache is bounded: each of its shards holds at most max/len(shards)
// keys and evicts expired, then arbitrary, entries to make room. All
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
	cost  int64 // the entry applies to requests costing at least this
	limit int64 // the key's capacity, for the response headers
	// streak counts the store's consecutive denials of this key to this
	// sidecar, which lengthen the local deny (see backoff).
	streak uint8
	// done is non-nil while a probe is in flight; it is closed when the
	// probe's answer is recorded.
	done chan struct{}
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
	lookupMiss  lookupKind = iota // ask the store
	lookupDeny                    // deny locally
	lookupProbe                   // ask the store, then call resolve
	lookupWait                    // wait on ch, then look up again
)

type lookup struct {
	kind  lookupKind
	retry time.Duration
	limit int64
	entry *denyEntry
	ch    chan struct{}
}

func (c *denyCache) lookup(key string, cost int64, now time.Time) lookup {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	if e == nil || cost < e.cost {
		return lookup{kind: lookupMiss}
	}
	n := now.UnixNano()
	if n < e.until {
		return lookup{kind: lookupDeny, retry: time.Duration(e.until - n), limit: e.limit}
	}
	if e.done != nil {
		return lookup{kind: lookupWait, ch: e.done}
	}
	e.done = make(chan struct{})
	return lookup{kind: lookupProbe, entry: e}
}

// wait blocks until a probe's answer is in or ctx ends.
func (c *denyCache) wait(ctx context.Context, ch chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// MaxDenyBackoff bounds how far repeated store denials stretch a key's
// local deny beyond the store's RetryAfter.
const MaxDenyBackoff = time.Second

// backoff returns how long to deny a key locally after the store denied it
// with retry, the streak-th denial in a row. The first denial holds for
// exactly retry. When the key's tokens keep going to other replicas, this
// sidecar's probes keep losing; each further loss doubles the hold, up to
// MaxDenyBackoff (never below retry), so that a losing sidecar costs the
// store about one probe per second while the winners still spend the
// key's whole limit. The cost is fairness between replicas on a key that is
// over its limit anyway, never admission beyond the limit.
func backoff(retry time.Duration, streak uint8) time.Duration {
	if streak <= 1 || retry >= MaxDenyBackoff {
		return retry
	}
	d := retry << min(streak-1, 20)
	return max(retry, min(d, MaxDenyBackoff))
}

// put records that key admits nothing costing cost or more until now+hold,
// where hold is retry stretched by backoff when denied is set (a store
// denial) or retry itself (an exhausted allowed decision).
func (c *denyCache) put(key string, now time.Time, retry time.Duration, denied bool, cost, limit int64) {
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
	e.record(now, retry, denied, cost, limit)
}

func (e *denyEntry) record(now time.Time, retry time.Duration, denied bool, cost, limit int64) {
	if denied {
		if e.streak < 255 {
			e.streak++
		}
		retry = backoff(retry, e.streak)
	} else {
		e.streak = 0
	}
	if u := now.Add(retry).UnixNano(); u > e.until || cost < e.cost {
		e.until = u
	}
	e.cost, e.limit = cost, limit
}

// resolve records a probe's answer. keep false means the key is no longer
// exhausted, which removes the entry; otherwise it is denied locally as put
// describes.
func (c *denyCache) resolve(key string, e *denyEntry, keep bool, now time.Time, retry time.Duration, denied bool, cost, limit int64) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !keep {
		if s.m[key] == e {
			delete(s.m, key)
		}
	} else {
		e.record(now, retry, denied, cost, limit)
	}
	close(e.done)
	e.done = nil
}

// release ends a probe that was not sent, leaving the entry as it was.
func (c *denyCache) release(key string, e *denyEntry) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	close(e.done)
	e.done = nil
}

// evict frees room in a full shard: every expired entry not being probed,
// or else one arbitrary entry. The caller holds s.mu.
func (s *denyShard) evict(now int64) {
	freed := false
	for k, e := range s.m {
		if e.done == nil && e.until <= now {
			delete(s.m, k)
			freed = true
		}
	}
	if freed {
		return
	}
	for k, e := range s.m {
		if e.done == nil {
			delete(s.m, k)
			return
		}
	}
}

// clear drops every entry, as after a config change that may have raised
// limits. Probes in flight finish on their detached entries.
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
