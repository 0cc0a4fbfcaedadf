// Package limitertest is the conformance suite for limiter.Store
// implementations. Run it from a store's tests, giving the store the clock
// the suite passes (nil: the store's own):
//
//	func TestConformance(t *testing.T) {
//		limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Store {
//			return newStore(t, now)
//		})
//	}
//
// The same step tables also run against the pure algorithms in package
// limiter, and Model is the brute-force reference both are compared to.
// Every subtest uses keys with a prefix of its own, so several subtests,
// or several runs, can share one Redis.
package limitertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// AllowFunc decides a request of cost n at t under l, for one key.
type AllowFunc func(t time.Time, n int64, l limiter.Limit) (limiter.Decision, error)

// RunTable applies tb's steps in order through allow and reports every
// decision that differs from the table.
func RunTable(t *testing.T, tb Table, allow AllowFunc) {
	t.Helper()
	l := tb.Limit
	for i, s := range tb.Steps {
		if s.Edit != nil {
			l = *s.Edit
		}
		at := tb.Base.Add(s.At)
		got, err := allow(at, s.Cost, l)
		if err != nil {
			t.Fatalf("step %d: AllowN(%v, %v): %v", i, at.UTC().Format(time.RFC3339Nano), s.Cost, err)
		}
		if got != s.Want {
			t.Errorf("step %d: AllowN(%v, %v) = %v, want %v", i, at.UTC().Format(time.RFC3339Nano), s.Cost, got, s.Want)
		}
	}
}

// Clock is a settable clock: give its Now to a store, and Set it before
// each request. It is safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock that reads t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the instant last set.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t, forwards or back.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var runSeq atomic.Int64

// keyPrefix returns a key prefix unique to this process, subtest and run.
func keyPrefix(t *testing.T) string {
	name := strings.NewReplacer(" ", "_", "/", ".").Replace(t.Name())
	return fmt.Sprintf("lt:%d:%d:%s:", time.Now().UnixNano(), runSeq.Add(1), name)
}

// Run runs the conformance suite against the stores newStore returns:
// stores whose clock is now, or their own clock when now is nil. It may
// call newStore once per subtest; stores are not required to be empty,
// since every subtest uses keys of its own.
func Run(t *testing.T, newStore func(t *testing.T, now func() time.Time) limiter.Store) {
	base := time.Unix(1_700_000_000, 0)
	t.Run("Tables", func(t *testing.T) {
		t.Parallel()
		for _, tb := range Tables() {
			t.Run(tb.Name, func(t *testing.T) {
				t.Parallel()
				clk := NewClock(tb.Base)
				s, key := newStore(t, clk.Now), keyPrefix(t)+"k"
				RunTable(t, tb, func(at time.Time, n int64, l limiter.Limit) (limiter.Decision, error) {
					clk.Set(at)
					return take(t.Context(), s, limiter.Request{Key: key, Limit: l, Cost: n})
				})
			})
		}
	})
	t.Run("Model", func(t *testing.T) {
		t.Parallel()
		for _, alg := range algorithms {
			t.Run(alg.String(), func(t *testing.T) {
				t.Parallel()
				clk := NewClock(base)
				s, prefix := newStore(t, clk.Now), keyPrefix(t)
				rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(alg)))
				for i := range 4 {
					l := RandomLimit(rng, alg)
					key := fmt.Sprintf("%s%d", prefix, i)
					CompareTrace(t, l, rng, 1000, func(now, n int64) (limiter.Decision, error) {
						clk.Set(time.UnixMicro(now))
						return take(t.Context(), s, limiter.Request{Key: key, Limit: l, Cost: n})
					})
				}
			})
		}
	})
	t.Run("Race", func(t *testing.T) {
		t.Parallel()
		for _, alg := range algorithms {
			t.Run(alg.String(), func(t *testing.T) {
				t.Parallel()
				testRace(t, newStore(t, NewClock(base.Add(123*time.Microsecond)).Now), keyPrefix(t)+"k", alg)
			})
		}
	})
	t.Run("Peek", func(t *testing.T) {
		t.Parallel()
		for _, alg := range algorithms {
			t.Run(alg.String(), func(t *testing.T) {
				t.Parallel()
				testPeek(t, newStore, alg)
			})
		}
	})
	t.Run("KeysIndependent", func(t *testing.T) {
		t.Parallel()
		s, prefix := newStore(t, NewClock(base).Now), keyPrefix(t)
		l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 2, Period: time.Minute}
		for i := range 50 {
			key := fmt.Sprintf("%s%d", prefix, i)
			for j := range 3 {
				d, err := take(t.Context(), s, limiter.Request{Key: key, Limit: l, Cost: 1})
				if err != nil {
					t.Fatalf("Take(%s): %v", key, err)
				}
				if got, want := d.Allowed, j < 2; got != want {
					t.Fatalf("key %d request %d: Allowed = %v, want %v", i, j, got, want)
				}
			}
		}
	})
	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		clk := NewClock(base)
		s, key := newStore(t, clk.Now), keyPrefix(t)+"k"
		good := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 2, Period: time.Minute}
		bad := []struct {
			req limiter.Request
			at  time.Time
		}{
			{limiter.Request{Key: key, Limit: good, Cost: -1}, base},
			{limiter.Request{Key: key, Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 0, Period: time.Minute}, Cost: 1}, base},
			{limiter.Request{Key: key, Limit: limiter.Limit{Requests: 5, Period: time.Minute}, Cost: 1}, base},
			{limiter.Request{Key: key, Limit: good, Cost: 1}, time.Unix(-5, 0)}, // before the epoch
		}
		for i, b := range bad {
			clk.Set(b.at)
			if _, err := take(t.Context(), s, b.req); err == nil || errors.Is(err, limiter.ErrUnavailable) {
				t.Errorf("request %d (%+v at %v): err = %v, want a validation error", i, b.req, b.at, err)
			}
		}
		// None of them spent anything.
		clk.Set(base)
		for j := range 3 {
			d, err := take(t.Context(), s, limiter.Request{Key: key, Limit: good, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := d.Allowed, j < 2; got != want {
				t.Fatalf("request %d after bad input: Allowed = %v, want %v", j, got, want)
			}
		}
	})
	t.Run("ClockDefault", func(t *testing.T) {
		t.Parallel()
		// Without a clock the store uses its own (Redis TIME, time.Now):
		// a full bucket admits exactly its capacity at once.
		s, key := newStore(t, nil), keyPrefix(t)+"k"
		l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 3, Period: time.Hour}
		for j := range 4 {
			d, err := take(t.Context(), s, limiter.Request{Key: key, Limit: l, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := d.Allowed, j < 3; got != want {
				t.Fatalf("request %d: Allowed = %v, want %v (%v)", j, got, want, d)
			}
		}
	})
}

