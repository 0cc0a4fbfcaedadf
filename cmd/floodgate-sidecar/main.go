// Command floodgate-sidecar is floodgate's enforcement proxy. It sits in
// front of an application, matches each request to the rate-limit rules in
// force, and proxies it or answers 429. See package runner for the flags
// and their environment variables.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/floodgate-dev/floodgate/sidecar/runner"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "floodgate-sidecar:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var cfg runner.Config
	fs := flag.NewFlagSet("floodgate-sidecar", flag.ContinueOnError)
	if err := cfg.Parse(fs, args, os.LookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: runner.LogLevel(cfg.LogLevel)}))
	r, err := runner.New(cfg, log, nil)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return r.Run(ctx)
}
