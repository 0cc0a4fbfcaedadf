// Package memstore is floodgate's in-memory limiter.Store: the sidecar's
// local fast path, its fallback buckets when Redis is unreachable, and the
// whole store in standalone mode.
//
// # Layout and cost
//
// Keys are not stored. The index is keyed by the 64-bit xxhash of
// Request.Key, in sharded open-addressing tables (linear probing,
// backward-shift deletion) whose 32-byte slots hold the algorithm state
// inline: hash, two state words, expiry, and the id of the limit the state
// was written under with a use count that eviction reads. A table doubles when 7/8 full, so while keys arrive it
// is at least 7/16 full and a key costs at most 32/(7/16) ≈ 73 bytes of
// heap, index included (measured: 67 bytes per key after a million keys).
// SlidingLog is the exception: each of its keys also holds a
// limiter.Log of 40 bytes plus a buffer of 16 bytes per run of admitted
// requests in the window (grown by doubling), so O(Requests) per key.
// Expired keys keep their memory until Sweep, which shrinks the tables
// they leave sparse and frees their logs: between sweeps, the memory
// stays at its peak, which WithMaxKeys bounds.
//
// Two keys share state only if their 64-bit hashes collide. For k keys the
// chance that any two collide is about k²/2^65: 3e-8 for a million keys,
// 3e-6 for ten million. A collision merges two clients' counters; it never
// crashes or corrupts anything else.
//
// # Expiry and eviction
//
// A key's state expires when the Redis store's TTL would end it (the write
// time plus limiter.StateTTL(ResetAfter), when the state is back to full
// and so the same as no state), rounded up to a whole second. Expired slots are read as
// absent, reclaimed a few at a time as new keys arrive, and all at once by
// Sweep. A shard that reaches its share of the maximum key count evicts
// one key: a key whose state has expired, if the shard holds one (a key
// with a live count is never evicted while an idle one is there); else,
// from a sample of slots, as Redis's sampled LFU does, the least used key,
// whose use count drops by one each time eviction passes it by, so that a
// flood of new keys evicts its own keys before the keys in steady use,
// whatever their rules' windows.
//
// # Time
//
// Decisions, expiry and eviction read the store's clock: time.Now, or the
// clock given with WithClock, which tests use to control time.
//
// # Concurrency
//
// A Store is safe for concurrent use. Each shard has its own mutex, held
// only for the lookup and the arithmetic of one decision. A decision on an
// existing key allocates nothing (except a SlidingLog that grows).
package memstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

var _ limiter.Store = (*Store)(nil)

// Defaults.
const (
	// DefaultMaxKeys is the key bound when WithMaxKeys is not given.
	DefaultMaxKeys = 1 << 20
	// evictSample is how many occupied slots eviction compares.
	evictSample = 8
	// sweepStep is how many slots each insertion examines for expiry.
	sweepStep = 2
	minTable  = 8
)

// Option configures a Store.
type Option func(*options) error

type options struct {
	maxKeys int
	shards  int
	clock   func() time.Time
}

// WithMaxKeys bounds the number of keys. At the bound, a new key evicts the
// idlest key of its shard. A shard also evicts when it holds a quarter more
// than its share (n/shards), so that one shard cannot take all the room.
func WithMaxKeys(n int) Option {
	return func(o *options) error {
		if n < 1 || n > 1<<40 {
			return fmt.Errorf("max keys: must be between 1 and 2^40, got %d", n)
		}
		o.maxKeys = n
		return nil
	}
}

// WithShards sets the number of shards, rounded up to a power of two. The
// default is 64: enough that goroutines on different keys rarely meet on a
// lock.
func WithShards(n int) Option {
	return func(o *options) error {
		if n < 1 || n > 1<<16 {
			return fmt.Errorf("shards: must be between 1 and 65536, got %d", n)
		}
		o.shards = 1 << bits.Len(uint(n-1))
		return nil
	}
}

