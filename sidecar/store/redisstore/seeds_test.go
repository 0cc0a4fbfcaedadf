package redisstore_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// TestSetAddrsFollowsAReplacedCluster replaces every node of a cluster, as
// deleting every Pod of a managed store does (new Pods, new IPs, a new
// cluster): the store keeps failing on the old addresses until it is given
// the new ones, then routes to the new masters without being rebuilt.
// Meanwhile new addresses that do not answer yet leave the working map in
// place.
func TestSetAddrsFollowsAReplacedCluster(t *testing.T) {
	t.Parallel()
	old := redistest.StartCluster(t, redistest.Options{Masters: 3})
	s := newStore(t, old, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Timeout: suiteTimeout,
		BreakerFailures: 2, BreakerCooldown: 100 * time.Millisecond})
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: time.Hour}
	keys := []string{uniqueKey(t) + ":a", uniqueKey(t) + ":b", uniqueKey(t) + ":c"}
	take := func(key string) error {
		_, _, err := s.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: 1})
		return err
	}
	for _, k := range keys {
		warmUp(t, func() error { return take(k) })
	}

	// Addresses where nothing listens: the old map stays in use.
	if err := s.SetAddrs([]string{"127.0.0.1:1", "127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Seeds(), []string{"127.0.0.1:1", "127.0.0.1:2"}; !slices.Equal(got, want) {
		t.Errorf("Seeds() = %v, want %v", got, want)
	}
	for range 20 {
		for _, k := range keys {
			if err := take(k); err != nil {
				t.Fatalf("decision while unreachable new seeds load: %v", err)
			}
		}
	}

	// Every node goes; a new cluster comes up elsewhere.
	for _, n := range old.Nodes() {
		if err := old.Kill(n); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		if err := take(k); !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("decision with every node gone: %v, want ErrUnavailable", err)
		}
	}
	repl := redistest.StartCluster(t, redistest.Options{Masters: 3})
	if err := s.SetAddrs(repl.Addrs()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, k := range keys {
		for {
			err := take(k)
			if err == nil {
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("no decision on the new cluster 10s after SetAddrs: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Logf("decisions on the replacement cluster %v after SetAddrs", time.Since(start).Round(time.Millisecond))
	// Every shard answering now is a node of the new cluster.
	for _, k := range keys {
		_, shard, err := s.Take(t.Context(), limiter.Request{Key: k, Limit: l, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(repl.Addrs(), shard) {
			t.Errorf("key %s answered by %s, not a node of the new cluster %v", k, shard, repl.Addrs())
		}
	}
}

// TestSetAddrsRejects bad addresses and single mode, and ignores a
// reordering of the same addresses.
func TestSetAddrsRejects(t *testing.T) {
	t.Parallel()
	s := newStore(t, cluster, redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow})
	if err := s.SetAddrs([]string{"no-port"}); err == nil || !strings.Contains(err.Error(), `addrs[0]: "no-port" is not host:port`) {
		t.Errorf("SetAddrs(no-port) = %v, want an error naming addrs[0]", err)
	}
	if err := s.SetAddrs(nil); err == nil {
		t.Error("SetAddrs(nil) succeeded")
	}
	rev := slices.Clone(cluster.Addrs())
	slices.Reverse(rev)
	if err := s.SetAddrs(rev); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Seeds(), slices.Sorted(slices.Values(cluster.Addrs())); !slices.Equal(got, want) {
		t.Errorf("Seeds() = %v, want %v", got, want)
	}

	single, err := redisstore.New(redisstore.Options{Addrs: []string{"127.0.0.1:1"}, Single: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = single.Close() }()
	if err := single.SetAddrs([]string{"127.0.0.1:2"}); err == nil {
		t.Error("SetAddrs succeeded in single mode")
	}
}
