package memstore

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// slot is one key's state, 32 bytes, so that two fill a cache line and a
// decision touches one line. hash 0 marks an empty slot. a and b are
// limiter.State's A and B; SlidingWindow packs cur and prev (each below
// 2^32, since counts never exceed MaxRequests) into b, and SlidingLog keeps
// the index of its Log in a.
type slot struct {
	hash uint64
	a, b int64
	// expires is the second since the epoch from which the slot is
	// absent: the Redis TTL's end rounded up to a whole second (saturated
	// after 2106, when the state is simply kept until evicted).
	expires uint32
	// meta holds the id in limitTable of the limit the state was written
	// under (the low 24 bits) and the key's use count (the high 8 bits),
	// which eviction reads: see evict.
	meta uint32
}

const (
	limitBits = 24
	limitMask = 1<<limitBits - 1
	maxUses   = 0xff
)

// limitID returns the id of the limit e's state was written under.
func (e *slot) limitID() uint32 { return e.meta & limitMask }

// setLimit records the limit e's state is written under.
func (e *slot) setLimit(id uint32) { e.meta = e.meta&^limitMask | id }

// uses returns e's use count: decisions on the key since it was last
// aged, saturating at 255.
func (e *slot) uses() uint32 { return e.meta >> limitBits }

// used counts one decision on e.
func (e *slot) used() {
	if e.uses() < maxUses {
		e.meta += 1 << limitBits
	}
}

// age takes one from e's use count, down to 1: a key keeps a count above
// 1 only while it is used at least as often as eviction comes round to
// it, and a key used once stays level with the others used once, among
// which the one that expires first goes.
func (e *slot) age() {
	if e.uses() > 1 {
		e.meta -= 1 << limitBits
	}
}

// expiresAt returns the slot expiry for a write at now (µs) whose decision
// had the given ResetAfter.
func expiresAt(now int64, resetAfter time.Duration) uint32 {
	end := now + limiter.StateTTL(resetAfter).Microseconds()
	sec := (end + 999_999) / 1_000_000
	if sec > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(sec)
}

// expired reports whether e is absent at now (µs).
func (e *slot) expired(now int64) bool {
	return now >= int64(e.expires)*1_000_000
}

// shard is one lock's worth of keys: an open-addressing table with linear
// probing and backward-shift deletion, so it needs no tombstones.
type shard struct {
	_       [64]byte // keeps neighbouring shards' locks off one cache line
	mu      sync.Mutex
	table   []slot
	count   int
	maxKeys int // this shard's hard bound
	maxLen  int
	// total counts the keys of all shards, bounded by maxTotal.
	total    *atomic.Int64
	maxTotal int64
	cursor   int // next slot the incremental sweep and eviction look at
	// nextExpiry is at most the earliest expiry (a slot's expires) of any
	// key in the shard: until that second no key can have expired, so
	// eviction need not look for one.
	nextExpiry uint32
	logs       []limiter.Log
	free       []int32 // indexes of unused logs
	limits     *limitTable
}

// find returns the index of h's slot, or false.
func (sh *shard) find(h uint64) (int, bool) {
	if len(sh.table) == 0 {
		return 0, false
	}
	mask := uint64(len(sh.table) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch sh.table[i].hash {
		case h:
			return int(i), true
		case 0:
			return int(i), false
		}
	}
}

// take decides a request of cost at now (µs) on key hash h under the
// limit lp, or, when share.Of > 1, under replica share.Index's share of it
// (lp is then the limit's canonical shared form; see Store.Take).
func (sh *shard) take(h uint64, lp *limitParams, share limiter.Share, now, cost int64) (limiter.Decision, error) {
	p := lp.p
	i, found := sh.find(h)
	if found && sh.table[i].expired(now) {
		// Expired is absent: reclaim the slot now.
		sh.deleteAt(i)
		i, found = sh.find(h)
	}
	if isLogLimit(p) {
		return sh.takeLog(h, i, found, lp, now, cost)
	}
	i, found, st, sp := sh.load(h, i, found, p)
	var d limiter.Decision
	var write bool
	var err error
	if share.Of > 1 {
		d, write, err = p.TakeShare(&st, sp, share, now, cost)
	} else {
		d, write, err = p.Take(&st, sp, now, cost)
	}
	if err != nil || !write {
		return d, err
	}
	sh.store(h, i, found, lp, now, st, d.ResetAfter)
	return d, nil
}

// load reads the fixed-size state of h, at slot i when found, and the
// Params it was written under (p when there is none).
func (sh *shard) load(h uint64, i int, found bool, p *limiter.Params) (int, bool, limiter.State, *limiter.Params) {
	var st limiter.State
	sp := p
	if found {
		e := &sh.table[i]
		e.used()
		sp = sh.limits.byID(e.limitID())
		if isLogLimit(sp) {
			// The key changed from SlidingLog: drop its log.
			sh.deleteAt(i)
			i, found = sh.find(h)
			sp = p
		} else {
			st = unpack(e, sp)
		}
	}
	return i, found, st, sp
}

