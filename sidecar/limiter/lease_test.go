package limiter_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
)

// leaser applies lease calls to one key's fixed-size state, as a store does.
type leaser struct {
	p, sp *limiter.Params
	s     limiter.State
}

func newLeaser(t testing.TB, l limiter.Limit) *leaser {
	p, err := limiter.NewParams(l)
	if err != nil {
		t.Fatal(err)
	}
	return &leaser{p: p, sp: p}
}

func (k *leaser) lease(now int64, a limiter.LeaseArgs) (limiter.Lease, error) {
	l, _, err := k.p.Lease(&k.s, k.sp, now, a)
	return l, err
}

// TestLeaseTables runs the lease step tables against the pure math.
func TestLeaseTables(t *testing.T) {
	t.Parallel()
	for _, tb := range limitertest.LeaseTables() {
		t.Run(tb.Name, func(t *testing.T) {
			t.Parallel()
			k := newLeaser(t, tb.Limit)
			limitertest.RunLeaseTable(t, tb, func(at time.Time, a limiter.LeaseArgs, _ limiter.Limit) (limiter.Lease, error) {
				return k.lease(at.UnixMicro(), a)
			})
		})
	}
}

// TestLeaseTablesAgainstModel checks the hand-written lease tables against
// the brute-force model.
func TestLeaseTablesAgainstModel(t *testing.T) {
	t.Parallel()
	for _, tb := range limitertest.LeaseTables() {
		t.Run(tb.Name, func(t *testing.T) {
			t.Parallel()
			m, err := limitertest.NewModel(tb.Limit)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tb.Steps {
				at := tb.Base.Add(s.At)
				if got := m.Lease(at.UnixMicro(), s.Args); got != s.Want {
					t.Errorf("step %d: Lease(%v, %+v) = %v, want %v (model)", i, at, s.Args, got, s.Want)
				}
			}
		})
	}
}

var leasableAlgorithms = []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow}

// TestLeaseTracesMatchModel compares the lease math with the model over
// random traces of takes, leases, takes ahead of need and returns.
func TestLeaseTracesMatchModel(t *testing.T) {
	t.Parallel()
	for _, alg := range leasableAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			rng := seed(t)
			for range 8 {
				l := limitertest.RandomLimit(rng, alg)
				k := newLeaser(t, l)
				limitertest.CompareLeaseTrace(t, l, rng, 1500, k.lease)
			}
		})
	}
}

// TestLeaseTracesExtremeLimits compares the lease math with the model for
// very large and very small limits, where the products are largest.
func TestLeaseTracesExtremeLimits(t *testing.T) {
	t.Parallel()
	limits := []limiter.Limit{
		{Requests: 1_000_000_000, Period: time.Second},
		{Requests: 999_999_937, Period: time.Second, Burst: 1_000_000_000},
		{Requests: 1, Period: 366 * 24 * time.Hour},
		{Requests: 123_457, Period: 30 * 24 * time.Hour},
		{Requests: 999_999_937, Period: 366 * 24 * time.Hour, Burst: 400_000_000},
		{Requests: 3, Period: 1_234_567 * time.Microsecond},
	}
	for _, alg := range leasableAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			rng := seed(t)
			for _, l := range limits {
				l.Algorithm = alg
				if alg != limiter.TokenBucket && alg != limiter.GCRA {
					l.Burst = 0
				}
				if l.Validate() != nil {
					continue
				}
				k := newLeaser(t, l)
				limitertest.CompareLeaseTrace(t, l, rng, 300, k.lease)
			}
		})
	}
}

// TestLeaseOfCostIsTake: a lease call that wants only its cost and returns
// nothing decides and writes exactly as Take.
func TestLeaseOfCostIsTake(t *testing.T) {
	t.Parallel()
	rng := seed(t)
	for _, alg := range leasableAlgorithms {
		for range 6 {
			l := limitertest.RandomLimit(rng, alg)
			p, err := limiter.NewParams(l)
			if err != nil {
				t.Fatal(err)
			}
			var sTake, sLease limiter.State
			now := int64(1_700_000_000_000_000)
			for i := range 500 {
				now += rng.Int64N(l.Period.Microseconds()/3 + 1)
				n := rng.Int64N(l.Capacity() + 2)
				d, wTake, err := p.Take(&sTake, p, now, n)
				if err != nil {
					t.Fatal(err)
				}
				got, wLease, err := p.Lease(&sLease, p, now, limiter.LeaseArgs{Cost: n, Want: n})
				if err != nil {
					t.Fatal(err)
				}
				if got.Decision != d || wLease != wTake || sLease != sTake {
					t.Fatalf("%v step %d: Lease(%d, want %d) = %v (write %v, state %+v), Take = %v (write %v, state %+v)", l, i, n, n, got, wLease, sLease, d, wTake, sTake)
				}
				if want := map[bool]int64{true: n, false: 0}[d.Allowed]; got.Granted != want {
					t.Fatalf("%v step %d: granted %d, want %d", l, i, got.Granted, want)
				}
			}
		}
	}
}

