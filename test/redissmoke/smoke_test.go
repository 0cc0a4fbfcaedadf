// Package redissmoke checks, against a real Redis Cluster from
// test/redistest, the basic facts floodgate's Redis store builds on: a Lua
// script runs on every master, a script's key lands in the slot Redis
// computes for it, on the master that owns that slot and nowhere else, and
// a master refuses a key it does not own.
package redissmoke

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/test/redistest"
)

// incrScript bumps a counter, sets its TTL and answers the new value and
// the TTL it set, which shows it ran as a whole on the node that holds the
// key.
//
// KEYS[1]: the counter. ARGV[1]: increment. ARGV[2]: TTL in ms.
// Reply: {value, pttl}.
var incrScript = redis.NewScript(`
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {v, redis.call('PTTL', KEYS[1])}
`)

// shardOwner returns the address of the master that serves slot according
// to CLUSTER SHARDS as node sees it.
func shardOwner(t *testing.T, node *redis.Client, slot int) string {
	t.Helper()
	shards, err := node.ClusterShards(t.Context()).Result()
	if err != nil {
		t.Fatalf("cluster shards: %v", err)
	}
	for _, sh := range shards {
		owns := false
		for _, r := range sh.Slots {
			if int64(slot) >= r.Start && int64(slot) <= r.End {
				owns = true
			}
		}
		if !owns {
			continue
		}
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				return n.IP + ":" + strconv.FormatInt(n.Port, 10)
			}
		}
	}
	t.Fatalf("no master serves slot %d", slot)
	return ""
}

func TestLuaKeyReachesItsShard(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, redistest.Options{Masters: 3, Replicas: 1})
	ctx := t.Context()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(masters), 3; got != want {
		t.Fatalf("masters = %d, want %d", got, want)
	}
	byAddr := map[string]*redistest.Node{}
	for _, m := range masters {
		byAddr[m.Addr()] = m
	}
	cl := c.NewClient()
	t.Cleanup(func() { _ = cl.Close() })

	// Find one key for every master, using Redis's own slot function and
	// its own shard map, so that the script runs on every master.
	keyFor := map[string]string{}
	for i := 0; len(keyFor) < len(masters) && i < 10000; i++ {
		key := fmt.Sprintf("fg:{smoke:%d}:n", i)
		slot, err := masters[0].Client().ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("cluster keyslot %s: %v", key, err)
		}
		owner := shardOwner(t, masters[0].Client(), int(slot))
		if _, ok := keyFor[owner]; !ok {
			keyFor[owner] = key
		}
	}
	if len(keyFor) != len(masters) {
		t.Fatalf("found keys for %d of %d masters", len(keyFor), len(masters))
	}

	for owner, key := range keyFor {
		m, ok := byAddr[owner]
		if !ok {
			t.Fatalf("CLUSTER SHARDS names master %s, which redistest does not list as a master", owner)
		}
		slot, err := m.Client().ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}

		// Through the cluster client, twice: the second run sees the
		// first's count, so both ran on the same node.
		for want := int64(2); want <= 4; want += 2 {
			res, err := incrScript.Run(ctx, cl, []string{key}, 2, 60000).Slice()
			if err != nil {
				t.Fatalf("script on %s via the cluster client: %v", key, err)
			}
			if len(res) != 2 {
				t.Fatalf("script reply %v, want 2 elements", res)
			}
			if got, ok := res[0].(int64); !ok || got != want {
				t.Fatalf("script value = %v, want %d", res[0], want)
			}
			if ttl, ok := res[1].(int64); !ok || ttl <= 0 || ttl > 60000 {
				t.Fatalf("script pttl = %v, want in (0, 60000]", res[1])
			}
		}
		// Directly on the owning master, the same script succeeds.
		if _, err := incrScript.Run(ctx, m.Client(), []string{key}, 1, 60000).Slice(); err != nil {
			t.Fatalf("script directly on owner %s: %v", owner, err)
		}

		// The key is on its owner and on no other master.
		for _, other := range masters {
			n, err := other.Client().ClusterCountKeysInSlot(ctx, int(slot)).Result()
			if err != nil {
				t.Fatalf("countkeysinslot on %s: %v", other.Addr(), err)
			}
			want := int64(0)
			if other == m {
				want = 1
			}
			if n != want {
				t.Errorf("slot %d (key %s) on master %s holds %d keys, want %d", slot, key, other.Addr(), n, want)
			}
			if other != m {
				// A master that does not own the slot refuses the script.
				err := incrScript.Run(ctx, other.Client(), []string{key}, 1, 60000).Err()
				if err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
					t.Errorf("script for %s on non-owner %s: %v, want MOVED", key, other.Addr(), err)
				}
			}
		}
		// It reaches the owner's replica as well.
		reps, err := c.ReplicasOf(ctx, m)
		if err != nil || len(reps) != 1 {
			t.Fatalf("replicas of %s: %v, %v", owner, reps, err)
		}
		if err := m.Client().Do(ctx, "wait", 1, 2000).Err(); err != nil {
			t.Fatalf("wait on %s: %v", owner, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := reps[0].Client().ClusterCountKeysInSlot(ctx, int(slot)).Result()
			if err == nil && n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %s of %s holds %d keys in slot %d (%v), want 1", reps[0].Addr(), owner, n, slot, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
