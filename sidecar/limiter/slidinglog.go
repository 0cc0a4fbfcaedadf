package limiter

import "fmt"

// Log is the SlidingLog state of one key: the admitted unit timestamps of
// the current window, kept as runs of equal timestamps in arrival order.
// Its memory is 16 bytes per run plus the slice header, so at most
// 16 * Requests bytes per key (MaxLogRequests caps Requests); a burst
// admitted at one instant is a single run. The zero Log is empty and ready
// to use. A Log is not safe for concurrent use.
type Log struct {
	runs  []logRun // runs[start:] are live, oldest first
	start int
	count int64 // sum of the live runs' n
}

type logRun struct{ ts, n int64 }

// Len returns the number of admitted units the log holds (expired entries
// included until a TakeLog of a non-zero cost prunes them).
func (l *Log) Len() int64 { return l.count }

// Newest returns the newest timestamp in the log, in µs, and whether there
// is one.
func (l *Log) Newest() (int64, bool) {
	if l.start == len(l.runs) {
		return 0, false
	}
	return l.runs[len(l.runs)-1].ts, true
}

// prune drops every run at or before cutoff and gives memory back once the
// live runs use a quarter of the buffer or less.
func (l *Log) prune(cutoff int64) {
	for l.start < len(l.runs) && l.runs[l.start].ts <= cutoff {
		l.count -= l.runs[l.start].n
		l.start++
	}
	live := len(l.runs) - l.start
	switch {
	case live == 0:
		l.runs, l.start = l.runs[:0], 0
		if cap(l.runs) > 8 {
			l.runs = nil
		}
	case l.start > 0 && (l.start >= live || cap(l.runs) >= 4*live+16):
		keep := l.runs[l.start:]
		if cap(l.runs) >= 4*live+16 {
			l.runs = append(make([]logRun, 0, 2*live), keep...)
		} else {
			l.runs = l.runs[:copy(l.runs, keep)]
		}
		l.start = 0
	}
}

// upTo returns the number of units at or before cutoff, without removing
// them.
func (l *Log) upTo(cutoff int64) int64 {
	var n int64
	for _, r := range l.runs[l.start:] {
		if r.ts > cutoff {
			break
		}
		n += r.n
	}
	return n
}

// kth returns the timestamp of the k-th oldest unit, 1 <= k <= count.
func (l *Log) kth(k int64) int64 {
	for _, r := range l.runs[l.start:] {
		if k <= r.n {
			return r.ts
		}
		k -= r.n
	}
	return l.runs[len(l.runs)-1].ts
}

// TakeLog decides a request of cost n at nowUs (µs since the epoch) against
// the SlidingLog state lg, following ALGORITHMS.md. It admits or denies
// exactly, with one log entry per admitted unit in the window. A cost of 0
// is a peek: decided as a cost of 1 would be, it leaves lg as it was.
// Other calls prune the expired entries; a deny adds nothing. It reports
// write = true when the log gained entries.
//
// Callers serialise access to one Log.
func (p *Params) TakeLog(lg *Log, nowUs, n int64) (d Decision, write bool, err error) {
	if err := checkTake(nowUs, n); err != nil {
		return Decision{}, false, err
	}
	if p.Limit.Algorithm != SlidingLog {
		return Decision{}, false, fmt.Errorf("take log with %v: only SlidingLog keeps a log, use Take", p.Limit.Algorithm)
	}
	per, c := p.PeriodMicros, p.Capacity
	t := nowUs
	if newest, ok := lg.Newest(); ok && newest > t {
		t = newest
	}
	if n == 0 {
		return p.peekLog(lg, t, nowUs), false, nil
	}
	lg.prune(t - per)
	var allowed bool
	var retry int64
	switch {
	case n > c:
		retry = per
	case lg.count+n <= c:
		if last := len(lg.runs) - 1; last >= lg.start && lg.runs[last].ts == t {
			lg.runs[last].n += n
		} else {
			lg.runs = append(lg.runs, logRun{ts: t, n: n})
		}
		lg.count += n
		allowed, write = true, true
	default:
		retry = lg.kth(lg.count+n-c) + per - nowUs
	}
	var reset int64
	if newest, ok := lg.Newest(); ok && lg.count > 0 {
		reset = newest + per - nowUs
	}
	return p.decision(allowed, max(0, c-lg.count), reset, retry), write, nil
}

// peekLog decides a peek at nowUs, t being the log's clock (nowUs, or its
// newest entry when that is later), as TakeLog decides a cost of 1, and
// changes nothing: the entries that a take would prune are counted out
// rather than removed.
func (p *Params) peekLog(lg *Log, t, nowUs int64) Decision {
	per, c := p.PeriodMicros, p.Capacity
	expired := lg.upTo(t - per)
	cnt := lg.count - expired
	var retry, reset int64
	if cnt+1 > c {
		// The (cnt+1-c)-th oldest live unit frees the first one.
		retry = lg.kth(expired+cnt+1-c) + per - nowUs
	}
	if newest, ok := lg.Newest(); ok && cnt > 0 {
		reset = newest + per - nowUs
	}
	return p.decision(cnt+1 <= c, max(0, c-cnt), reset, retry)
}