// WithClock sets the store's clock. The default is time.Now. It must be
// safe for concurrent use.
func WithClock(now func() time.Time) Option {
	return func(o *options) error {
		if now == nil {
			return errors.New("clock: must not be nil")
		}
		o.clock = now
		return nil
	}
}

// Store is a keyed in-memory limiter.Store. Create it with New.
type Store struct {
	shards    []shard
	shardBits uint
	clock     func() time.Time
	limits    limitTable
	keys      atomic.Int64 // keys held in all shards
	slots     slotTable    // the leases of concurrency rules (slots.go)
}

// New returns an empty Store.
func New(opts ...Option) (*Store, error) {
	o := options{maxKeys: DefaultMaxKeys, shards: 64, clock: time.Now}
	var errs []error
	for _, opt := range opts {
		if opt == nil {
			errs = append(errs, errors.New("nil option"))
			continue
		}
		if err := opt(&o); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("memstore: %w", err)
	}
	// Hashes spread keys over shards unevenly, so a shard may hold a
	// quarter more than its share. The total is bounded by maxKeys, give
	// or take one key per shard inserting at the same instant.
	perShard := (o.maxKeys + o.shards - 1) / o.shards
	shardCap := perShard + perShard/4 + 16
	// The table may be at most 7/8 full.
	maxLen := max(minTable, 1<<bits.Len(uint(shardCap+shardCap/7)))
	s := &Store{
		shards:    make([]shard, o.shards),
		shardBits: uint(bits.TrailingZeros(uint(o.shards))),
		clock:     o.clock,
	}
	s.limits.init()
	for i := range s.shards {
		s.shards[i] = shard{maxKeys: shardCap, maxLen: maxLen, limits: &s.limits, total: &s.keys, maxTotal: int64(o.maxKeys), nextExpiry: math.MaxUint32}
	}
	return s, nil
}

// hashKey returns the key's index hash; 0 marks an empty slot.
func hashKey(key string) uint64 {
	h := xxhash.Sum64String(key)
	if h == 0 {
		h = 1
	}
	return h
}

func (s *Store) shardOf(h uint64) *shard {
	// The shard takes the top bits, the slot the bottom ones.
	return &s.shards[(h>>(64-s.shardBits))&uint64(len(s.shards)-1)]
}

// Take applies req to its key and returns the decision. It never blocks on
// I/O and never returns ErrUnavailable; errors are for bad input only (an
// invalid limit, a negative cost, a time outside the representable range).
// The store is one shard to its callers: the shard is always "". ctx is
// not used.
//
// A shared limit (req.Limit.Shared) is interned in one canonical form
// whatever its replica count and index, which are passed with the call, so
// that a changing replica count adds no limits to the store's table.
func (s *Store) Take(_ context.Context, req limiter.Request) (limiter.Decision, string, error) {
	var share limiter.Share
	var lp *limitParams
	var err error
	if req.Limit.Shared() {
		// The share is checked by TakeShare; the rest of the limit once,
		// when interned.
		l := req.Limit
		share, l.Share = l.Share, canonicalShare
		lp, err = s.limits.get(&l)
	} else {
		lp, err = s.limits.get(&req.Limit)
	}
	if err != nil {
		return limiter.Decision{}, "", fmt.Errorf("memstore take: %w", err)
	}
	now := s.clock().UnixMicro()
	h := hashKey(req.Key)
	sh := s.shardOf(h)
	sh.mu.Lock()
	d, err := sh.take(h, lp, share, now, req.Cost)
	sh.mu.Unlock()
	if err != nil {
		return limiter.Decision{}, "", fmt.Errorf("memstore take: %w", err)
	}
	return d, "", nil
}

// Peek returns the decision a cost-0 request on key would get now under l:
// what remains and when the key is full again. It changes nothing.
func (s *Store) Peek(ctx context.Context, key string, l limiter.Limit) (limiter.Decision, error) {
	d, _, err := s.Take(ctx, limiter.Request{Key: key, Limit: l})
	return d, err
}

