package limitertest

import (
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// Step is one request of a Table: at Base+At, a request of Cost must get
// Want.
type Step struct {
	At   time.Duration
	Cost int64
	Want limiter.Decision
	// Edit, when set, replaces the limit from this step on: a limit edit
	// on a key that has state.
	Edit *limiter.Limit
}

// Table is a sequence of requests against one fresh key.
type Table struct {
	Name  string
	Limit limiter.Limit
	// Base is the instant the steps' At are measured from. Some tables
	// start on a window boundary, others in the middle of a window.
	Base  time.Time
	Steps []Step
}

const (
	us  = time.Microsecond
	ms  = time.Millisecond
	sec = time.Second
	day = 24 * time.Hour
)

var (
	// minuteAligned starts a minute (and a second): 1_700_000_040 is a
	// multiple of 60.
	minuteAligned = time.Unix(1_700_000_040, 0)
	// offBase is in the middle of every window, with sub-millisecond digits.
	offBase = time.Unix(1_700_000_017, 345_678_000)
	// yearAligned is a multiple of 366 days since the epoch.
	yearAligned = time.Unix(53*31_622_400, 0)
)

func st(at time.Duration, cost int64, want limiter.Decision) Step {
	return Step{At: at, Cost: cost, Want: want}
}

func allow(rem int64, reset time.Duration) limiter.Decision {
	return limiter.Decision{Allowed: true, Remaining: rem, ResetAfter: reset}
}

func deny(rem int64, reset, retry time.Duration) limiter.Decision {
	return limiter.Decision{Remaining: rem, ResetAfter: reset, RetryAfter: retry}
}

func withLimit(t Table) Table {
	c := t.Limit.Capacity()
	for i := range t.Steps {
		if e := t.Steps[i].Edit; e != nil {
			c = e.Capacity()
		}
		t.Steps[i].Want.Limit = c
	}
	return t
}

// edit returns a limit of requests per second.
func edit(alg limiter.Algorithm, requests, burst int64) *limiter.Limit {
	return &limiter.Limit{Algorithm: alg, Requests: requests, Period: sec, Burst: burst}
}

// editTables: every algorithm keeps what a key has spent across a limit
// edit (6 of 10 spent, the limit raised to 20: 14 remain).
func editTables() []Table {
	algs := []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow, limiter.SlidingLog}
	out := make([]Table, 0, len(algs))
	for _, alg := range algs {
		tb := Table{
			Name:  alg.String() + "/limit edit keeps what was spent",
			Limit: limiter.Limit{Algorithm: alg, Requests: 10, Period: sec},
			Base:  minuteAligned.Add(250 * ms),
		}
		switch alg {
		case limiter.TokenBucket, limiter.GCRA:
			tb.Steps = []Step{
				{At: 0, Cost: 6, Want: allow(4, 600*ms)},
				{At: 0, Cost: 0, Want: allow(14, 300*ms), Edit: edit(alg, 20, 0)},
				{At: 0, Cost: 1, Want: allow(13, 350*ms)},
				// Lowered to 5 per 1s burst 4: 7 spent, capped at the new
				// capacity of 4, so the key is empty: 200ms per token.
				{At: 0, Cost: 1, Want: deny(0, 800*ms, 200*ms), Edit: edit(alg, 5, 4)},
				{At: 200 * ms, Cost: 1, Want: allow(0, 800*ms)},
			}
		case limiter.FixedWindow:
			tb.Steps = []Step{
				{At: 0, Cost: 6, Want: allow(4, 750*ms)},
				{At: 0, Cost: 0, Want: allow(14, 750*ms), Edit: edit(alg, 20, 0)},
				{At: 0, Cost: 14, Want: allow(0, 750*ms)},
				{At: 0, Cost: 1, Want: deny(0, 750*ms, 750*ms), Edit: edit(alg, 5, 0)},
			}
		case limiter.SlidingWindow:
			tb.Steps = []Step{
				{At: 0, Cost: 6, Want: allow(4, 1750*ms)},
				{At: 0, Cost: 0, Want: allow(14, 1750*ms), Edit: edit(alg, 20, 0)},
				{At: 0, Cost: 14, Want: allow(0, 1750*ms)},
				// Lowered to 5: cur 20 in the next window must weigh 4 or
				// less, which is 0.8s into it.
				{At: 0, Cost: 1, Want: deny(0, 1750*ms, 1550*ms), Edit: edit(alg, 5, 0)},
			}
		case limiter.SlidingLog:
			tb.Steps = []Step{
				{At: 0, Cost: 6, Want: allow(4, sec)},
				{At: 0, Cost: 0, Want: allow(14, sec), Edit: edit(alg, 20, 0)},
				{At: 0, Cost: 14, Want: allow(0, sec)},
				{At: 0, Cost: 1, Want: deny(0, sec, sec), Edit: edit(alg, 5, 0)},
			}
		}
		out = append(out, tb)
	}
	return out
}

