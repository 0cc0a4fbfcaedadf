package limiter_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
)

const t0 = int64(1_700_000_000_123_457) // µs, not aligned to anything

// TestPeekChangesNothing: a cost-0 request (a peek) is decided as a cost
// of 1 would be at the same instant, and never changes what later
// requests get.
func TestPeekChangesNothing(t *testing.T) {
	t.Parallel()
	rng := seed(t)
	for _, alg := range allAlgorithms {
		for range 5 {
			l := limitertest.RandomLimit(rng, alg)
			peeked, plain := pureTake(t, l), pureTake(t, l)
			// history replays the requests so far into a fresh key, which
			// a cost of 1 may then spend without touching the others.
			type req struct{ now, n int64 }
			var history []req
			one := func(now int64) limiter.Decision {
				t.Helper()
				fresh := pureTake(t, l)
				for _, r := range history {
					if _, err := fresh(r.now, r.n); err != nil {
						t.Fatal(err)
					}
				}
				d, err := fresh(now, 1)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			now := t0
			denied, allowed := 0, 0
			peek := func(i int) {
				t.Helper()
				d, err := peeked(now, 0)
				if err != nil {
					t.Fatal(err)
				}
				want := one(now)
				if want.Allowed {
					// The same answer, less the unit a cost of 1 spent.
					// ResetAfter describes the key unspent: the model
					// traces check it.
					want.Remaining++
					want.ResetAfter = d.ResetAfter
					allowed++
				} else {
					denied++
				}
				if d != want {
					t.Fatalf("%v step %d: peek = %v, want %v (as a cost of 1)", l, i, d, want)
				}
				if d.Allowed != (d.Remaining >= 1) || !d.Allowed && d.RetryAfter <= 0 {
					t.Fatalf("%v step %d: peek = %v: allowed must be remaining >= 1, a deny must wait", l, i, d)
				}
			}
			var last limiter.Decision
			for i := range 300 {
				now += rng.Int64N(l.Period.Microseconds() / 3)
				if rng.IntN(2) == 0 {
					peek(i)
				}
				n := 1 + rng.Int64N(l.Capacity())
				if rng.IntN(3) == 0 && last.Remaining > 0 {
					n = last.Remaining // empties the key
				}
				d1, err1 := peeked(now, n)
				d2, err2 := plain(now, n)
				if err1 != nil || err2 != nil || d1 != d2 {
					t.Fatalf("%v step %d: with peeks %v (%v), without %v (%v)", l, i, d1, err1, d2, err2)
				}
				history = append(history, req{now, n})
				last = d2
				if rng.IntN(2) == 0 {
					peek(i)
				}
			}
			if denied == 0 || allowed == 0 {
				t.Errorf("%v: %d peeks allowed, %d denied: want some of each", l, allowed, denied)
			}
		}
	}
}

// TestOversizeCost: a cost above the capacity is always denied, spends
// nothing, and gets RetryAfter = Period.
func TestOversizeCost(t *testing.T) {
	t.Parallel()
	rng := seed(t)
	for _, alg := range allAlgorithms {
		for range 5 {
			l := limitertest.RandomLimit(rng, alg)
			over, plain := pureTake(t, l), pureTake(t, l)
			now := t0
			for i := range 300 {
				now += rng.Int64N(l.Period.Microseconds() / 3)
				for _, n := range []int64{l.Capacity() + 1, l.Capacity() + 1 + rng.Int64N(1e9), math.MaxInt64} {
					d, err := over(now, n)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed || d.RetryAfter != l.Period {
						t.Fatalf("%v step %d: AllowN(%d, %d) = %v, want deny with RetryAfter %v", l, i, now, n, d, l.Period)
					}
				}
				d1, _ := over(now, 1)
				d2, _ := plain(now, 1)
				if d1 != d2 {
					t.Fatalf("%v step %d: after oversize requests %v, without %v", l, i, d1, d2)
				}
			}
		}
	}
}

// TestClockBackwardsMintsNothing: jumping between an instant and one far
// before it never admits more than the capacity, for every algorithm.
func TestClockBackwardsMintsNothing(t *testing.T) {
	t.Parallel()
	rng := seed(t)
	for _, alg := range allAlgorithms {
		for range 10 {
			l := limitertest.RandomLimit(rng, alg)
			take := pureTake(t, l)
			per := l.Period.Microseconds()
			past := []int64{1, per / 2, per, 3 * per, 1000 * per}[rng.IntN(5)]
			var admitted int64
			for i := range 400 {
				now := t0
				if i%2 == 1 {
					now -= past + rng.Int64N(3)
				}
				d, err := take(now, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				} else if d.RetryAfter <= 0 {
					t.Fatalf("%v step %d: deny with RetryAfter %v", l, i, d.RetryAfter)
				}
			}
			if admitted > l.Capacity() {
				t.Fatalf("%v: jumping back %dµs admitted %d, capacity %d", l, past, admitted, l.Capacity())
			}
		}
	}
}

// extremeLimit returns a random valid limit anywhere in the bounds.
func extremeLimit(rng *rand.Rand, alg limiter.Algorithm) limiter.Limit {
	for {
		l := limiter.Limit{Algorithm: alg}
		switch rng.IntN(3) {
		case 0:
			l.Requests = 1 + rng.Int64N(limiter.MaxRequests)
		case 1:
			l.Requests = 1 + rng.Int64N(1000)
		default:
			l.Requests = limiter.MaxRequests - rng.Int64N(3)
		}
		switch rng.IntN(3) {
		case 0:
			l.Period = time.Duration(1+rng.Int64N(int64(limiter.MaxPeriod/time.Second))) * time.Second
		case 1:
			l.Period = limiter.MinPeriod + time.Duration(rng.Int64N(int64(limiter.MaxPeriod-limiter.MinPeriod)/1000))*time.Microsecond
		default:
			l.Period = []time.Duration{limiter.MinPeriod, limiter.MaxPeriod}[rng.IntN(2)]
		}
		if alg == limiter.TokenBucket || alg == limiter.GCRA {
			l.Burst = rng.Int64N(limiter.MaxRequests + 1)
		}
		if alg == limiter.SlidingLog {
			l.Requests = 1 + l.Requests%limiter.MaxLogRequests
		}
		if l.Validate() == nil {
			return l
		}
	}
}

// TestExtremesInvariants drives limits from anywhere in the bounds with
// times anywhere in [epoch, 2^53µs) and costs up to 2e9, and checks what
// must always hold: no error, Remaining within [0, capacity], a deny has a
// RetryAfter of at least 1µs after which the same request is admitted, and
// an allow has none. Under overflow or float truncation these break.
func TestExtremesInvariants(t *testing.T) {
	t.Parallel()
	rng := seed(t)
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow} {
		for range 300 {
			l := extremeLimit(rng, alg)
			p, err := l.Params()
			if err != nil {
				t.Fatal(err)
			}
			var s limiter.State
			sp := p
			now := rng.Int64N(1<<53 - 2*limiter.MaxFillTime.Microseconds())
			for i := range 60 {
				now += []int64{0, 1, rng.Int64N(p.PeriodMicros), rng.Int64N(limiter.MaxFillTime.Microseconds() / 100)}[rng.IntN(4)]
				n := []int64{0, 1, rng.Int64N(p.Capacity + 1), p.Capacity, rng.Int64N(2e9)}[rng.IntN(5)]
				before := s
				d, _, err := p.Take(&s, sp, now, n)
				if err != nil {
					t.Fatalf("%v step %d: Take(%d, %d): %v", l, i, now, n, err)
				}
				if d.Remaining < 0 || d.Remaining > p.Capacity || d.ResetAfter < 0 || d.Limit != p.Capacity {
					t.Fatalf("%v step %d: Take(%d, %d) = %v out of range", l, i, now, n, d)
				}
				if d.Allowed != (d.RetryAfter == 0) {
					t.Fatalf("%v step %d: Take(%d, %d) = %v: RetryAfter must be 0 exactly when allowed", l, i, now, n, d)
				}
				if d.Allowed || n > p.Capacity {
					continue
				}
				// Retrying at now+RetryAfter is admitted, and not a
				// microsecond earlier.
				retry := d.RetryAfter.Microseconds()
				at := before
				if d2, _, _ := p.Take(&at, sp, now+retry, n); !d2.Allowed {
					t.Fatalf("%v step %d: Take(%d, %d) = %v, but at +RetryAfter still %v", l, i, now, n, d, d2)
				}
				if retry > 1 {
					at = before
					if d2, _, _ := p.Take(&at, sp, now+retry-1, n); d2.Allowed {
						t.Fatalf("%v step %d: Take(%d, %d) = %v, but admitted 1µs before RetryAfter", l, i, now, n, d)
					}
				}
			}
		}
	}
}