// Delete forgets key's state, so its next request finds it full. It
// reports whether there was state.
func (s *Store) Delete(key string) bool {
	h := hashKey(key)
	sh := s.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, ok := sh.find(h)
	if ok {
		sh.deleteAt(i)
	}
	return ok
}

// Len returns the number of keys held, including expired ones that have
// not been reclaimed yet.
func (s *Store) Len() int {
	return int(s.keys.Load())
}

// Sweep removes every key whose state has expired at now (the zero time
// means the store's clock) and returns how many it removed. Expired keys
// are also reclaimed lazily, a few slots per new key, but only Sweep gives
// their memory back: a table it leaves at most 1/8 full shrinks, and the
// SlidingLog buffers of the keys it removed go. A store whose keys came
// and went (a config of many rules that was replaced, a flood of clients
// that ended) returns to the size of the keys it still holds.
func (s *Store) Sweep(now time.Time) int {
	if now.IsZero() {
		now = s.clock()
	}
	us := now.UnixMicro()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.sweepAll(us)
		sh.fit()
		sh.mu.Unlock()
	}
	return n
}

// canonicalShare stands for every replica count and index in the limit
// table: the state of a share does not depend on them.
var canonicalShare = limiter.Share{Of: 2}

// limitParams is an interned limit.
type limitParams struct {
	p  *limiter.Params
	id uint32
}

// limitTable interns the limits seen, so that a decision neither revalidates
// its limit nor searches for the clock scale, and so that a slot can name
// the limit its state was written under in 3 bytes. Lookups are lock-free:
// a direct-mapped cache in front of a copy-on-write map. Limits come from
// configuration, not from clients, so the table stays small; each entry
// costs about 200 bytes for the life of the Store.
type limitTable struct {
	cache [256]atomic.Pointer[limitParams]
	snap  atomic.Pointer[limitSnap]
	mu    sync.Mutex // serialises writers of snap
}

type limitSnap struct {
	byLimit map[limiter.Limit]*limitParams
	byID    []*limiter.Params
}

func (t *limitTable) init() {
	t.snap.Store(&limitSnap{byLimit: map[limiter.Limit]*limitParams{}})
}

func cacheSlot(l *limiter.Limit) uint8 {
	x := uint64(l.Requests)*0x9E3779B97F4A7C15 ^ uint64(l.Period) ^ uint64(l.Burst)<<17 ^ uint64(l.Algorithm)<<7
	x ^= x >> 29
	x *= 0xBF58476D1CE4E5B9
	return uint8(x >> 56)
}

func (t *limitTable) get(l *limiter.Limit) (*limitParams, error) {
	slot := &t.cache[cacheSlot(l)]
	if lp := slot.Load(); lp != nil && lp.p.Limit == *l {
		return lp, nil
	}
	lp, ok := t.snap.Load().byLimit[*l]
	if !ok {
		var err error
		if lp, err = t.add(*l); err != nil {
			return nil, err
		}
	}
	slot.Store(lp)
	return lp, nil
}

func (t *limitTable) add(l limiter.Limit) (*limitParams, error) {
	p, err := limiter.NewParams(l)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.snap.Load()
	if lp, ok := old.byLimit[l]; ok {
		return lp, nil
	}
	if len(old.byID) >= limitMask {
		return nil, errors.New("too many distinct limits")
	}
	next := &limitSnap{byLimit: make(map[limiter.Limit]*limitParams, len(old.byLimit)+1), byID: append(old.byID[:len(old.byID):len(old.byID)], p)}
	for k, v := range old.byLimit {
		next.byLimit[k] = v
	}
	lp := &limitParams{p: p, id: uint32(len(next.byID) - 1)}
	next.byLimit[l] = lp
	t.snap.Store(next)
	return lp, nil
}

func (t *limitTable) byID(id uint32) *limiter.Params {
	return t.snap.Load().byID[id]
}
