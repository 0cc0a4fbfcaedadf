package engine_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// redisEngine is an engine with leases on a real redis-server.
func redisEngine(t *testing.T, srv *redistest.Server) (*engine.Engine, *metrics.Metrics) {
	t.Helper()
	st, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr()}, Single: true, BatchWindow: redisstore.DefaultBatchWindow})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	fb, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewPedanticRegistry())
	e, err := engine.New(engine.Options{Store: st, StoreName: "redis", Fallback: fb, Metrics: m, Parallel: true, Leases: &engine.LeaseOptions{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e, m
}

func leasedRule(t *testing.T, m *metrics.Metrics, lim limiter.Limit) *engine.Rule {
	t.Helper()
	r, err := engine.NewRule("pol", "hot", lim, 1, false, false, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Spread(true, 1, m); err != nil {
		t.Fatal(err)
	}
	return r
}

// scripts counts the scripts a server has run: EVALSHA and EVAL calls.
func scripts(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	info, err := srv.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				c, _ := strconv.ParseInt(v, 10, 64)
				n += c
			}
		}
	}
	return n
}

// fixedWindowCount reads the count of a FixedWindow counter from Redis.
func fixedWindowCount(t *testing.T, srv *redistest.Server, key string) int64 {
	t.Helper()
	st, err := srv.Client().Get(context.Background(), redisstore.CounterKey(key, limiter.FixedWindow)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 16 {
		t.Fatalf("state of %d bytes, want 16", len(st))
	}
	return int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(st[8:16]))))
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// TestLeasesOnRedis: a hot key decided on a real Redis makes about one
// script call per lease, and after shutdown the count in Redis is exactly
// what was admitted: every admitted request was paid for, and every unused
// token went back.
func TestLeasesOnRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	e, m := redisEngine(t, srv)
	r := leasedRule(t, m, limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000, Period: time.Hour})
	// A window boundary mid-test would split the count: start well inside
	// one.
	if left := time.Hour - time.Duration(time.Now().UnixNano()%int64(time.Hour)); left < time.Minute {
		time.Sleep(left + time.Second)
	}
	before := scripts(t, srv)
	const n = 20000
	var v engine.Verdict
	for range n {
		e.Decide(context.Background(), []engine.Hit{{Rule: r, Key: "leases-on-redis", Cost: 1}}, &v)
		if v.Outcome != engine.Allow {
			t.Fatalf("denied: %+v", v.Results[0])
		}
	}
	calls := scripts(t, srv) - before
	if calls > n/50 {
		t.Errorf("%d scripts for %d decisions, want at most 2%%", calls, n)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := fixedWindowCount(t, srv, "leases-on-redis"); got != n {
		t.Errorf("Redis counts %d after shutdown, want the %d admitted", got, n)
	}
	t.Logf("%d scripts for %d decisions; %v granted, %v returned at shutdown", calls, n,
		counter(m.Lease.GrantedTokensTotal.WithLabelValues("pol", "hot")),
		counter(m.Lease.ReturnedTokensTotal.WithLabelValues("pol", "hot", metrics.ReturnShutdown)))
}

// TestLeaseWhenRedisGoesAway: with Redis killed, the sidecar spends the
// lease it holds, then the rule falls back to its local bucket; the tokens
// it could not give back are counted lost.
func TestLeaseWhenRedisGoesAway(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	e, m := redisEngine(t, srv)
	r := leasedRule(t, m, limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1_000_000, Period: time.Hour})
	var v engine.Verdict
	decide := func() engine.Result {
		e.Decide(context.Background(), []engine.Hit{{Rule: r, Key: "goes-away", Cost: 1}}, &v)
		return v.Results[0]
	}
	for deadline := time.Now().Add(5 * time.Second); decide().Source != engine.FromLease; {
		if time.Now().After(deadline) {
			t.Fatal("no lease taken in 5s")
		}
	}
	for range 200 {
		decide()
	}
	srv.Kill()
	var fromLease, fallback int
	for deadline := time.Now().Add(5 * time.Second); fallback < 100 && time.Now().Before(deadline); {
		res := decide()
		switch res.Source {
		case engine.FromLease:
			if fallback > 0 {
				t.Fatal("a lease hit after the fallback began")
			}
			fromLease++
		case engine.FromFallback:
			fallback++
		default:
			t.Fatalf("decided from %v with Redis down", res.Source)
		}
		if !res.Allowed && res.Source != engine.FromFallback {
			t.Fatalf("denied from %v", res.Source)
		}
	}
	if fromLease == 0 || fallback == 0 {
		t.Fatalf("%d lease hits, %d fallback decisions: want both", fromLease, fallback)
	}
	if fromLease < 50 {
		t.Errorf("%d lease hits once Redis went away, want the lease spent (at least 50)", fromLease)
	}
	t.Logf("%d decisions on the lease, then %d on the fallback bucket", fromLease, fallback)
	_ = e.Close(context.Background())
}
