// Command floodgate-sample-backend is the sample application of the README
// and of the real-node tests: an HTTP server that answers every request
// with 200 and a small JSON body naming the pod and the path, and counts
// what it receives.
//
// The counts are served on a second port (--stats-listen, /hits), which an
// injected sidecar does not front, so a test can read how many requests
// really reached the application behind the sidecar, and check that no
// denied request did.
//
// Usage: floodgate-sample-backend [--listen :8080] [--stats-listen :8081]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "floodgate-sample-backend:", err)
		os.Exit(1)
	}
}

// counter counts requests by path. It is safe for concurrent use.
type counter struct {
	mu     sync.Mutex
	total  int64
	byPath map[string]int64
}

func (c *counter) add(path string) {
	c.mu.Lock()
	c.total++
	c.byPath[path]++
	c.mu.Unlock()
}

// Hits is the answer of the stats port's /hits.
type Hits struct {
	// Pod is the pod's name ($POD_NAME, else the host name).
	Pod string `json:"pod"`
	// Total counts every request the app port received.
	Total int64 `json:"total"`
	// Paths counts them by URL path.
	Paths map[string]int64 `json:"paths"`
}

func (c *counter) snapshot(pod string) Hits {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := Hits{Pod: pod, Total: c.total, Paths: make(map[string]int64, len(c.byPath))}
	for p, n := range c.byPath {
		h.Paths[p] = n
	}
	return h
}

func run() error {
	listen := flag.String("listen", ":8080", "address of the application port")
	stats := flag.String("stats-listen", ":8081", "address of the port serving /hits and /healthz; empty disables it")
	flag.Parse()
	pod := os.Getenv("POD_NAME")
	if pod == "" {
		pod, _ = os.Hostname()
	}
	c := &counter{byPath: map[string]int64{}}
	app := &http.Server{
		Addr:              *listen,
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.add(r.URL.Path)
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]string{"pod": pod, "method": r.Method, "path": r.URL.Path})
		}),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hits", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(c.snapshot(pod))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprintln(w, "ok") })
	servers := []*http.Server{app}
	if *stats != "" {
		servers = append(servers, &http.Server{Addr: *stats, ReadHeaderTimeout: 5 * time.Second, Handler: mux})
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() {
			if err := s.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serving %s: %w", s.Addr, err)
			}
		}()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(shutdown)
	}
	return nil
}
