package engine

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// shardMetrics are one store shard's metrics and health.
type shardMetrics struct {
	obs             prometheus.Observer
	ok, unav, error prometheus.Counter
	// down is set while the shard's last call failed; lastFail is when
	// (Unix nanoseconds).
	down     atomic.Bool
	lastFail atomic.Int64
	// name is the shard's address ("all" for calls that name none);
	// warnedAt is when its last failure was logged (Unix nanoseconds),
	// and warned is set from then until its recovery is logged.
	name     string
	warnedAt atomic.Int64
	warned   atomic.Bool
}

// shardLogInterval bounds the failures of one shard that are logged: a
// flapping shard (a breaker probe answered, the next call failing) logs
// at most one warning, and the recovery that follows it, per interval.
const shardLogInterval = 10 * time.Second

// logFailure reports whether a failure of sm at now, while it counted as
// up, is logged, and claims the interval when it is.
func (sm *shardMetrics) logFailure(now time.Time) bool {
	last := sm.warnedAt.Load()
	if now.UnixNano()-last < int64(shardLogInterval) || !sm.warnedAt.CompareAndSwap(last, now.UnixNano()) {
		return false
	}
	sm.warned.Store(true)
	return true
}

// fallbackHold is how long a shard whose last call failed counts as down
// when no call to it succeeds. Its own failed calls renew it; a shard that
// gets no more calls, such as a failed master whose keys a promoted replica
// now serves under another address, stops counting after it.
const fallbackHold = 5 * time.Second

// shardMetrics returns the metrics of a shard, creating them on its first
// call.
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
		name:  shard,
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
	// A shard that answers again after a logged failure says so; this is
	// off the path of a call to a shard already up.
	if !down && e.o.Log != nil && sm.warned.CompareAndSwap(true, false) {
		e.o.Log.Info("the store shard answers again", "store", e.o.StoreName, "shard", sm.name)
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
