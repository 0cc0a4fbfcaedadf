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

// put records that key admits nothing costing cost or more until until.
func (c *denyCache) put(key string, until time.Time, cost, limit int64) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	u := until.UnixNano()
	if e := s.m[key]; e != nil {
		if u > e.until || cost < e.cost {
			e.until, e.cost, e.limit = u, cost, limit
		}
		return
	}
	if len(s.m) >= c.perMax {
		s.evict(time.Now().UnixNano())
	}
	s.m[key] = &denyEntry{until: u, cost: cost, limit: limit}
}

// resolve records a probe's answer: until is zero when the key is no longer
// exhausted, which removes the entry.
func (c *denyCache) resolve(key string, e *denyEntry, until time.Time, cost, limit int64) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if until.IsZero() {
		if s.m[key] == e {
			delete(s.m, key)
		}
	} else {
		e.until, e.cost, e.limit = until.UnixNano(), cost, limit
	}
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