// Tables returns the step tables every algorithm implementation must pass,
// with decisions computed by hand from ALGORITHMS.md. Each call returns
// fresh slices.
func Tables() []Table {
	edits := editTables()
	tables := make([]Table, 0, 16+len(edits))
	tables = append(tables, []Table{
		{
			Name:  "TokenBucket/10 per 1s",
			Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: sec},
			Base:  offBase,
			Steps: []Step{
				st(0, 1, allow(9, 100*ms)),
				st(0, 9, allow(0, sec)),
				st(0, 1, deny(0, sec, 100*ms)),
				st(50*ms, 1, deny(0, 950*ms, 50*ms)),
				st(100*ms, 1, allow(0, sec)),
				// A peek (cost 0) on the empty key is denied as a cost
				// of 1 is, and spends nothing.
				st(100*ms, 0, deny(0, sec, 100*ms)),
				st(350*ms, 2, allow(0, 950*ms)),
				st(350*ms, 11, deny(0, 950*ms, sec)),
				st(2*sec, 0, allow(10, 0)),
				st(2*sec, 10, allow(0, sec)),
				// The clock goes back 500ms: no refill, durations from the real now.
				st(1500*ms, 1, deny(0, 1500*ms, 600*ms)),
				st(2100*ms, 1, allow(0, sec)),
			},
		},
		{
			Name:  "TokenBucket/3 per 1m burst 5",
			Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Period: time.Minute, Burst: 5},
			Base:  minuteAligned,
			Steps: []Step{
				st(0, 5, allow(0, 100*sec)),
				st(0, 1, deny(0, 100*sec, 20*sec)),
				st(0, 0, deny(0, 100*sec, 20*sec)),
				st(20*sec-us, 1, deny(0, 80*sec+us, us)),
				st(20*sec, 1, allow(0, 100*sec)),
				st(70*sec, 2, allow(0, 90*sec)),
				st(70*sec, 6, deny(0, 90*sec, time.Minute)),
				st(80*sec, 1, allow(0, 100*sec)),
			},
		},
		{
			Name:  "TokenBucket/3 per 1s exact thirds",
			Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Period: sec},
			Base:  offBase,
			Steps: []Step{
				st(0, 3, allow(0, sec)),
				st(0, 1, deny(0, sec, 333334*us)),
				st(333333*us, 1, deny(0, 666667*us, us)),
				st(333334*us, 1, allow(0, sec)),
				st(sec, 0, allow(2, 333334*us)),
			},
		},
		{
			Name:  "TokenBucket/1e9 per 1s",
			Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1_000_000_000, Period: sec},
			Base:  offBase,
			Steps: []Step{
				st(0, 1_000_000_000, allow(0, sec)),
				st(0, 1, deny(0, sec, us)),
				st(us, 1000, allow(0, sec)),
				st(us, 1, deny(0, sec, us)),
				st(1500*ms, 0, allow(1_000_000_000, 0)),
			},
		},
		{
			Name:  "TokenBucket/1 per 366d",
			Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1, Period: 366 * day},
			Base:  offBase,
			Steps: []Step{
				st(0, 1, allow(0, 366*day)),
				st(sec, 1, deny(0, 366*day-sec, 366*day-sec)),
				st(366*day-us, 1, deny(0, us, us)),
				st(366*day, 1, allow(0, 366*day)),
			},
		},
		{
			// redis-cell's README: CL.THROTTLE user123 15 30 60 1.
			Name:  "GCRA/max_burst 15, 30 per 60s",
			Limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 30, Period: time.Minute, Burst: 16},
			Base:  offBase,
			Steps: []Step{
				st(0, 1, allow(15, 2*sec)),
				st(0, 15, allow(0, 32*sec)),
				st(0, 1, deny(0, 32*sec, 2*sec)),
				st(sec, 1, deny(0, 31*sec, sec)),
				st(sec, 0, deny(0, 31*sec, sec)),
				st(2*sec, 1, allow(0, 32*sec)),
				st(2*sec, 17, deny(0, 32*sec, time.Minute)),
				st(40*sec, 0, allow(16, 0)),
				st(40*sec, 16, allow(0, 32*sec)),
				// The clock goes back: the debt is measured from at most
				// one full bucket before the TAT, so nothing is minted.
				st(30*sec, 1, deny(0, 42*sec, 12*sec)),
				st(20*sec, 1, deny(0, 52*sec, 22*sec)),
				st(42*sec, 1, allow(0, 32*sec)),
			},
		},
		{
			Name:  "GCRA/3 per 1s exact thirds",
			Limit: limiter.Limit{Algorithm: limiter.GCRA, Requests: 3, Period: sec},
			Base:  minuteAligned,
			Steps: []Step{
				st(0, 3, allow(0, sec)),
				st(0, 1, deny(0, sec, 333334*us)),
				st(333333*us, 1, deny(0, 666667*us, us)),
				st(333333*us, 0, deny(0, 666667*us, us)),
				st(333334*us, 1, allow(0, sec)),
				st(sec, 0, allow(2, 333334*us)),
				st(sec, 4, deny(2, 333334*us, sec)),
			},
		},
		{
			Name:  "FixedWindow/3 per 1m mid-window",
			Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 3, Period: time.Minute},
			Base:  minuteAligned.Add(45 * sec),
			Steps: []Step{
				st(0, 2, allow(1, 15*sec)),
				st(10*sec, 2, deny(1, 5*sec, 5*sec)),
				st(10*sec, 0, allow(1, 5*sec)),
				st(10*sec, 1, allow(0, 5*sec)),
				st(15*sec-us, 0, deny(0, us, us)),
				st(15*sec-us, 1, deny(0, us, us)),
				st(15*sec, 3, allow(0, time.Minute)),
				st(15*sec, 4, deny(0, time.Minute, time.Minute)),
				// Back into the previous window: the newer window is kept.
				st(10*sec, 1, deny(0, 65*sec, 65*sec)),
				st(80*sec, 0, allow(3, 0)),
			},
		},
		{
			Name:  "FixedWindow/5 per 1s aligned",
			Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 5, Period: sec},
			Base:  minuteAligned,
			Steps: []Step{
				st(0, 5, allow(0, sec)),
				st(sec-us, 1, deny(0, us, us)),
				st(sec, 1, allow(4, sec)),
				st(sec, 0, allow(4, sec)),
			},
		},
		{
			Name:  "FixedWindow/2 per 366d",
			Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 2, Period: 366 * day},
			Base:  yearAligned,
			Steps: []Step{
				st(0, 2, allow(0, 366*day)),
				st(366*day-us, 1, deny(0, us, us)),
				st(366*day, 1, allow(1, 366*day)),
			},
		},
		{
			Name:  "SlidingWindow/10 per 1m aligned",
			Limit: limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 10, Period: time.Minute},
			Base:  minuteAligned,
			Steps: []Step{
				st(0, 4, allow(6, 120*sec)),
				st(30*sec, 6, allow(0, 90*sec)),
				// prev 10 must weigh 9 or less: 6s into the next window.
				st(30*sec, 1, deny(0, 90*sec, 36*sec)),
				st(30*sec, 0, deny(0, 90*sec, 36*sec)),
				st(66*sec-100*us, 0, deny(0, 54*sec+100*us, 100*us)),
				st(66*sec-100*us, 1, deny(0, 54*sec+100*us, 100*us)),
				st(66*sec, 1, allow(0, 114*sec)),
				st(66*sec, 1, deny(0, 114*sec, 6*sec)),
				st(72*sec, 1, allow(0, 108*sec)),
				st(150*sec, 0, allow(9, 30*sec)),
				st(150*sec, 11, deny(9, 30*sec, time.Minute)),
				st(300*sec, 0, allow(10, 0)),
			},
		},
		{
			Name:  "SlidingWindow/10 per 1m mid-window",
			Limit: limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 10, Period: time.Minute},
			Base:  minuteAligned.Add(45 * sec),
			Steps: []Step{
				st(0, 10, allow(0, 75*sec)),
				st(15*sec, 1, deny(0, time.Minute, 6*sec)),
				st(45*sec, 5, allow(0, 90*sec)),
				// prev 10 weighs 4 or less 36s into the window.
				st(45*sec, 1, deny(0, 90*sec, 6*sec)),
			},
		},
		{
			Name:  "SlidingWindow/4 per 1s",
			Limit: limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 4, Period: sec},
			Base:  minuteAligned,
			Steps: []Step{
				st(0, 4, allow(0, 2*sec)),
				// Next window: prev 4 weighs 4*(1-e); room for 1 at e = 0.25s.
				st(sec, 1, deny(0, sec, 250*ms)),
				st(sec, 0, deny(0, sec, 250*ms)),
				st(1250*ms, 1, allow(0, 1750*ms)),
				// Cost 4 fits only when prev has gone and cur (1) has too:
				// in the window after next, when 1*(1-e) + 4 <= 4, at its end.
				st(1250*ms, 4, deny(0, 1750*ms, 1750*ms)),
			},
		},
		{
			Name:  "SlidingLog/3 per 10s",
			Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 3, Period: 10 * sec},
			Base:  offBase,
			Steps: []Step{
				st(0, 1, allow(2, 10*sec)),
				st(2*sec, 2, allow(0, 10*sec)),
				st(5*sec, 1, deny(0, 7*sec, 5*sec)),
				st(5*sec, 0, deny(0, 7*sec, 5*sec)),
				st(5*sec, 2, deny(0, 7*sec, 7*sec)),
				st(10*sec, 1, allow(0, 10*sec)),
				st(10*sec, 4, deny(0, 10*sec, 10*sec)),
				// The clock goes back 1s: the log keeps its newest instant.
				st(9*sec, 1, deny(0, 11*sec, 3*sec)),
				st(12*sec, 3, deny(2, 8*sec, 8*sec)),
				st(12*sec, 2, allow(0, 10*sec)),
				st(12*sec, 0, deny(0, 10*sec, 8*sec)),
			},
		},
		{
			Name:  "SlidingLog/2 per 366d",
			Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 2, Period: 366 * day},
			Base:  offBase,
			Steps: []Step{
				st(0, 1, allow(1, 366*day)),
				st(day, 1, allow(0, 366*day)),
				st(2*day, 1, deny(0, 365*day, 364*day)),
				st(2*day, 0, deny(0, 365*day, 364*day)),
				st(366*day, 1, allow(0, 366*day)),
			},
		},
	}...)
	tables = append(tables, edits...)
	for i := range tables {
		tables[i] = withLimit(tables[i])
	}
	return tables
}
