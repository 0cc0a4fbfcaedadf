// Command floodgate-clientbench measures how callers behave against a
// rate limit: many clients share one key of a real floodgate-sidecar
// (memory store), first each with floodgate's Go client (module
// github.com/floodgate-dev/floodgate/client, pacing on), then each with a
// naive retry loop that ignores the answers' fields. For each it reports,
// second by second, what the clients sent, what the sidecar admitted to the
// application and what it denied.
//
//	floodgate-clientbench [-clients 100] [-limit 50] [-duration 60s] [-naive-wait 0] [-out report.json]
//
// The client run passes when, after the first second, the application
// receives the limit (within 10%) and at most 5% of what the clients send
// is denied; the command then exits 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "floodgate-clientbench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet("floodgate-clientbench", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.clients, "clients", 100, "clients sharing the key")
	fs.IntVar(&o.limit, "limit", 50, "the key's limit, requests per second (TokenBucket, burst equal to the limit)")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "length of each run")
	fs.DurationVar(&o.naiveWait, "naive-wait", 0, "the naive loop's fixed pause after a 429 (0: retry at once)")
	fs.StringVar(&o.sidecar, "sidecar", "", "floodgate-sidecar binary (default: go build it)")
	out := fs.String("out", "", "also write the JSON report to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rep, err := bench(ctx, o, os.Stdout)
	if err != nil {
		return err
	}
	if *out != "" {
		if err := rep.write(*out); err != nil {
			return err
		}
	}
	if !rep.Client.Pass {
		return fmt.Errorf("the client run missed its targets: %s", rep.Client.Verdict)
	}
	return nil
}
