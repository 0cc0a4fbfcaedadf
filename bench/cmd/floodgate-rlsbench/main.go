// Command floodgate-rlsbench measures floodgate-sidecar's Envoy
// rate-limit service: ShouldRateLimit decisions per second and the
// server's CPU time per decision, for cold keys, one hot allowed key and
// one hot key over its limit, against a 3-master Redis Cluster on
// loopback; and, in the same run, a null ShouldRateLimit server that
// answers OK at once, as the floor. The servers are pinned to CPU 0 with
// GOMAXPROCS=1, the load generator and Redis to CPU 1 (taskset).
//
//	go run ./bench/cmd/floodgate-rlsbench -duration 5s -out rlsbench.json
//
// With -ratelimit-bin PATH, envoyproxy/ratelimit (its service_cmd) runs
// beside the sidecar on the same Redis Cluster and policy (written in its
// format), pinned the same way, in the same rounds, and the report gives
// its CPU per decision over floodgate's in each case: only such same-run
// ratios are comparable, as the peer's cost moves from run to run.
//
// With -cpuprofile DIR each server profiles itself during each measured
// case and round, into DIR/<case>-r<round>.pprof (null, cold, hot-allowed,
// hot-denied); the sidecar then runs its runner in a re-exec of this
// binary, as the sidecar binary has no profiler:
//
//	go build -o bin/ ./bench/cmd/floodgate-rlsbench && bin/floodgate-rlsbench -cpuprofile prof
//	go tool pprof -top bin/floodgate-rlsbench prof/hot-allowed-r*.pprof
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "floodgate-rlsbench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var cfg Config
	fs := flag.NewFlagSet("floodgate-rlsbench", flag.ContinueOnError)
	cfg.Register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.Control != "" {
		go func() {
			if err := serveControl(ctx, cfg.Control); err != nil {
				fmt.Fprintln(os.Stderr, "floodgate-rlsbench:", err)
			}
		}()
	}
	switch {
	case cfg.ServeNull != "":
		return serveNull(ctx, cfg.ServeNull)
	case cfg.ServeSidecar:
		return serveSidecar(ctx, fs.Args())
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	rep, err := Run(ctx, cfg, os.Stderr)
	if err != nil {
		return err
	}
	if err := rep.Write(os.Stdout); err != nil {
		return err
	}
	if cfg.Out != "" {
		f, err := os.Create(cfg.Out)
		if err != nil {
			return err
		}
		if err := rep.WriteJSON(f); err != nil {
			_ = f.Close()
			return err
		}
		return f.Close()
	}
	return nil
}
