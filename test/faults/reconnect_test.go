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
		// soon as the node is back.
		newClient := func() *redis.Client {
			return redis.NewClient(&redis.Options{Addr: addr, Password: password, Protocol: 2, MaxRetries: -1, DialTimeout: 50 * time.Millisecond,
				ReadTimeout: 200 * time.Millisecond, PoolSize: 1, DisableIdentity: true})
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
			info, err := c.Info(ctx, "stats", "commandstats").Result()
			if err != nil {
				_ = c.Close()
				c = newClient()
				continue
			}
			s := stat{at: time.Now()}
			for line := range strings.SplitSeq(info, "\n") {
				k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
				if !ok {
					continue
				}
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "total_commands_processed":
					s.commands = n
				case "total_connections_received":
					s.connections = n
				case "cmdstat_client|setname":
					calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
					s.handshakes, _ = strconv.ParseInt(calls, 10, 64)
				}
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
// of in the same millisecond, and in the first second back the node sees
// at most twice the commands of a steady second (handshakes, the slot map,
// the scripts loaded again included).
func TestReconnectAfterOutage(t *testing.T) {
	c := redistest.StartCluster(t, redistest.Options{Masters: 1})
	node := c.Nodes()[0]
	ctx := t.Context()
	const (
		clients = 200
		rate    = 20 // per client per second
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
				_, _, err := s.Take(ctx, limiter.Request{Key: fmt.Sprintf("storm-%d", i), Limit: lim, Cost: 1})
				mu.Lock()
				if err == nil {
					okCalls++
				} else {
					failedCalls++
				}
				mu.Unlock()
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	samples := sampleStats(sctx, node.Addr(), c.Password(), 50*time.Millisecond)
	// Steady state: every client connected and deciding.
	time.Sleep(3 * time.Second)
	steadyFrom := time.Now()
	time.Sleep(2 * time.Second)
	steadyTo := time.Now()
	if err := c.Kill(node); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := c.Restart(node); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	time.Sleep(3 * time.Second)
	cancel()
	time.Sleep(100 * time.Millisecond)

	// The counters restart with the node: the samples after it are counts
	// since it came back.
	var before, after []stat
	for _, s := range samples() {
		if s.at.Before(back) {
			before = append(before, s)
		} else {
			after = append(after, s)
		}
	}
	steady := rateBetween(t, before, steadyFrom, steadyTo)
	// The sampler's own INFO counts too: 20 a second.
	firstSecond := at(t, after, back.Add(time.Second)).commands - 20
	conns := at(t, after, back.Add(2*time.Second)).connections
	handshakes := at(t, after, back.Add(2*time.Second)).handshakes
	// The reconnections (named connections) by 100ms window, over the
	// first two seconds.
	var windows []int64
	prev := int64(0)
	for w := 1; w <= 20; w++ {
		n := at(t, after, back.Add(time.Duration(w)*100*time.Millisecond)).handshakes
		windows = append(windows, n-prev)
		prev = n
	}
	peak := int64(0)
	for _, n := range windows {
		peak = max(peak, n)
	}
	mu.Lock()
	t.Logf("%d clients at %d/s: steady %.0f commands/s; first second back %d commands (%.2fx steady); in the first 2s %d connections, %d of them store connections (named), by 100ms window %v (peak %d, %.0f%%); calls ok %d, failed %d",
		clients, rate, steady, firstSecond, float64(firstSecond)/steady, conns, handshakes, windows, peak, 100*float64(peak)/float64(max(handshakes, 1)), okCalls, failedCalls)
	mu.Unlock()
	if float64(firstSecond) > 2*steady {
		t.Errorf("the node saw %d commands in its first second back, more than twice the steady %.0f/s", firstSecond, steady)
	}
	if handshakes < clients {
		t.Errorf("only %d store connections in the first 2s back: the %d clients did not all reconnect", handshakes, clients)
	}
	// With a fixed cooldown every client reconnects in one window.
	if float64(peak) > 0.4*float64(handshakes) {
		t.Errorf("%d of %d reconnections in one 100ms window: the clients came back together", peak, handshakes)
	}
	// Every client is back on the node.
	for i, s := range stores {
		if _, _, err := s.Take(ctx, limiter.Request{Key: fmt.Sprintf("storm-%d", i), Limit: lim, Cost: 0}); err != nil {
			t.Errorf("client %d after the outage: %v", i, err)
		}
	}
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

// rateBetween returns the commands per second between two instants.
func rateBetween(t *testing.T, ss []stat, from, to time.Time) float64 {
	t.Helper()
	a, b := at(t, ss, from), at(t, ss, to)
	return float64(b.commands-a.commands) / b.at.Sub(a.at).Seconds()
}
