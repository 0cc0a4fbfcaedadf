package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// WaitReplicated waits until every replica among clients has its link to
// its master up and has caught up with the master's replication offset
// (the masters must be among clients too), so that a test that then kills
// a master loses no write. It gives up after timeout.
func WaitReplicated(ctx context.Context, clients []*redis.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type replica struct {
		addr, master string
		offset       int64
		up           bool
	}
	for {
		offsets := map[string]int64{}
		var replicas []replica
		for _, c := range clients {
			info, err := c.Info(ctx, "replication").Result()
			if err != nil {
				return fmt.Errorf("redistest: info replication on %s: %w", c.Options().Addr, err)
			}
			if infoField(info, "role") == "master" {
				offsets[c.Options().Addr] = infoInt(info, "master_repl_offset")
				continue
			}
			replicas = append(replicas, replica{
				addr:   c.Options().Addr,
				master: net.JoinHostPort(infoField(info, "master_host"), infoField(info, "master_port")),
				offset: infoInt(info, "slave_repl_offset"),
				up:     infoField(info, "master_link_status") == "up",
			})
		}
		behind := ""
		for _, r := range replicas {
			if want, ok := offsets[r.master]; !r.up || !ok || r.offset < want {
				behind = r.addr
			}
		}
		if behind == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: replica %s did not catch up with its master in %v: %w", behind, timeout, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// infoField returns the value of field in an INFO reply, "" when absent.
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

func infoInt(info, field string) int64 {
	n, _ := strconv.ParseInt(infoField(info, field), 10, 64)
	return n
}
