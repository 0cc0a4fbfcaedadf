package redisstore_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// keyOn returns a Request.Key whose counter lives on master m.
func keyOn(t *testing.T, c *redistest.Cluster, m *redistest.Node, tag string) string {
	t.Helper()
	for i := range 100000 {
		key := fmt.Sprintf("%s:%s:%d", uniqueKey(t), tag, i)
		owner, err := c.MasterForSlot(t.Context(), redisstore.KeySlot(key))
		if err != nil {
			t.Fatal(err)
		}
		if owner == m {
			return key
		}
	}
	t.Fatalf("no key found on %v", m)
	return ""
}

// sample is one timed decision, and the shard it reported.
type sample struct {
	took  time.Duration
	shard string
	err   error
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// slack is what a loaded, shared 2-core machine (under -race) may add to
// a deadline before a goroutine runs again. A hang would be seconds.
const slack = 100 * time.Millisecond

// warmUp retries take until it succeeds: the first calls on a fresh
// cluster may meet the short deadline on a loaded machine.
func warmUp(t *testing.T, take func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := take()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm-up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKilledMaster kills one master: decisions for its slots fail with
// ErrUnavailable within the deadline, then at once through the breaker,
// while the other shards keep answering; after the failover they recover
// on the promoted replica.
//
// It does not run in parallel with the other tests, which would load the
// machine and blur the latencies it checks.
func TestKilledMaster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{Masters: 3, Replicas: 1, NodeTimeout: time.Second, PartialCoverage: true})
	// A deadline well above the default: the live shards must answer
	// every decision, on a machine that -race and other tests load.
	const timeout = 200 * time.Millisecond
	s := newStore(t, c, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: timeout, BreakerFailures: 3, BreakerCooldown: 200 * time.Millisecond})
	ctx := t.Context()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := masters[0]
	victimKey := keyOn(t, c, victim, "victim")
	otherKeys := []string{keyOn(t, c, masters[1], "a"), keyOn(t, c, masters[2], "b")}
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1_000_000, Period: time.Hour}
	take := func(key string) sample {
		start := time.Now()
		_, shard, err := s.Take(ctx, limiter.Request{Key: key, Limit: l, Cost: 1})
		return sample{time.Since(start), shard, err}
	}
	for _, k := range append([]string{victimKey}, otherKeys...) {
		warmUp(t, func() error { return take(k).err })
	}

	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	// Two callers on the dead shard and two on the live ones for 600ms,
	// less than it takes Redis to fail the master over, each pausing a
	// millisecond between decisions as a busy client would.
	var mu sync.Mutex
	var dead, live []sample
	var wg sync.WaitGroup
	stop := time.Now().Add(600 * time.Millisecond)
	for w := range 4 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				if w < 2 {
					r := take(victimKey)
					mu.Lock()
					dead = append(dead, r)
					mu.Unlock()
				} else {
					r := take(otherKeys[w-2])
					mu.Lock()
					live = append(live, r)
					mu.Unlock()
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()

	var deadTook []time.Duration
	slow := 0
	for _, r := range dead {
		if !errors.Is(r.err, limiter.ErrUnavailable) {
			t.Fatalf("decision on the killed shard: %v, want ErrUnavailable", r.err)
		}
		// Failures are reported under the shard that failed, unless the
		// slot map could not be read at all.
		if r.shard != victim.Addr() && r.shard != redisstore.UnknownShard {
			t.Errorf("failed decision on the killed shard reported shard %q, want %s", r.shard, victim.Addr())
		}
		if r.took > timeout+slack {
			t.Errorf("decision on the killed shard took %v, more than the %v deadline", r.took, timeout)
		}
		if r.took > time.Millisecond {
			slow++
		}
		deadTook = append(deadTook, r.took)
	}
	var liveTook []time.Duration
	for _, r := range live {
		if r.err != nil {
			t.Fatalf("decision on a live shard while another is dead: %v", r.err)
		}
		if r.shard != masters[1].Addr() && r.shard != masters[2].Addr() {
			t.Errorf("decision on a live shard reported shard %q, want %s or %s", r.shard, masters[1].Addr(), masters[2].Addr())
		}
		liveTook = append(liveTook, r.took)
	}
	if len(dead) < 20 || len(live) < 20 {
		t.Fatalf("too few decisions: %d on the dead shard, %d on live ones", len(dead), len(live))
	}
	t.Logf("killed shard: %d decisions, all ErrUnavailable, p50 %v p99 %v max %v, %d took over 1ms",
		len(dead), percentile(deadTook, .5), percentile(deadTook, .99), percentile(deadTook, 1), slow)
	t.Logf("live shards: %d decisions, no error, p50 %v p99 %v", len(live), percentile(liveTook, .5), percentile(liveTook, .99))
	if got := breakerOf(s, victim.Addr()); got != redisstore.BreakerOpen && got != redisstore.BreakerHalfOpen {
		t.Errorf("breaker of the killed master is %v, want open", got)
	}
	// Half the decisions on the dead shard must have failed fast: the
	// breaker, not the deadline, answers them.
	if fast := len(dead) - slow; fast < len(dead)/2 {
		t.Errorf("only %d of %d decisions on the killed shard failed fast", fast, len(dead))
	}

	promoted, err := c.WaitForFailover(victim, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	failedOver := time.Now()
	var r sample
	for {
		r = take(victimKey)
		if r.err == nil {
			break
		}
		if time.Since(failedOver) > 10*time.Second {
			t.Fatalf("no recovery 10s after the failover: %v", r.err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("recovered %v after the failover to %v", time.Since(failedOver).Round(time.Millisecond), promoted)
	if r.shard != promoted.Addr() {
		t.Errorf("decision on the victim's key after the failover reported shard %s, want the promoted replica %s", r.shard, promoted.Addr())
	}
}

func breakerOf(s *redisstore.Store, addr string) redisstore.BreakerState {
	for _, sh := range s.Shards() {
		if sh.Addr == addr {
			return sh.Breaker
		}
	}
	return -1
}

// TestPausedNode stops a master with SIGSTOP: its sockets accept but it
// answers nothing. Every decision on it ends at the deadline, never later,
// the breaker then fails them fast, and after SIGCONT the shard is used
// again. The scripts that timed out were sent once and are never resent,
// so the count they leave is at most one charge each.
//
// It does not run in parallel with the other tests, which would load the
// machine and blur the latencies it checks.
func TestPausedNode(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{Masters: 3, NodeTimeout: 20 * time.Second, PartialCoverage: true})
	const timeout = 100 * time.Millisecond
	s := newStore(t, c, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: timeout, BreakerFailures: 20, BreakerCooldown: 300 * time.Millisecond,
		Now: at(time.Unix(1_700_000_000, 0))})
	ctx := t.Context()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := masters[1]
	victimKey := keyOn(t, c, victim, "paused")
	otherKey := keyOn(t, c, masters[0], "other")
	l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 100, Period: time.Hour}
	take := func(key string, cost int64) (limiter.Decision, sample) {
		start := time.Now()
		d, shard, err := s.Take(ctx, limiter.Request{Key: key, Limit: l, Cost: cost})
		return d, sample{time.Since(start), shard, err}
	}
	for _, k := range []string{victimKey, otherKey} {
		warmUp(t, func() error { _, r := take(k, 0); return r.err })
	}

	if err := c.Pause(victim); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = c.Resume(victim)
		}
	}()
	// 8 callers at once on the paused shard, twice: the first 16 reach
	// the socket and time out; the breaker has opened by then.
	var mu sync.Mutex
	var paused []sample
	for range 2 {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				_, r := take(victimKey, 1)
				mu.Lock()
				paused = append(paused, r)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	for range 20 {
		_, r := take(victimKey, 1)
		paused = append(paused, r)
	}
	var tooks []time.Duration
	sent := 0
	for _, r := range paused {
		if !errors.Is(r.err, limiter.ErrUnavailable) {
			t.Fatalf("decision on the paused shard: %v, want ErrUnavailable", r.err)
		}
		if r.took > timeout+slack {
			t.Errorf("decision on the paused shard took %v, more than the %v deadline", r.took, timeout)
		}
		if r.took >= timeout/2 {
			sent++
		}
		tooks = append(tooks, r.took)
	}
	t.Logf("paused shard: %d decisions, all ErrUnavailable; %d waited for the deadline, p50 %v max %v",
		len(paused), sent, percentile(tooks, .5), percentile(tooks, 1))
	if sent > 16+4 {
		t.Errorf("%d decisions waited for the deadline; the breaker should have failed most of the last 20 fast", sent)
	}
	if _, r := take(otherKey, 0); r.err != nil {
		t.Fatalf("other shard while one is paused: %v", r.err)
	}

	if err := c.Resume(victim); err != nil {
		t.Fatal(err)
	}
	resumed = true
	// After the cooldown a probe gets through and the breaker closes.
	start := time.Now()
	var d limiter.Decision
	for {
		var r sample
		d, r = take(victimKey, 0)
		if r.err == nil {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("paused shard not used again 5s after SIGCONT: %v", r.err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("shard answered again %v after SIGCONT", time.Since(start).Round(time.Millisecond))
	// The timed-out takes were applied at most once each, whenever the
	// node read them: never twice.
	if spent := 100 - d.Remaining; spent > int64(sent) {
		t.Errorf("%d units spent by %d timed-out takes: some were sent twice", spent, sent)
	} else {
		t.Logf("%d of %d timed-out takes were applied after SIGCONT, none twice", spent, sent)
	}
}