// TestLeaseErrors: bad arguments and SlidingLog are refused, and change
// nothing.
func TestLeaseErrors(t *testing.T) {
	t.Parallel()
	k := newLeaser(t, limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 5, Period: time.Second})
	for i, c := range []struct {
		a    limiter.LeaseArgs
		now  int64
		want error
	}{
		{limiter.LeaseArgs{Cost: -1}, 1, limiter.ErrNegativeCost},
		{limiter.LeaseArgs{Want: -2}, 1, limiter.ErrNegativeCost},
		{limiter.LeaseArgs{Return: -3}, 1, limiter.ErrNegativeCost},
		{limiter.LeaseArgs{Cost: 1}, -1, limiter.ErrTimeRange},
	} {
		if _, err := k.lease(c.now, c.a); !errors.Is(err, c.want) {
			t.Errorf("case %d: Lease(%d, %+v) error %v, want %v", i, c.now, c.a, err, c.want)
		}
	}
	if k.s.Set {
		t.Errorf("state written by refused calls: %+v", k.s)
	}
	sl := newLeaser(t, limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 5, Period: time.Second})
	if _, err := sl.lease(1, limiter.LeaseArgs{Cost: 1, Want: 2}); !errors.Is(err, limiter.ErrNotLeasable) {
		t.Errorf("SlidingLog lease: %v, want ErrNotLeasable", err)
	}
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow, limiter.SlidingLog} {
		if got, want := alg.Leasable(), alg != limiter.SlidingLog; got != want {
			t.Errorf("%v.Leasable() = %v, want %v", alg, got, want)
		}
	}
}

// TestLeaseSize: the size follows the local rate over the horizon, the
// window's end, the cap on a share of the capacity and the share of what
// the key has left, and is at least the cost.
func TestLeaseSize(t *testing.T) {
	t.Parallel()
	p, err := limiter.NewParams(limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1000, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	base := limiter.LeaseSizing{Cost: 1, Rate: 500, Horizon: 100 * time.Millisecond, MaxFraction: 0.5, Available: -1}
	for i, c := range []struct {
		edit func(z *limiter.LeaseSizing)
		want int64
	}{
		{func(z *limiter.LeaseSizing) {}, 50},                                     // 500/s for 100ms
		{func(z *limiter.LeaseSizing) { z.Until = 10 * time.Millisecond }, 5},     // the window ends first
		{func(z *limiter.LeaseSizing) { z.Until = time.Second }, 50},              // a later end changes nothing
		{func(z *limiter.LeaseSizing) { z.Rate = 50000 }, 500},                    // capped at half the capacity
		{func(z *limiter.LeaseSizing) { z.MaxFraction = 0.01 }, 10},               // capped at 1%
		{func(z *limiter.LeaseSizing) { z.Available = 40 }, 20},                   // half the traffic: half of 40
		{func(z *limiter.LeaseSizing) { z.Available = 40; z.Rate = 4000 }, 40},    // all of it above the limit's rate
		{func(z *limiter.LeaseSizing) { z.Available = 0 }, 1},                     // nothing left: the request alone
		{func(z *limiter.LeaseSizing) { z.Rate = 1 }, 1},                          // too slow to lease
		{func(z *limiter.LeaseSizing) { z.Cost = 80 }, 80},                        // never below the cost
		{func(z *limiter.LeaseSizing) { z.Rate = 1e12; z.MaxFraction = 1 }, 1000}, // never above the capacity
	} {
		z := base
		c.edit(&z)
		if got := p.LeaseSize(z); got != c.want {
			t.Errorf("case %d: LeaseSize(%+v) = %d, want %d", i, z, got, c.want)
		}
	}
}

// TestSplitLimit: the sub-limits add up to the limit exactly, and a split
// the limit cannot take is refused naming the field.
func TestSplitLimit(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 16 + rng.Int64N(1e6), Period: time.Second}
		if rng.IntN(2) == 0 {
			l.Burst = 16 + rng.Int64N(1e6)
		}
		k := 1 + rng.IntN(limiter.MaxSplit)
		if err := l.ValidateSplit(k); err != nil {
			t.Fatalf("%v split %d: %v", l, k, err)
		}
		var req, burst int64
		for i := range k {
			s := limiter.SplitLimit(l, i, k)
			req += s.Requests
			burst += s.Burst
			if s.Period != l.Period || s.Algorithm != l.Algorithm {
				t.Fatalf("sub-limit %d of %v: %v", i, l, s)
			}
		}
		if req != l.Requests || burst != l.Burst {
			t.Fatalf("%v split %d: sub-limits add up to %d requests, burst %d", l, k, req, burst)
		}
	}
	for i, c := range []struct {
		l limiter.Limit
		k int
	}{
		{limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second}, 0},
		{limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second}, limiter.MaxSplit + 1},
		{limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 2, Period: time.Second}, 3},
		{limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 100, Period: time.Second, Burst: 2}, 3},
	} {
		err := c.l.ValidateSplit(c.k)
		if err == nil || err.Error()[:6] != "split:" {
			t.Errorf("case %d: %v split %d: %v, want an error on split", i, c.l, c.k, err)
		}
	}
}