func TestTakeErrors(t *testing.T) {
	t.Parallel()
	lim, err := limiter.New(limiter.Limit{Algorithm: limiter.GCRA, Requests: 5, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.AllowN(time.UnixMicro(t0), -1); !errors.Is(err, limiter.ErrNegativeCost) {
		t.Errorf("AllowN(-1) err = %v, want ErrNegativeCost", err)
	}
	for _, at := range []time.Time{time.Unix(-1, 0), time.UnixMicro(1 << 53), {}} {
		if _, err := lim.AllowN(at, 1); !errors.Is(err, limiter.ErrTimeRange) {
			t.Errorf("AllowN(%v) err = %v, want ErrTimeRange", at, err)
		}
	}
	p, _ := limiter.NewParams(limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 5, Period: time.Second})
	if _, _, err := p.Take(&limiter.State{}, nil, t0, 1); err == nil {
		t.Error("Take with SlidingLog params: want an error")
	}
	q, _ := limiter.NewParams(limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 5, Period: time.Second})
	if _, _, err := q.TakeLog(&limiter.Log{}, t0, 1); err == nil {
		t.Error("TakeLog with FixedWindow params: want an error")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		l    limiter.Limit
		want []string // substrings of the error, none for valid
	}{
		{limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: time.Second}, nil},
		{limiter.Limit{Algorithm: limiter.TokenBucket, Requests: limiter.MaxRequests, Period: limiter.MaxPeriod, Burst: limiter.MaxRequests}, nil},
		{limiter.Limit{Algorithm: limiter.GCRA, Requests: 123_457, Period: 30 * 24 * time.Hour}, nil},
		{limiter.Limit{}, []string{"algorithm:", "requests:", "per:"}},
		{limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Period: time.Second, Burst: 3}, []string{"burst: only TokenBucket"}},
		{limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Period: time.Second + time.Nanosecond}, []string{"per: must be a whole number of microseconds"}},
		{limiter.Limit{Algorithm: limiter.SlidingLog, Requests: limiter.MaxLogRequests + 1, Period: time.Second}, []string{"requests: SlidingLog"}},
		{limiter.Limit{Algorithm: limiter.SlidingLog, Requests: limiter.MaxLogRequests, Period: time.Second}, nil},
		// Burst 1e9 at 1 per 10s takes 317 years to refill.
		{limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1, Period: 10 * time.Second, Burst: limiter.MaxRequests}, []string{"burst: a capacity of 1000000000", "to refill"}},
		// A prime rate over 366 days and a period with no factor of ten.
		{limiter.Limit{Algorithm: limiter.GCRA, Requests: 999_999_937, Period: limiter.MaxPeriod - time.Microsecond, Burst: 900_000_000}, []string{"cannot be computed exactly"}},
	}
	for _, tt := range tests {
		err := tt.l.Validate()
		if len(tt.want) == 0 {
			if err != nil {
				t.Errorf("%v: Validate() = %v, want nil", tt.l, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%v: Validate() = nil, want an error with %q", tt.l, tt.want)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: Validate() = %v, want it to contain %q", tt.l, err, w)
			}
		}
		if _, perr := limiter.NewParams(tt.l); perr == nil {
			t.Errorf("%v: NewParams accepted an invalid limit", tt.l)
		}
	}
}

