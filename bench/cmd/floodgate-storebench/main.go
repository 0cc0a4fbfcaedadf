// Command floodgate-storebench measures the Redis counter store
// (sidecar/store/redisstore) against a real Redis Cluster on loopback, in
// one run on one cluster:
//
//   - the EVALSHA ceiling of the same Lua script, from redis-benchmark,
//     unpipelined and pipelined;
//   - decisions per second with concurrent callers through the store,
//     micro-batched, and through the unbatched baseline: one unpipelined
//     EVALSHA per decision over a go-redis connection pool (unbatched.go);
//   - the store's latency percentiles under an open-loop load at half the
//     batched maximum.
//
// The closed-loop measurements repeat -rounds times, interleaved, and the
// report gives every round and the medians, so that a machine whose load
// drifts biases no single mode. When taskset is available, the
// redis-server processes run on one CPU and this process and
// redis-benchmark on another, so that the load generator does not steal
// the server's core. Run it on an otherwise idle machine:
//
//	go run ./bench/cmd/floodgate-storebench -duration 5s -rounds 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "floodgate-storebench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var cfg Config
	fs := flag.NewFlagSet("floodgate-storebench", flag.ContinueOnError)
	cfg.Register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := Run(ctx, cfg, os.Stderr)
	if err != nil {
		return err
	}
	return rep.Write(os.Stdout, cfg.JSON)
}
