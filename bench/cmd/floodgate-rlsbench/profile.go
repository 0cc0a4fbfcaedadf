package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/runner"
)

// With -cpuprofile the servers under test profile themselves: the null
// server and the floodgate sidecar, which then runs in process in a
// re-exec of this harness (the same runner code as floodgate-sidecar, with
// a profiler it cannot otherwise offer) rather than as the sidecar
// binary. Each serves a loopback control endpoint on which the harness
// starts a CPU profile just before a measurement and stops it just after,
// so each profile covers exactly one measured case and round.

// profiler starts and stops CPU profiles on request. Only one profile
// runs at a time, as runtime/pprof allows.
type profiler struct {
	mu sync.Mutex
	f  *os.File
}

// ServeHTTP serves /start?path=FILE and /stop.
func (p *profiler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r.URL.Path {
	case "/start":
		if p.f != nil {
			http.Error(w, "a profile is already running", http.StatusConflict)
			return
		}
		f, err := os.Create(r.URL.Query().Get("path"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		p.f = f
	case "/stop":
		if p.f == nil {
			http.Error(w, "no profile is running", http.StatusConflict)
			return
		}
		pprof.StopCPUProfile()
		err := p.f.Close()
		p.f = nil
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	default:
		http.NotFound(w, r)
	}
}

// serveControl serves a profiler on addr until ctx ends.
func serveControl(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("control listener: %w", err)
	}
	srv := &http.Server{Handler: &profiler{}, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("control server: %w", err)
	}
	return nil
}

// serveSidecar runs floodgate-sidecar's runner in this process with the
// given sidecar flags until ctx ends.
func serveSidecar(ctx context.Context, args []string) error {
	var cfg runner.Config
	fs := flag.NewFlagSet("floodgate-sidecar", flag.ContinueOnError)
	if err := cfg.Parse(fs, args, os.LookupEnv); err != nil {
		return fmt.Errorf("sidecar flags: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: runner.LogLevel(cfg.LogLevel)}))
	r, err := runner.New(cfg, log, nil)
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	return r.Run(ctx)
}

// profileCall asks the server behind a control address to start a profile
// into path (path non-empty) or to stop it (path empty).
func profileCall(ctx context.Context, control, path string) error {
	u := "http://" + control + "/stop"
	if path != "" {
		u = "http://" + control + "/start?path=" + url.QueryEscape(path)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile control %s: %w", u, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b := make([]byte, 512)
		n, _ := resp.Body.Read(b)
		return fmt.Errorf("profile control %s: %s: %s", u, resp.Status, b[:n])
	}
	return nil
}