func TestParams(t *testing.T) {
	t.Parallel()
	tests := []struct {
		l    limiter.Limit
		want limiter.Params
	}{
		{limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: time.Second},
			limiter.Params{Capacity: 10, PeriodMicros: 1e6, TickMicros: 1, TickUnits: 1, TokenUnits: 1e5, CapacityUnits: 1e6, FullTicks: 1e6}},
		{limiter.Limit{Algorithm: limiter.GCRA, Requests: 3, Period: time.Second, Burst: 7},
			limiter.Params{Capacity: 7, PeriodMicros: 1e6, TickMicros: 1, TickUnits: 3, TokenUnits: 1e6, CapacityUnits: 7e6, FullTicks: 2333334}},
		// No common factor and a long period: the clock ticks in ms.
		{limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 123_457, Period: 30 * 24 * time.Hour},
			limiter.Params{Capacity: 123_457, PeriodMicros: 2_592_000_000_000, TickMicros: 1000, TickUnits: 123_457, TokenUnits: 2_592_000_000, CapacityUnits: 123_457 * 2_592_000_000, FullTicks: 2_592_000_000}},
		{limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 10, Period: time.Minute},
			limiter.Params{Capacity: 10, PeriodMicros: 6e7, TickMicros: 100, WindowTicks: 600_000}},
		{limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 10, Period: limiter.MaxPeriod},
			limiter.Params{Capacity: 10, PeriodMicros: 31_622_400_000_000, TickMicros: 1e8, WindowTicks: 316_224}},
		{limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Period: time.Minute},
			limiter.Params{Capacity: 10, PeriodMicros: 6e7}},
	}
	for _, tt := range tests {
		p, err := limiter.NewParams(tt.l)
		if err != nil {
			t.Fatalf("NewParams(%v): %v", tt.l, err)
		}
		tt.want.Limit = tt.l
		if *p != tt.want {
			t.Errorf("NewParams(%v) = %+v, want %+v", tt.l, *p, tt.want)
		}
	}
}

