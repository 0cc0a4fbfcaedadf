package faults

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// stat is one sample of a node's INFO stats.
type stat struct {
	// at is when the node answered, by its own clock (server_time_usec),
	// which is this machine's: a sample read late is still placed right.
	at          time.Time
	commands    int64 // total_commands_processed
	connections int64 // total_connections_received
	// handshakes counts CLIENT SETNAME calls: every connection of a store
	// client names itself, so these are the connections that carry
	// calls, not go-redis's bare probes of a node that refused it.
	handshakes int64
}

// sampleStats reads n's counters every interval through a connection of its
// own until ctx ends; a failed read (the node is down) is skipped. It
// returns the samples so far.
func sampleStats(ctx context.Context, addr, password string, interval time.Duration) func() []stat {
	var out []stat
	var mu sync.Mutex
	go func() {
		// A client of its own for each failed read: go-redis backs off
		// from a node whose dials failed, and the samples must resume as
		// soon as the node is back. A down node refuses the dial at once;
		// a slow answer is waited for, its sample placed by the node's
		// own clock, however late it arrives.
		newClient := func() *redis.Client {
			return redis.NewClient(&redis.Options{Addr: addr, Password: password, Protocol: 2, MaxRetries: -1, DialTimeout: time.Second,
				ReadTimeout: 2 * time.Second, PoolSize: 1, DisableIdentity: true})
		}
		c := newClient()
		defer func() { _ = c.Close() }()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			info, err := c.Info(ctx, "server", "stats", "commandstats").Result()
			if err != nil {
				_ = c.Close()
				c = newClient()
				continue
			}
			var s stat
			for line := range strings.SplitSeq(info, "\n") {
				k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
				if !ok {
					continue
				}
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "server_time_usec":
					s.at = time.UnixMicro(n)
				case "total_commands_processed":
					s.commands = n
				case "total_connections_received":
					s.connections = n
				case "cmdstat_client|setname":
					calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
					s.handshakes, _ = strconv.ParseInt(calls, 10, 64)
				}
			}
			if s.at.IsZero() {
				continue
			}
			mu.Lock()
			out = append(out, s)
			mu.Unlock()
		}
	}()
	return func() []stat {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(out)
	}
}

