package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestLeaseConformance runs the lease suite against the lease scripts on
// the cluster.
func TestLeaseConformance(t *testing.T) {
	t.Parallel()
	limitertest.RunLease(t, func(t *testing.T, now func() time.Time) limitertest.LeaseStore {
		return newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: now})
	})
}

// TestLeaseConformanceSingleNode runs the lease suite on one standalone
// server.
func TestLeaseConformanceSingleNode(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	limitertest.RunLease(t, func(t *testing.T, now func() time.Time) limitertest.LeaseStore {
		s, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr()}, Single: true, Timeout: suiteTimeout, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestLeaseDifferentialExtremes drives the lease scripts and the pure
// lease math through the same random lease calls, returns, limit edits and
// clock jumps (backwards too), at instants up to just below 2^53 µs, and
// requires the same Lease at every step.
func TestLeaseDifferentialExtremes(t *testing.T) {
	t.Parallel()
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			clk := limitertest.NewClock(time.Unix(0, 0))
			s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout, Now: clk.Now})
			seed := uint64(time.Now().UnixNano())
			rng := rand.New(rand.NewPCG(seed, uint64(alg)))
			limits := extremeLimits(alg)
			for _, base := range []int64{1_700_000_000_000_000, 1<<53 - 1_000_000_000_000_000} {
				l := limits[rng.IntN(len(limits))]
				p, err := limiter.NewParams(l)
				if err != nil {
					t.Fatal(err)
				}
				sp := p
				var st limiter.State
				key := uniqueKey(t)
				now := base + rng.Int64N(l.Period.Microseconds())
				var window int64
				for i := range 200 {
					switch r := rng.IntN(20); {
					case r == 0:
						l = limits[rng.IntN(len(limits))]
						if p, err = limiter.NewParams(l); err != nil {
							t.Fatal(err)
						}
					case r == 1:
						now -= rng.Int64N(l.Period.Microseconds()/2 + 1)
					case r < 6:
						now += rng.Int64N(3)
					case r < 12:
						now += rng.Int64N(l.Period.Microseconds()/max(1, l.Requests) + 1)
					default:
						now += rng.Int64N(2*l.Period.Microseconds() + 1)
					}
					now = min(max(now, 0), 1<<53-1)
					c := l.Capacity()
					a := limiter.LeaseArgs{Cost: 1 + rng.Int64N(min(3, c)), Window: window}
					switch rng.IntN(6) {
					case 0:
						a.Want = c
					case 1:
						a.Want = rng.Int64N(c + 1)
					case 2:
						a.Cost, a.Want, a.Return = 0, 0, 1+rng.Int64N(c)
					case 3:
						a.Cost = c + 1
						a.Return = rng.Int64N(c + 1)
					case 4: // a peek, or a take ahead of need
						a.Cost, a.Want = 0, rng.Int64N(2)*rng.Int64N(c+1)
					default:
						a.Want = a.Cost + rng.Int64N(1000)
						a.Return = rng.Int64N(3)
					}
					want, write, err := p.Lease(&st, sp, now, a)
					if err != nil {
						t.Fatal(err)
					}
					if write {
						sp = p
					}
					clk.Set(time.UnixMicro(now))
					got, _, err := s.Lease(t.Context(), limiter.LeaseRequest{Key: key, Limit: l, LeaseArgs: a})
					if err != nil {
						t.Fatalf("seed %d step %d: Lease(%v, %+v, %v): %v", seed, i, now, a, l, err)
					}
					if got != want {
						t.Fatalf("seed %d step %d: %v: Lease(%d, %+v) = %v, want %v (limiter)", seed, i, l, now, a, got, want)
					}
					window = got.Window
				}
			}
		})
	}
}

