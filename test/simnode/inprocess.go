package simnode

import (
	"context"
	"flag"
	"log/slog"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/runner"
)

// RunInProcess runs a sidecar in this test's process with args
// (floodgate-sidecar's flags, without --listen and --admin-listen, which
// it sets to free loopback ports), waits until it is ready, and stops it
// at the end of the test, failing the test if its Run returned an error.
// It returns the proxy's URL.
func RunInProcess(t testing.TB, args ...string) string {
	t.Helper()
	var cfg runner.Config
	fs := flag.NewFlagSet("floodgate-sidecar", flag.ContinueOnError)
	args = append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)
	if err := cfg.Parse(fs, args, func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	r, err := runner.New(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sidecar %v: %v", args, err)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for !r.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("sidecar not ready: %+v", r.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "http://" + r.ProxyAddr()
}