// store writes st, computed under lp at now, as h's state, inserting h when
// it was not found, with the expiry of a decision with resetAfter.
func (sh *shard) store(h uint64, i int, found bool, lp *limitParams, now int64, st limiter.State, resetAfter time.Duration) {
	if !found {
		i = sh.insert(h, now)
	}
	e := &sh.table[i]
	pack(e, lp.p, st)
	e.setLimit(lp.id)
	sh.setExpiry(e, expiresAt(now, resetAfter))
}

// setExpiry sets e's expiry, keeping nextExpiry a lower bound.
func (sh *shard) setExpiry(e *slot, expires uint32) {
	e.expires = expires
	sh.nextExpiry = min(sh.nextExpiry, expires)
}

func (sh *shard) isLog(e *slot) bool {
	return isLogLimit(sh.limits.byID(e.limitID()))
}

// isLogLimit reports whether p's state is a limiter.Log: SlidingLog, unless
// shared (a share keeps one number whatever the algorithm).
func isLogLimit(p *limiter.Params) bool {
	return p.Limit.Algorithm == limiter.SlidingLog && !p.Limit.Shared()
}

func unpack(e *slot, sp *limiter.Params) limiter.State {
	st := limiter.State{A: e.a, B: e.b, Set: true}
	if sp.Limit.Algorithm == limiter.SlidingWindow && !sp.Limit.Shared() {
		st.B, st.C = int64(uint64(e.b)>>32), int64(uint32(e.b))
	}
	return st
}

func pack(e *slot, p *limiter.Params, st limiter.State) {
	e.a, e.b = st.A, st.B
	if p.Limit.Algorithm == limiter.SlidingWindow && !p.Limit.Shared() {
		e.b = int64(uint64(st.B)<<32 | uint64(uint32(st.C)))
	}
}

func (sh *shard) takeLog(h uint64, i int, found bool, lp *limitParams, now, cost int64) (limiter.Decision, error) {
	if found && !sh.isLog(&sh.table[i]) {
		// The key changed to SlidingLog: start afresh.
		sh.deleteAt(i)
		i, found = sh.find(h)
	}
	if !found {
		var empty limiter.Log
		d, write, err := lp.p.TakeLog(&empty, now, cost)
		if err != nil || !write {
			return d, err
		}
		i = sh.insert(h, now)
		e := &sh.table[i]
		e.a = int64(sh.newLog(empty))
		e.setLimit(lp.id)
		sh.setExpiry(e, expiresAt(now, d.ResetAfter))
		return d, nil
	}
	e := &sh.table[i]
	e.used()
	d, _, err := lp.p.TakeLog(&sh.logs[e.a], now, cost)
	if err != nil {
		return d, err
	}
	if d.Allowed && cost > 0 {
		e.setLimit(lp.id)
		sh.setExpiry(e, expiresAt(now, d.ResetAfter))
	}
	return d, nil
}

func (sh *shard) newLog(lg limiter.Log) int32 {
	if n := len(sh.free); n > 0 {
		idx := sh.free[n-1]
		sh.free = sh.free[:n-1]
		sh.logs[idx] = lg
		return idx
	}
	sh.logs = append(sh.logs, lg)
	return int32(len(sh.logs) - 1)
}

// insert makes room for h, which is not in the table, and returns its
// slot, zeroed but for the hash.
func (sh *shard) insert(h uint64, now int64) int {
	sh.sweep(now, sweepStep)
	if sh.count >= sh.maxKeys || (sh.total.Load() >= sh.maxTotal && sh.count > 0) {
		sh.evict(now)
	}
	if (sh.count+1)*8 > len(sh.table)*7 && len(sh.table) < sh.maxLen {
		sh.grow()
	}
	i, _ := sh.find(h)
	sh.table[i] = slot{hash: h, meta: 1 << limitBits}
	sh.count++
	sh.total.Add(1)
	return i
}

func (sh *shard) grow() { sh.rehash(max(minTable, 2*len(sh.table))) }

// rehash moves the keys to a table of size slots, a power of two larger
// than the key count, or to none when size is 0.
func (sh *shard) rehash(size int) {
	old := sh.table
	sh.table = nil
	if size > 0 {
		sh.table = make([]slot, size)
	}
	mask := uint64(size - 1)
	for _, e := range old {
		if e.hash == 0 {
			continue
		}
		i := e.hash & mask
		for sh.table[i].hash != 0 {
			i = (i + 1) & mask
		}
		sh.table[i] = e
	}
	sh.cursor = 0
}

