package redisstore_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/lateness"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// keyOn returns a Request.Key whose counter lives on master m.
func keyOn(t *testing.T, c *redistest.Cluster, m *redistest.Node, tag string) string {
	t.Helper()
	for i := range 100000 {
		key := fmt.Sprintf("%s:%s:%d", uniqueKey(t), tag, i)
		owner, err := c.MasterForSlot(t.Context(), redislayout.KeySlot(key))
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
	at    time.Time // when it was asked for
	took  time.Duration
	shard string
	err   error
}

// failedFast reports whether a decision was failed by its shard's open
// breaker, without a call to the shard.
func (r sample) failedFast() bool {
	return r.err != nil && strings.Contains(r.err.Error(), "circuit breaker open")
}

// deadlineSpent reports whether a decision failed because its call got no
// answer within the deadline: it waited the deadline out.
func (r sample) deadlineSpent() bool {
	return r.err != nil && strings.Contains(r.err.Error(), "no answer within the call deadline")
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// few is what a decision may take beyond its deadline on an idle
// machine: returning from the timer, a map lookup, a lock. What a loaded
// machine adds is measured around each decision (see test/lateness).
const few = 5 * time.Millisecond

// waitUntil polls cond every 10ms until it holds, and reports whether it
// did within timeout, which only bounds a hang.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

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
// ErrUnavailable, never by waiting out their deadline (the dead node
// refuses, and the breaker fails them at once), while the other shards
// keep answering; after the failover they recover on the promoted
// replica.
//
// It does not run in parallel with the other tests, which would load the
// machine and blur the latencies it checks.
func TestKilledMaster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{Masters: 3, Replicas: 1, NodeTimeout: time.Second, PartialCoverage: true})
	// A deadline no answer of a loaded machine reaches: the live shards
	// must answer every decision, and the dead one is never waited for,
	// which the test checks by the decisions' errors, not their
	// durations. TestPausedNode holds decisions to a short deadline.
	const timeout = 2 * time.Second
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
		return sample{start, time.Since(start), shard, err}
	}
	for _, k := range append([]string{victimKey}, otherKeys...) {
		warmUp(t, func() error { return take(k).err })
	}

	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	lt := lateness.Start(lateness.Options{Sleep: redisstore.DefaultTimeout})
	defer lt.End()
	// Two callers on the dead shard and two on the live ones, each
	// pausing a millisecond between decisions as a busy client would, for
	// 600ms (less than it takes Redis to fail the master over, on an idle
	// machine) and until each side has made 20 decisions.
	var mu sync.Mutex
	var dead, live []sample
	var wg sync.WaitGroup
	var done atomic.Bool
	for w := range 4 {
		wg.Go(func() {
			for !done.Load() {
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
	from := time.Now()
	enough := waitUntil(30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return time.Since(from) >= 600*time.Millisecond && len(dead) >= 20 && len(live) >= 20
	})
	done.Store(true)
	wg.Wait()
	lt.End()
	stopped, breaker := time.Now(), breakerOf(s, victim.Addr())
	if !enough {
		t.Fatalf("too few decisions in 30s: %d on the dead shard, %d on live ones", len(dead), len(live))
	}
	promoted, err := c.WaitForFailover(victim, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	failedOver := time.Now()
	// Redis may have promoted the replica while the callers ran, on a
	// loaded machine: a decision asked for after that may find it.
	promotedAt, err := promoted.PromotedAt()
	if err != nil {
		t.Fatal(err)
	}

	var deadTook []time.Duration
	fast, afterFailover := 0, 0
	for _, r := range dead {
		if r.err == nil && !r.at.Before(promotedAt) {
			afterFailover++
			continue
		}
		if !errors.Is(r.err, limiter.ErrUnavailable) {
			t.Fatalf("decision on the killed shard asked for %v before its replica was promoted: %v, want ErrUnavailable", promotedAt.Sub(r.at), r.err)
		}
		// Failures are reported under the shard that failed, unless the
		// slot map could not be read at all.
		if r.shard != victim.Addr() && r.shard != redisstore.UnknownShard {
			t.Errorf("failed decision on the killed shard reported shard %q, want %s", r.shard, victim.Addr())
		}
		if r.deadlineSpent() {
			t.Errorf("decision on the killed shard waited out its deadline (%v): %v", r.took, r.err)
		}
		if late := lt.Excuse(r.at, r.took); r.took > timeout+few+late {
			t.Errorf("decision on the killed shard took %v, more than the %v deadline + %v + the machine's lateness around it %v", r.took, timeout, few, late)
		}
		if r.failedFast() {
			fast++
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
	t.Logf("killed shard: %d decisions, %d of them ErrUnavailable (%d failed fast by the breaker), p50 %v p99 %v max %v; %d asked for after Redis promoted its replica (%v after the kill) found it; the machine's worst lateness %v",
		len(dead), len(deadTook), fast, percentile(deadTook, .5), percentile(deadTook, .99), percentile(deadTook, 1), afterFailover, promotedAt.Sub(killed).Round(time.Millisecond), lt.Worst().Timer)
	t.Logf("live shards: %d decisions, no error, p50 %v p99 %v", len(live), percentile(liveTook, .5), percentile(liveTook, .99))
	// Until the failover, the dead master's breaker is open.
	if stopped.Before(promotedAt) && breaker != redisstore.BreakerOpen && breaker != redisstore.BreakerHalfOpen {
		t.Errorf("breaker of the killed master is %v, want open", breaker)
	}
	// Half the decisions on the dead shard must have failed fast: the
	// breaker, not a call to the shard, answers them.
	if fast < len(deadTook)/2 {
		t.Errorf("only %d of %d decisions on the killed shard failed fast", fast, len(deadTook))
	}

	var r sample
	for {
		r = take(victimKey)
		if r.err == nil {
			break
		}
		if time.Since(failedOver) > 30*time.Second {
			t.Fatalf("no recovery 30s after the failover: %v", r.err)
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
		return d, sample{start, time.Since(start), shard, err}
	}
	for _, k := range []string{victimKey, otherKey} {
		warmUp(t, func() error { _, r := take(k, 0); return r.err })
	}

	lt := lateness.Start(lateness.Options{Sleep: timeout})
	defer lt.End()
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
	// The other shard answers while this one is stopped. Its own call
	// may miss the short deadline on a loaded machine (and open its
	// breaker for a cooldown): it is asked until it answers.
	var other sample
	if !waitUntil(30*time.Second, func() bool { _, other = take(otherKey, 0); return other.err == nil }) {
		t.Fatalf("other shard while one is paused: %v", other.err)
	}
	lt.End()
	var tooks []time.Duration
	sent := 0
	for _, r := range paused {
		if !errors.Is(r.err, limiter.ErrUnavailable) {
			t.Fatalf("decision on the paused shard: %v, want ErrUnavailable", r.err)
		}
		if late := lt.Excuse(r.at, r.took); r.took > timeout+few+late {
			t.Errorf("decision on the paused shard took %v, more than the %v deadline + %v + the machine's lateness around it %v", r.took, timeout, few, late)
		}
		// A call the breaker did not fail went to the stopped node (or
		// queued for it) and waited for its deadline.
		if !r.failedFast() {
			sent++
		}
		tooks = append(tooks, r.took)
	}
	t.Logf("paused shard: %d decisions, all ErrUnavailable; %d waited for the deadline, p50 %v max %v; the machine's worst lateness %v",
		len(paused), sent, percentile(tooks, .5), percentile(tooks, 1), lt.Worst().Timer)
	if sent > 16+4 {
		t.Errorf("%d decisions waited for the deadline; the breaker should have failed most of the last 20 fast", sent)
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
		if time.Since(start) > 30*time.Second {
			t.Fatalf("paused shard not used again 30s after SIGCONT: %v", r.err)
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