// TestLeaseRedisTime: without a clock the lease scripts read Redis TIME,
// and a window's lease ends with its window.
func TestLeaseRedisTime(t *testing.T) {
	t.Parallel()
	s := newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout})
	l := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 100, Period: time.Hour}
	key := uniqueKey(t)
	sent := time.Now()
	got, _, err := s.Lease(t.Context(), limiter.LeaseRequest{Key: key, Limit: l, LeaseArgs: limiter.LeaseArgs{Cost: 1, Want: 30}})
	answered := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	start := time.UnixMicro(got.Window)
	if !got.Allowed || got.Granted != 30 || got.Remaining != 70 {
		t.Fatalf("lease 30 of 100: %v", got)
	}
	// The instant the script read Redis TIME, which is this machine's
	// clock: within the call's own instants.
	if ran := start.Add(time.Hour - got.ValidFor); ran.Before(sent.Add(-time.Millisecond)) || ran.After(answered.Add(time.Millisecond)) {
		t.Fatalf("window %v + 1h - valid for %v is %v, not within the call (sent %v, answered %v later)", start, got.ValidFor, ran, sent, answered.Sub(sent))
	}
	if start.Truncate(time.Hour) != start {
		t.Fatalf("window %v is not aligned to the hour", start)
	}
}

// TestLeaseErrorsAreTyped: a reply of the wrong shape is an error naming
// the script, never a lease.
func TestLeaseErrorsAreTyped(t *testing.T) {
	t.Parallel()
	s := newStore(t, cluster, redisstore.Options{Timeout: suiteTimeout})
	key := uniqueKey(t)
	// A key holding another type makes the script fail.
	cl := cluster.NewClient()
	defer func() { _ = cl.Close() }()
	if err := cl.Set(t.Context(), redislayout.CounterKey(key, limiter.TokenBucket), "short", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.Lease(t.Context(), limiter.LeaseRequest{Key: key, Limit: limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 5, Period: time.Second}, LeaseArgs: limiter.LeaseArgs{Cost: 1, Want: 2}})
	if err == nil || errors.Is(err, limiter.ErrUnavailable) {
		t.Fatalf("lease on a corrupt state: %v, want a script error", err)
	}
	for _, want := range []string{"TokenBucket lease", "corrupt"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// TestSplitKeysOnDistinctMasters: the sub-counters of a split over as many
// parts as the cluster has masters land one on each master, and a split
// into more parts spreads evenly; every sub-key keeps its slot whatever
// the topology, and stays a valid hash tag.
func TestSplitKeysOnDistinctMasters(t *testing.T) {
	t.Parallel()
	cl := cluster.NewClient()
	defer func() { _ = cl.Close() }()
	ctx := context.Background()
	for n := range 20 {
		key := fmt.Sprintf("uid-%d:rule:%016x", n, rand.Uint64())
		for _, k := range []int{3, 6} {
			perMaster := map[string]int{}
			seen := map[string]bool{}
			for i := range k {
				sub := redislayout.SplitKey(key, i, k)
				if seen[sub] || sub == key {
					t.Fatalf("split %d of %q: sub-key %d %q repeats", k, key, i, sub)
				}
				seen[sub] = true
				if again := redislayout.SplitKey(key, i, k); again != sub {
					t.Fatalf("SplitKey(%q, %d, %d) = %q, then %q", key, i, k, sub, again)
				}
				slot, err := cl.ClusterKeySlot(ctx, redislayout.CounterKey(sub, limiter.TokenBucket)).Result()
				if err != nil {
					t.Fatal(err)
				}
				if int(slot) != redislayout.KeySlot(sub) {
					t.Fatalf("CLUSTER KEYSLOT %d, KeySlot %d", slot, redislayout.KeySlot(sub))
				}
				node, err := cl.MasterForKey(ctx, redislayout.CounterKey(sub, limiter.TokenBucket))
				if err != nil {
					t.Fatal(err)
				}
				perMaster[node.Options().Addr]++
			}
			if len(perMaster) != 3 {
				t.Fatalf("split %d of %q lands on %d masters: %v", k, key, len(perMaster), perMaster)
			}
			for addr, c := range perMaster {
				if c != k/3 {
					t.Fatalf("split %d of %q: %d sub-counters on %s, want %d", k, key, c, addr, k/3)
				}
			}
		}
	}
	if got := redislayout.SplitKey("k", 0, 1); got != "k" {
		t.Errorf("SplitKey of one part = %q, want the key", got)
	}
}
