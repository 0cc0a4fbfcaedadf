package redisstore_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// keyState is what Redis holds for one key: its serialised value, its
// expiry, and the server's count of writes since start (its dirty counter;
// the test servers never save, so it is never reset).
type keyState struct {
	value    string
	expireAt time.Duration
	writes   int64
}

func (s keyState) String() string {
	return fmt.Sprintf("{value %x, expires at %dms, %d writes}", s.value, s.expireAt.Milliseconds(), s.writes)
}

func readKeyState(t *testing.T, cl *redis.Client, key string) keyState {
	t.Helper()
	ctx := t.Context()
	var s keyState
	v, err := cl.Dump(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		t.Fatalf("DUMP %s: %v", key, err)
	default:
		s.value = v
	}
	if s.expireAt, err = cl.PExpireTime(ctx, key).Result(); err != nil {
		t.Fatalf("PEXPIRETIME %s: %v", key, err)
	}
	info, err := cl.Info(ctx, "persistence").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "rdb_changes_since_last_save:"); ok {
			if s.writes, err = strconv.ParseInt(v, 10, 64); err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	t.Fatalf("INFO persistence has no rdb_changes_since_last_save: %q", info)
	return s
}

// TestPeekWritesNothing: a cost-0 call is decided as a cost of 1 and runs
// no write command, for every script, plain and lease: a key that was
// absent stays absent, and a key's value and expiry stay as they were,
// whether the peek is allowed or denied. The server is the test's own, so
// that its write count moves only with this test's calls.
func TestPeekWritesNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{Password: "pw"})
	clk := limitertest.NewClock(time.Unix(1_700_000_040, 0))
	s, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr()}, Single: true, Password: "pw", Timeout: suiteTimeout, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	cl := srv.Client()
	ctx := t.Context()
	base := clk.Now()

	take := func(key string, l limiter.Limit, cost int64) limiter.Decision {
		t.Helper()
		d, _, err := s.Take(ctx, limiter.Request{Key: key, Limit: l, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// peek makes a peek through Take, and through Lease when the
	// algorithm leases, and requires that neither wrote anything.
	peek := func(key string, l limiter.Limit) limiter.Decision {
		t.Helper()
		redisKey := redislayout.CounterKey(key, l.Algorithm)
		before := readKeyState(t, cl, redisKey)
		d := take(key, l, 0)
		if l.Algorithm.Leasable() {
			got, _, err := s.Lease(ctx, limiter.LeaseRequest{Key: key, Limit: l})
			if err != nil {
				t.Fatal(err)
			}
			if got.Decision != d || got.Granted != 0 {
				t.Errorf("%v: a lease call of cost 0 = %v, want %v granting nothing", l.Algorithm, got, d)
			}
		}
		if after := readKeyState(t, cl, redisKey); after != before {
			t.Fatalf("%v: a peek (%v) changed %s: %v, was %v", l.Algorithm, d, redisKey, after, before)
		}
		return d
	}

	for _, alg := range allAlgorithms {
		l := limiter.Limit{Algorithm: alg, Requests: 3, Period: 10 * time.Minute}
		clk.Set(base)
		// Load the scripts first: the peeks below are then the only
		// calls between two readings of the write count.
		take(uniqueKey(t), l, 1)
		if alg.Leasable() {
			if _, _, err := s.Lease(ctx, limiter.LeaseRequest{Key: uniqueKey(t), Limit: l, LeaseArgs: limiter.LeaseArgs{Cost: 1}}); err != nil {
				t.Fatal(err)
			}
		}

		key := uniqueKey(t)
		if d := peek(key, l); !d.Allowed || d.Remaining != 3 {
			t.Errorf("%v: peek on a new key = %v, want allowed with 3 remaining", alg, d)
		}
		if n, err := cl.Exists(ctx, redislayout.CounterKey(key, alg)).Result(); err != nil || n != 0 {
			t.Fatalf("%v: a peek created the key (%d, %v)", alg, n, err)
		}
		take(key, l, 1)
		if d := peek(key, l); !d.Allowed || d.Remaining != 2 {
			t.Errorf("%v: peek with 2 left = %v, want allowed with 2 remaining", alg, d)
		}
		take(key, l, 2)
		clk.Set(base.Add(time.Second))
		d := peek(key, l)
		if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
			t.Errorf("%v: peek on the exhausted key = %v, want a deny with a wait", alg, d)
		}
		if one := take(key, l, 1); one != d {
			t.Errorf("%v: peek on the exhausted key = %v, a cost of 1 = %v: want the same deny", alg, d, one)
		}
	}

	// A SlidingLog peek counts expired entries out but leaves them in
	// the log: a take would drop them.
	l := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 2, Period: time.Minute}
	key := uniqueKey(t)
	clk.Set(base)
	take(key, l, 1)
	clk.Set(base.Add(30 * time.Second))
	take(key, l, 1)
	clk.Set(base.Add(61 * time.Second))
	if d := peek(key, l); !d.Allowed || d.Remaining != 1 {
		t.Errorf("SlidingLog: peek past the first entry's expiry = %v, want allowed with 1 remaining", d)
	}
	if n, err := cl.ZCard(ctx, redislayout.CounterKey(key, l.Algorithm)).Result(); err != nil || n != 2 {
		t.Errorf("SlidingLog: %d entries (%v) after the peek, want both still there", n, err)
	}
}