var algorithms = []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow, limiter.SlidingLog}

// testRace has 1000 goroutines take 1 at the same instant, the one s's
// clock reads, from a key of capacity 10: exactly 10 must win.
func testRace(t *testing.T, s limiter.Store, key string, alg limiter.Algorithm) {
	l := limiter.Limit{Algorithm: alg, Requests: 10, Period: time.Hour}
	var wins, errs atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 1000 {
		wg.Go(func() {
			<-start
			d, err := take(context.Background(), s, limiter.Request{Key: key, Limit: l, Cost: 1})
			switch {
			case err != nil:
				errs.Add(1)
			case d.Allowed:
				wins.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := errs.Load(); n != 0 {
		t.Fatalf("%d of 1000 takes failed", n)
	}
	if got, want := wins.Load(), int64(10); got != want {
		t.Fatalf("%d of 1000 goroutines won, want %d", got, want)
	}
}

// testPeek drives two keys of one store through the same requests, with
// peeks (cost 0) on one of them only. A peek must be decided as a cost of
// 1 at the same instant (allowed on a key with units left, denied with a
// wait on an exhausted one), and it must change nothing: the two keys
// answer every request alike.
func testPeek(t *testing.T, newStore func(t *testing.T, now func() time.Time) limiter.Store, alg limiter.Algorithm) {
	clk := NewClock(minuteAligned.Add(10 * sec))
	base := clk.Now()
	s, prefix := newStore(t, clk.Now), keyPrefix(t)
	peeked, plain := prefix+"peeked", prefix+"plain"
	l := limiter.Limit{Algorithm: alg, Requests: 3, Period: time.Minute}
	for i, step := range []struct {
		at   time.Duration
		cost int64
		// The peeks before the request: allowed, and with what left.
		allowed   bool
		remaining int64
	}{
		{0, 1, true, 3}, // a key never seen
		{0, 2, true, 2},
		{0, 1, false, 0}, // exhausted
		{us, 1, false, 0},
		{19 * sec, 1, false, 0}, // TokenBucket and GCRA: a unit every 20s
		// Every algorithm has its 3 units back 150s on: the bucket has
		// refilled, the window and the log have moved on.
		{150 * sec, 3, true, 3},
		{150 * sec, 1, false, 0},
	} {
		at := base.Add(step.at)
		clk.Set(at)
		var peek limiter.Decision
		for j := range 3 {
			d, err := take(t.Context(), s, limiter.Request{Key: peeked, Limit: l, Cost: 0})
			if err != nil {
				t.Fatalf("step %d: peek %d: %v", i, j, err)
			}
			if j > 0 && d != peek {
				t.Fatalf("step %d: peek %d = %v, the first was %v: a peek changed the key", i, j, d, peek)
			}
			peek = d
		}
		if peek.Allowed != step.allowed || peek.Remaining != step.remaining || peek.Limit != 3 {
			t.Fatalf("step %d: AllowN(%v, 0) = %v, want allowed %v with %d remaining", i, at.UTC().Format(time.RFC3339Nano), peek, step.allowed, step.remaining)
		}
		if peek.Allowed && peek.RetryAfter != 0 || !peek.Allowed && peek.RetryAfter <= 0 {
			t.Fatalf("step %d: peek = %v: an allow must not wait, a deny must", i, peek)
		}
		got, err := take(t.Context(), s, limiter.Request{Key: peeked, Limit: l, Cost: step.cost})
		if err != nil {
			t.Fatal(err)
		}
		want, err := take(t.Context(), s, limiter.Request{Key: plain, Limit: l, Cost: step.cost})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("step %d: AllowN(%v, %d) = %v after peeks, %v without", i, at.UTC().Format(time.RFC3339Nano), step.cost, got, want)
		}
		if step.cost != 1 {
			continue
		}
		// The peek was decided as this cost of 1: the same deny, or an
		// allow with the unit it did not spend.
		if want.Allowed {
			want.Remaining++
			want.ResetAfter = peek.ResetAfter
		}
		if peek != want {
			t.Fatalf("step %d: peek = %v, want %v, as a cost of 1", i, peek, want)
		}
	}
}

// RandomLimit returns a valid limit of algorithm alg with small numbers, so
// that random traces hit every boundary often, and with periods and rates
// that exercise non-integer emission intervals.
func RandomLimit(rng *rand.Rand, alg limiter.Algorithm) limiter.Limit {
	periods := []time.Duration{time.Second, 1500 * time.Millisecond, 7 * time.Second, time.Minute, 1_000_001 * time.Microsecond}
	l := limiter.Limit{
		Algorithm: alg,
		Requests:  1 + rng.Int64N(12),
		Period:    periods[rng.IntN(len(periods))],
	}
	if (alg == limiter.TokenBucket || alg == limiter.GCRA) && rng.IntN(2) == 0 {
		l.Burst = 1 + rng.Int64N(20)
	}
	return l
}

// RandomDelayLimit returns a valid GCRA limit that delays (MaxDelay), with
// small numbers as RandomLimit's: a capacity of 1 to 4 (delayAfter), a
// MaxDelay from a microsecond to a few emission intervals.
func RandomDelayLimit(rng *rand.Rand) limiter.Limit {
	l := RandomLimit(rng, limiter.GCRA)
	l.Burst = 1 + rng.Int64N(4)
	interval := l.Period / time.Duration(l.Requests)
	delays := []time.Duration{time.Microsecond, interval / 3, interval, 3*interval + 7*time.Microsecond, 10 * interval}
	l.MaxDelay = max(time.Microsecond, min(limiter.MaxMaxDelay, delays[rng.IntN(len(delays))].Truncate(time.Microsecond)))
	return l
}

// CompareTrace drives a fresh key under l through steps random requests,
// with the clock moving forward by random amounts (zero, a microsecond, a
// fraction of the emission interval, up to two periods), and fails on the
// first decision that differs from Model's.
func CompareTrace(t testing.TB, l limiter.Limit, rng *rand.Rand, steps int, take func(now, n int64) (limiter.Decision, error)) {
	t.Helper()
	m, err := NewModel(l)
	if err != nil {
		t.Fatal(err)
	}
	per := l.Period.Microseconds()
	interval := max(1, per/l.Requests)
	now := 1_700_000_000_000_000 + rng.Int64N(per)
	most := l.Capacity()
	if l.MaxDelay > 0 {
		// A delaying limit admits costs above the capacity too.
		p, err := limiter.NewParams(l)
		if err != nil {
			t.Fatal(err)
		}
		most = p.MaxReserve
	}
	for i := range steps {
		now = advance(rng, now, per, interval)
		n := rng.Int64N(most + 2)
		if rng.IntN(3) > 0 {
			n = min(n, 1+rng.Int64N(2))
		}
		got, err := take(now, n)
		if err != nil {
			t.Fatalf("%v step %d: AllowN(%d, %d): %v", l, i, now, n, err)
		}
		if want := m.AllowN(now, n); got != want {
			t.Fatalf("%v step %d: AllowN(%d, %d) = %v, want %v (model)", l, i, now, n, got, want)
		}
		if !got.Allowed && got.RetryAfter <= 0 {
			t.Fatalf("%v step %d: deny with RetryAfter %v", l, i, got.RetryAfter)
		}
		if got.Wait < 0 || got.Wait > l.MaxDelay || (got.Wait > 0 && !got.Allowed) {
			t.Fatalf("%v step %d: %v: a wait outside 0..MaxDelay, or on a deny", l, i, got)
		}
	}
}

// advance moves a trace's clock forward by a random amount: zero, a
// microsecond, a fraction of the emission interval, up to two periods.
func advance(rng *rand.Rand, now, per, interval int64) int64 {
	switch rng.IntN(6) {
	case 0:
	case 1:
		now += 1 + rng.Int64N(3)
	case 2, 3:
		now += rng.Int64N(interval + 1)
	case 4:
		now += rng.Int64N(per/4 + 1)
	default:
		now += rng.Int64N(2*per + 1)
	}
	return now
}

// take is s.Take without the shard.
func take(ctx context.Context, s limiter.Store, req limiter.Request) (limiter.Decision, error) {
	d, _, err := s.Take(ctx, req)
	return d, err
}
