package runner

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/test/redistest"
)

// leasePolicy is a policy of uid with a hot FixedWindow rule.
func leasePolicy(uid string) string {
	return fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: %s
  rules:
  - name: hot
    key: [{header: X-Key}]
    limit: {requests: 1000000, per: 1h, algorithm: FixedWindow}
`, uid)
}

// TestSidecarReturnsItsLeasesAtShutdown: a sidecar on the Redis store
// decides a hot key on leases (its metrics count lease hits), and once it
// has stopped, Redis counts exactly the requests it let through: the
// unused tokens of its leases went back.
//
// Redis counts in hour-long windows on its own clock; a run that a window
// boundary splits counts in two windows, and is run again under a policy
// of its own.
func TestSidecarReturnsItsLeasesAtShutdown(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, redistest.Options{Masters: 3})
	cc := cluster.NewClient()
	t.Cleanup(func() { _ = cc.Close() })
	redistest.InOneWindow(t, cc, time.Hour, func(attempt int) func() {
		return returnsLeases(t, cluster, fmt.Sprintf("uid-lease-%d", attempt))
	})
}

// returnsLeases runs TestSidecarReturnsItsLeasesAtShutdown's traffic under
// a policy of uid and returns the checks of its outcome, for a run that
// one window held.
func returnsLeases(t *testing.T, cluster *redistest.Cluster, uid string) (check func()) {
	be := newBackend(t, nil)
	sc := startSidecar(t, be.URL, leasePolicy(uid), true, "--store", "redis", "--redis-addrs", strings.Join(cluster.Addrs(), ","), "--redis-timeout", "2s")
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for range 8 {
		wg.Go(func() {
			for range 500 {
				req, err := http.NewRequest(http.MethodGet, sc.url+"/", nil)
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("X-Key", "hot")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
				if res.StatusCode == http.StatusOK {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	hits := metricSum(t, sc.admin, "floodgate_sidecar_lease_hits_total")
	if err := sc.stop(t); err != nil {
		t.Fatal(err)
	}
	counted := fixedWindowTotal(t, cluster, uid)
	return func() {
		if hits == 0 {
			t.Error("no lease hits for a key at thousands of requests a second")
		}
		if got, want := allowed.Load(), int64(4000); got != want {
			t.Fatalf("%d requests allowed, want all %d", got, want)
		}
		if got, want := be.hits.Load(), allowed.Load(); got != want {
			t.Errorf("the backend saw %d requests, want the %d allowed", got, want)
		}
		if got, want := counted, allowed.Load(); got != want {
			t.Errorf("Redis counts %d after the sidecar stopped, want the %d it let through", got, want)
		}
		t.Logf("%d allowed, %v of them on a lease", allowed.Load(), hits)
	}
}

// metricSum sums a metric family's samples on a sidecar's /metrics.
func metricSum(t *testing.T, admin, family string) float64 {
	t.Helper()
	res, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, family+"{") && !strings.HasPrefix(line, family+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// fixedWindowTotal sums the counts of every FixedWindow counter of the
// policy of uid in the cluster (keys fg:{uid:...}:fw:2, 16 bytes: window
// start, count).
func fixedWindowTotal(t *testing.T, cluster *redistest.Cluster, uid string) int64 {
	t.Helper()
	cc := cluster.NewClient()
	defer func() { _ = cc.Close() }()
	var mu sync.Mutex
	var total int64
	err := cc.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "fg:{"+uid+":*:fw:2").Result()
		if err != nil {
			return err
		}
		for _, k := range keys {
			st, err := c.Get(ctx, k).Result()
			if err != nil {
				return err
			}
			if len(st) != 16 {
				return fmt.Errorf("%s: state of %d bytes, want 16", k, len(st))
			}
			mu.Lock()
			total += int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(st[8:16]))))
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}