func TestStateTTL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want time.Duration }{
		{0, time.Second},
		{time.Microsecond, time.Second + time.Millisecond},
		{time.Millisecond, time.Second + time.Millisecond},
		{1500 * time.Microsecond, time.Second + 2*time.Millisecond},
		{time.Hour, time.Hour + time.Second},
		{-time.Second, time.Second},
	} {
		if got := limiter.StateTTL(tt.in); got != tt.want {
			t.Errorf("StateTTL(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestParseAlgorithm(t *testing.T) {
	t.Parallel()
	for _, a := range allAlgorithms {
		got, err := limiter.ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := limiter.ParseAlgorithm("LeakyBucket"); err == nil {
		t.Error("ParseAlgorithm(LeakyBucket): want an error")
	}
}

// FuzzAllowN drives a limit chosen by the fuzzer through a trace chosen by
// the fuzzer, comparing every decision with the brute-force model.
func FuzzAllowN(f *testing.F) {
	f.Add(uint8(0), uint32(10), uint8(0), uint32(0), []byte{0, 1, 5, 1, 200, 3, 0, 0, 255, 11})
	f.Add(uint8(1), uint32(3), uint8(2), uint32(5), []byte{1, 1, 1, 1, 1, 1, 90, 2})
	f.Add(uint8(2), uint32(7), uint8(3), uint32(0), []byte{255, 7, 0, 1, 128, 8})
	f.Add(uint8(3), uint32(4), uint8(4), uint32(0), []byte{10, 4, 10, 1, 250, 1, 0, 2})
	f.Add(uint8(4), uint32(5), uint8(1), uint32(0), []byte{0, 5, 30, 1, 60, 2, 255, 5})
	periods := []time.Duration{time.Second, 1500 * time.Millisecond, 7 * time.Second, time.Minute, 1_000_003 * time.Microsecond, time.Hour}
	f.Fuzz(func(t *testing.T, alg uint8, requests uint32, period uint8, burst uint32, trace []byte) {
		l := limiter.Limit{
			Algorithm: limiter.Algorithm(alg%5 + 1),
			Requests:  1 + int64(requests%50),
			Period:    periods[int(period)%len(periods)],
		}
		if l.Algorithm == limiter.TokenBucket || l.Algorithm == limiter.GCRA {
			l.Burst = int64(burst % 60)
		}
		m, err := limitertest.NewModel(l)
		if err != nil {
			t.Fatal(err)
		}
		take := pureTake(t, l)
		per := l.Period.Microseconds()
		now := t0
		for i := 0; i+1 < len(trace) && i < 400; i += 2 {
			// The first byte moves the clock by a fraction of a period
			// (squared so small steps are common), the second is the cost.
			step := int64(trace[i])
			now += step * step * per / (255 * 64)
			n := int64(trace[i+1]) % (l.Capacity() + 3)
			got, err := take(now, n)
			if err != nil {
				t.Fatal(err)
			}
			if want := m.AllowN(now, n); got != want {
				t.Fatalf("%v step %d: AllowN(%d, %d) = %v, want %v (model)", l, i/2, now, n, got, want)
			}
		}
	})
}
