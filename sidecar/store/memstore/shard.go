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
	limit   uint32 // id in limitTable of the limit the state was written under
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
	logs     []limiter.Log
	free     []int32 // indexes of unused logs
	limits   *limitTable
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

func (sh *shard) take(h uint64, lp *limitParams, now, cost int64) (limiter.Decision, error) {
	p := lp.p
	i, found := sh.find(h)
	if found && sh.table[i].expired(now) {
		// Expired is absent: reclaim the slot now.
		sh.deleteAt(i)
		i, found = sh.find(h)
	}
	if p.Limit.Algorithm == limiter.SlidingLog {
		return sh.takeLog(h, i, found, lp, now, cost)
	}
	i, found, st, sp := sh.load(h, i, found, p)
	d, write, err := p.Take(&st, sp, now, cost)
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
		sp = sh.limits.byID(e.limit)
		if sp.Limit.Algorithm == limiter.SlidingLog {
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
	e.limit = lp.id
	e.expires = expiresAt(now, resetAfter)
}

func (sh *shard) isLog(e *slot) bool {
	return sh.limits.byID(e.limit).Limit.Algorithm == limiter.SlidingLog
}

func unpack(e *slot, sp *limiter.Params) limiter.State {
	st := limiter.State{A: e.a, B: e.b, Set: true}
	if sp.Limit.Algorithm == limiter.SlidingWindow {
		st.B, st.C = int64(uint64(e.b)>>32), int64(uint32(e.b))
	}
	return st
}

func pack(e *slot, p *limiter.Params, st limiter.State) {
	e.a, e.b = st.A, st.B
	if p.Limit.Algorithm == limiter.SlidingWindow {
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
		e.limit = lp.id
		e.expires = expiresAt(now, d.ResetAfter)
		return d, nil
	}
	e := &sh.table[i]
	d, _, err := lp.p.TakeLog(&sh.logs[e.a], now, cost)
	if err != nil {
		return d, err
	}
	if d.Allowed && cost > 0 {
		e.limit = lp.id
		e.expires = expiresAt(now, d.ResetAfter)
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
		sh.evict()
	}
	if (sh.count+1)*8 > len(sh.table)*7 && len(sh.table) < sh.maxLen {
		sh.grow()
	}
	i, _ := sh.find(h)
	sh.table[i] = slot{hash: h}
	sh.count++
	sh.total.Add(1)
	return i
}

func (sh *shard) grow() {
	old := sh.table
	sh.table = make([]slot, max(minTable, 2*len(old)))
	mask := uint64(len(sh.table) - 1)
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
	for i := 0; i < len(sh.table); {
		if e := &sh.table[i]; e.hash != 0 && e.expired(now) {
			sh.deleteAt(i) // a later slot may move into i: look again
			removed++
			continue
		}
		i++
	}
	if sh.count == 0 {
		sh.logs, sh.free = nil, nil
	}
	return removed
}

// evict deletes, among the next evictSample occupied slots from the cursor,
// the one that expires first: the idlest key, or an expired one.
func (sh *shard) evict() {
	mask := len(sh.table) - 1
	best, seen := -1, 0
	for c := sh.cursor; seen < evictSample && seen < sh.count; c = (c + 1) & mask {
		if sh.table[c].hash == 0 {
			continue
		}
		seen++
		if best < 0 || sh.table[c].expires < sh.table[best].expires {
			best = c
		}
		sh.cursor = (c + 1) & mask
	}
	if best >= 0 {
		sh.deleteAt(best)
	}
}
