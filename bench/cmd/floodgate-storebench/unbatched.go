package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

// store is what a measured phase drives: the Redis store, or the unbatched
// baseline.
type store interface {
	limiter.Store
	PipelineStats() redisstore.PipelineStats
	Close() error
}

var (
	_ store = (*redisstore.Store)(nil)
	_ store = (*unbatched)(nil)
)

// unbatched is the baseline the store's batching is measured against: every
// decision is one EVALSHA of the store's own script (EVAL after NOSCRIPT),
// unpipelined, through a go-redis ClusterClient with a pool of connections
// per node, and the reply is checked as the store checks it
// (redisstore.ParseReply). It has none of the store's circuit breakers or
// its rule never to resend a script whose outcome is unknown: it only
// measures, it does not decide anything real. It serves one limit, the
// phase's.
type unbatched struct {
	cc      *redis.ClusterClient
	script  *redis.Script
	p       *limiter.Params
	tail    []any // ARGV after now and the cost
	timeout time.Duration
}

// newUnbatched returns the baseline for limit l on the cluster at addrs,
// with pool connections per node and a per-call deadline of timeout.
func newUnbatched(addrs []string, l limiter.Limit, pool int, timeout time.Duration) (*unbatched, error) {
	p, err := limiter.NewParams(l)
	if err != nil {
		return nil, err
	}
	src, _, _, ok := redislayout.TakeScript(l.Algorithm)
	if !ok {
		return nil, fmt.Errorf("no script for %v", l.Algorithm)
	}
	args := redisstore.ScriptArgs(p, -1, 0)[2:] // the limit's constants
	tail := make([]any, len(args))
	for i, a := range args {
		tail[i] = a
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                    addrs,
		Protocol:                 2,
		PoolSize:                 pool,
		MinIdleConns:             1,
		MaxRetries:               -1,
		DialerRetries:            1,
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		ContextTimeoutEnabled:    true,
		DisableIdentity:          true,
		ClientName:               "floodgate-storebench-unbatched",
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	return &unbatched{cc: cc, script: redis.NewScript(src), p: p, tail: tail, timeout: timeout}, nil
}

// Take runs the script once for req, which must carry the baseline's
// limit. It does not report shards: the shard is always "".
func (u *unbatched) Take(ctx context.Context, req limiter.Request) (limiter.Decision, string, error) {
	d, err := u.take(ctx, req)
	return d, "", err
}

func (u *unbatched) take(ctx context.Context, req limiter.Request) (limiter.Decision, error) {
	if req.Limit != u.p.Limit {
		return limiter.Decision{}, fmt.Errorf("unbatched baseline serves %v, got %v", u.p.Limit, req.Limit)
	}
	ctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	args := make([]any, 0, 2+len(u.tail))
	args = append(args, "", req.Cost) // "": the script reads Redis TIME
	args = append(args, u.tail...)
	res, err := u.script.Run(ctx, u.cc, []string{redislayout.CounterKey(req.Key, u.p.Limit.Algorithm)}, args...).Result()
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("%v script: %w", u.p.Limit.Algorithm, err)
	}
	return redisstore.ParseReply(res, u.p)
}

// PipelineStats is zero: the baseline pipelines nothing.
func (u *unbatched) PipelineStats() redisstore.PipelineStats { return redisstore.PipelineStats{} }

// Close closes the connections.
func (u *unbatched) Close() error { return u.cc.Close() }