// fit gives back the memory that deletions freed: a table at most 1/8
// full moves to one at most 7/16 full (as full as a table that has just
// grown), none when the shard is empty, and when at least half of the
// logs are unused the live ones move to a slice of their own, freeing
// the rest. It costs a pass over the table, as sweepAll does.
func (sh *shard) fit() {
	switch {
	case sh.count == 0:
		if sh.table != nil {
			sh.rehash(0)
		}
	case len(sh.table) > minTable && sh.count*8 <= len(sh.table):
		size := minTable
		for size*7 < sh.count*16 {
			size *= 2
		}
		sh.rehash(size)
	}
	if len(sh.free) > 0 && len(sh.free)*2 >= len(sh.logs) {
		logs := make([]limiter.Log, 0, len(sh.logs)-len(sh.free))
		for i := range sh.table {
			if e := &sh.table[i]; e.hash != 0 && sh.isLog(e) {
				logs = append(logs, sh.logs[e.a])
				e.a = int64(len(logs) - 1)
			}
		}
		sh.logs, sh.free = logs, nil
	}
}

// deleteAt empties slot i and shifts back the slots after it that probed
// past it, so lookups never stop early.
func (sh *shard) deleteAt(i int) {
	if sh.isLog(&sh.table[i]) {
		idx := int32(sh.table[i].a)
		sh.logs[idx] = limiter.Log{}
		sh.free = append(sh.free, idx)
	}
	mask := len(sh.table) - 1
	j := i
	for {
		j = (j + 1) & mask
		e := sh.table[j]
		if e.hash == 0 {
			break
		}
		home := int(e.hash) & mask
		// e stays if its home is cyclically within (i, j].
		if (i <= j && i < home && home <= j) || (i > j && (i < home || home <= j)) {
			continue
		}
		sh.table[i] = e
		i = j
	}
	sh.table[i] = slot{}
	sh.count--
	sh.total.Add(-1)
}

// sweep examines n slots from the cursor and deletes the expired ones.
func (sh *shard) sweep(now int64, n int) int {
	if len(sh.table) == 0 {
		return 0
	}
	removed := 0
	mask := len(sh.table) - 1
	for range n {
		c := sh.cursor & mask
		if e := &sh.table[c]; e.hash != 0 && e.expired(now) {
			sh.deleteAt(c) // a later slot may move into c: look again
			removed++
			continue
		}
		sh.cursor = (c + 1) & mask
	}
	return removed
}

func (sh *shard) sweepAll(now int64) int {
	removed := 0
	next := uint32(math.MaxUint32)
	for i := 0; i < len(sh.table); {
		e := &sh.table[i]
		if e.hash != 0 && e.expired(now) {
			sh.deleteAt(i) // a later slot may move into i: look again
			removed++
			continue
		}
		if e.hash != 0 {
			next = min(next, e.expires)
		}
		i++
	}
	sh.nextExpiry = next
	if sh.count == 0 {
		sh.logs, sh.free = nil, nil
	}
	return removed
}

// evict deletes one key. It looks at the next evictSample occupied slots
// from the cursor and deletes, as Redis's sampled LFU does, a key whose
// state has expired (it holds no live count) if there is one, else the
// least used, and among equally used ones the one that expires first,
// whose count matters least. The cursor then moves one key on, and that
// key is aged (its use count drops by one, down to 1): every key is aged
// once per round of the cursor through the shard, so a key keeps a count
// above 1 only while it is used at least once in the time that evictions
// take to go round the shard. A flood of keys used once therefore evicts
// its own keys before a key in steady use, whatever their windows.
//
// Before sampling, a key whose count has expired is looked for in the
// whole shard, but only once some key may have expired (nextExpiry has
// passed), which happens at most once per second: a key with a live count
// is never evicted while the shard holds an expired one.
func (sh *shard) evict(now int64) {
	if now >= int64(sh.nextExpiry)*1_000_000 && sh.sweepAll(now) > 0 {
		return
	}
	mask := len(sh.table) - 1
	best, first, seen := -1, -1, 0
	for c := sh.cursor; seen < evictSample && seen < sh.count; c = (c + 1) & mask {
		e := &sh.table[c]
		if e.hash == 0 {
			continue
		}
		seen++
		if first < 0 {
			first = c
		}
		if e.expired(now) {
			best = c
			break
		}
		if best < 0 || idler(e, &sh.table[best]) {
			best = c
		}
	}
	if first >= 0 {
		sh.table[first].age()
		sh.cursor = (first + 1) & mask
	}
	if best >= 0 {
		sh.deleteAt(best)
	}
}

// idler reports whether a is a better key to evict than b: less used, or
// as used and expiring sooner.
func idler(a, b *slot) bool {
	if ua, ub := a.uses(), b.uses(); ua != ub {
		return ua < ub
	}
	return a.expires < b.expires
}