// TestReconnectAfterOutage has 200 store clients, as 200 sidecars would,
// decide 20 requests per second each against one Redis node, takes the
// node away for 3 seconds (SIGKILL, then a restart with its node ID), and
// measures what the clients ask of it when it is back. Their breakers
// opened together when it died; their probes, slot-map reloads and
// reconnections are jittered, so they come back over a cooldown instead
// of in the same millisecond: every client reaches the node again (its
// call is answered, if only with CLUSTERDOWN while the restarted master
// waits out its writable delay), no more than 40% of them within any
// 100ms, and in its first second back, from its readiness as it logs it,
// the node sees at most twice the commands of a steady second
// (handshakes, the slot map, the scripts loaded again included). The
// clients' times are this process's: a stall of the machine (see
// test/lateness) holds back the reconnections due during it and lets them
// go together, so the window they are counted in is widened by the
// longest stall measured over them. How soon after the node's readiness they are all
// back is reported, not bounded: it is the sum of a probe cooldown, a
// redial pause and a round trip or more, each of which a machine busy
// enough to hold 200 clients back delays again.
func TestReconnectAfterOutage(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{Masters: 1})
	node := c.Nodes()[0]
	ctx := t.Context()
	const (
		clients = 200
		rate    = 20 // per client per second
		window  = 100 * time.Millisecond
		// together is the most of the clients that may come back within
		// one window: with a fixed cooldown all of them would.
		together = 0.4
	)
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1_000_000, Period: time.Hour}
	stores := make([]*redisstore.Store, clients)
	for i := range stores {
		s, err := redisstore.New(redisstore.Options{Addrs: c.Addrs(), BatchWindow: redisstore.DefaultBatchWindow, Timeout: time.Second,
			ClientName: fmt.Sprintf("floodgate-sidecar:storm-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		stores[i] = s
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	okCalls, failedCalls := 0, 0
	// Per client, when its first call begun at or after mark ended that
	// the node answered (reached), and that succeeded (ok).
	var mark time.Time
	reached := make([]time.Time, clients)
	ok := make([]time.Time, clients)
	all := func(ts []time.Time) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return !slices.Contains(ts, time.Time{})
		}
	}
	for i, s := range stores {
		wg.Go(func() {
			interval := time.Second / rate
			// Spread the clients' schedules, as independent sidecars'.
			time.Sleep(time.Duration(i) * interval / clients)
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				start := time.Now()
				_, _, err := s.Take(ctx, limiter.Request{Key: fmt.Sprintf("storm-%d", i), Limit: lim, Cost: 1})
				end := time.Now()
				mu.Lock()
				if err == nil {
					okCalls++
				} else {
					failedCalls++
				}
				if !start.Before(mark) {
					if reached[i].IsZero() && answered(err) {
						reached[i] = end
					}
					if ok[i].IsZero() && err == nil {
						ok[i] = end
					}
				}
				mu.Unlock()
			}
		})
	}
	halt := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer halt()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	samples := sampleStats(sctx, node.Addr(), c.Password(), 50*time.Millisecond)
	n := startProbe()
	defer n.End()
	// Steady state: every client connected and deciding.
	if !waitUntil(30*time.Second, all(ok)) {
		t.Fatal("not every client decided within 30s of the start")
	}
	// Two seconds of them, as the node counts them.
	steadyFrom := time.Now()
	if !waitUntil(30*time.Second, func() bool {
		ss := samples()
		return len(ss) > 0 && !ss[len(ss)-1].at.Before(steadyFrom.Add(2*time.Second))
	}) {
		t.Fatal("no sample of the node's counters 2s into the steady state")
	}
	if err := c.Kill(node); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	mark = time.Now()
	clear(reached)
	clear(ok)
	mu.Unlock()
	time.Sleep(3 * time.Second)
	if err := c.Restart(node); err != nil {
		t.Fatal(err)
	}
	ready, err := node.LoggedAt("Ready to accept connections")
	if err != nil {
		t.Fatal(err)
	}
	// Every client back and deciding, and samples of the node's first 2
	// seconds back.
	sampled := func() bool {
		ss := samples()
		return len(ss) > 0 && ss[len(ss)-1].at.After(ready.Add(2*time.Second))
	}
	if !waitUntil(time.Minute, func() bool { return all(reached)() && all(ok)() && sampled() }) {
		t.Fatalf("a minute after the node was back: every client reached it %v, decided %v; its first 2s sampled %v", all(reached)(), all(ok)(), sampled())
	}
	cancel()
	n.End()

	// The counters restart with the node: the samples from its readiness
	// on are counts since it came back.
	var before, after []stat
	for _, s := range samples() {
		if s.at.Before(ready) {
			before = append(before, s)
		} else {
			after = append(after, s)
		}
	}
	steady := rateBetween(t, before, steadyFrom)
	// The last sample of the first second: what the clients sent in it is
	// at least its count, less the sampler's own commands (its AUTH and
	// an INFO a sample).
	last := at(t, after, ready.Add(time.Second))
	own := int64(1)
	for _, s := range after {
		if !s.at.After(last.at) {
			own++
		}
	}
	firstSecond := last.commands - own
	conns := at(t, after, ready.Add(2*time.Second)).connections
	handshakes := at(t, after, ready.Add(2*time.Second)).handshakes

	// When the clients came back, and the most of them within one window.
	mu.Lock()
	times := slices.Clone(reached)
	decided := slices.Clone(ok)
	okN, failedN := okCalls, failedCalls
	mu.Unlock()
	slices.SortFunc(times, time.Time.Compare)
	slices.SortFunc(decided, time.Time.Compare)
	first, lastBack := times[0], times[len(times)-1]
	// The most of them within one window, against what that window may
	// hold: a stall of the machine that ends in it lets the reconnections
	// due over the window and the stall come back within it, so a
	// window's share is widened by the longest stall measured there.
	var peak, worst int
	var worstAllowed float64
	var worstStall time.Duration
	j := 0
	for i := range times {
		for times[i].Sub(times[j]) >= window {
			j++
		}
		count := i - j + 1
		stalled := n.Stall(times[j], times[j].Add(window))
		allowed := together * float64(clients) * float64(window+stalled) / float64(window)
		if float64(count)/allowed > float64(worst)/max(worstAllowed, 1) {
			worst, worstAllowed, worstStall = count, allowed, stalled
		}
		peak = max(peak, count)
	}
	t.Logf("%d clients at %d/s: steady %.0f commands/s; first second back at least %d commands (%.2fx steady); in the first 2s %d connections, %d of them store connections (named); the clients reached the node again from %v to %v after its readiness, at most %d within %v (%.0f%%); the window nearest its bound held %d, allowed %.0f (%.0f%% of them, over %v + the machine's longest stall in it %v); they decided again from %v to %v; calls ok %d, failed %d",
		clients, rate, steady, firstSecond, float64(firstSecond)/steady, conns, handshakes, first.Sub(ready).Round(time.Millisecond), lastBack.Sub(ready).Round(time.Millisecond),
		peak, window, 100*float64(peak)/clients, worst, worstAllowed, 100*together, window, worstStall,
		decided[0].Sub(ready).Round(time.Millisecond), decided[len(decided)-1].Sub(ready).Round(time.Millisecond), okN, failedN)
	if float64(firstSecond) > 2*steady {
		t.Errorf("the node saw %d commands in its first second back, more than twice the steady %.0f/s", firstSecond, steady)
	}
	// With a fixed cooldown every client reconnects in one window.
	if float64(worst) > worstAllowed {
		t.Errorf("%d of %d clients came back within %v (the machine stalled at most %v there): the clients came back together", worst, clients, window, worstStall)
	}
	// Every client is back on the node: it has decided since (waited
	// for above), and decides again now, asked until it answers within
	// its deadline, which a machine this busy may make it miss.
	deadline := time.Now().Add(time.Minute)
	for i, s := range stores {
		var err error
		if !waitUntil(time.Until(deadline), func() bool {
			_, _, err = s.Take(ctx, limiter.Request{Key: fmt.Sprintf("storm-%d", i), Limit: lim, Cost: 0})
			return err == nil
		}) {
			t.Errorf("client %d after the outage: %v", i, err)
		}
	}
}

// answered reports whether a call's outcome came from the node: it
// succeeded, or the node answered that it cannot serve now (a restarted
// master refuses keys for a while, CLUSTERDOWN, before it calls its
// cluster state ok).
func answered(err error) bool {
	return err == nil || strings.Contains(err.Error(), "CLUSTERDOWN") || strings.Contains(err.Error(), "LOADING")
}

// at returns the last sample at or before when; the zero stat (the
// counters of a node that has just started) when there is none.
func at(t *testing.T, ss []stat, when time.Time) stat {
	t.Helper()
	var out stat
	for _, s := range ss {
		if !s.at.After(when) {
			out = s
		}
	}
	return out
}

// rateBetween returns the commands per second from the first sample at
// or after from to the last sample of ss.
func rateBetween(t *testing.T, ss []stat, from time.Time) float64 {
	t.Helper()
	i := slices.IndexFunc(ss, func(s stat) bool { return !s.at.Before(from) })
	if i < 0 || i == len(ss)-1 {
		t.Fatalf("too few samples from %v to measure a rate: %d", from, len(ss))
	}
	a, b := ss[i], ss[len(ss)-1]
	return float64(b.commands-a.commands) / b.at.Sub(a.at).Seconds()
}
