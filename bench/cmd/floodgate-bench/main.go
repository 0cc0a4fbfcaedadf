// Command floodgate-bench is floodgate's load harness. It starts a backend,
// floodgate-sidecar processes and a Redis Cluster on loopback, pins them to
// cores with taskset where it can, and measures the latency the sidecar
// adds, its decisions per second for cold, hot-allowed and hot-denied keys,
// and the Redis script calls of a hot-key flood. When nginx is installed
// (hack/bench.sh installs Debian's nginx-light) it first measures the
// sidecar beside nginx in the same layout, in alternated rounds: CPU per
// request for proxied requests (proxy_pass) and denied ones (limit_req,
// with and without each one's default logging), and the latency each
// adds at 2000/s and at shares of the sidecar's maximum. It prints a table
// with the ratios and writes a JSON report.
//
//	floodgate-bench [-duration 5s] [-redis=true] [-sidecar bin] [-nginx path|off] [-only-reference] [-out report.json]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/floodgate-dev/floodgate/bench/harness"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "floodgate-bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if len(args) > 0 && args[0] == "backend" {
		fs := flag.NewFlagSet("backend", flag.ContinueOnError)
		addr := fs.String("listen", "127.0.0.1:8080", "address to serve on")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return harness.ServeBackend(ctx, *addr)
	}
	if len(args) > 0 && (args[0] == "floor-answer" || args[0] == "floor-proxy") {
		fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
		addr := fs.String("listen", "127.0.0.1:8082", "address to serve on")
		epoll := fs.Bool("epoll", false, "floor-answer: one raw epoll loop instead of a goroutine per connection")
		upstream := fs.String("upstream", "127.0.0.1:8080", "floor-proxy: the backend")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if args[0] == "floor-proxy" {
			return harness.ServeFloorProxy(ctx, *addr, *upstream)
		}
		return harness.ServeFloorAnswer(ctx, *addr, *epoll)
	}
	fs := flag.NewFlagSet("floodgate-bench", flag.ContinueOnError)
	var o harness.Options
	fs.StringVar(&o.SidecarBin, "sidecar", "", "floodgate-sidecar binary (default: go build it)")
	fs.DurationVar(&o.Duration, "duration", 5*time.Second, "length of each measurement")
	fs.IntVar(&o.Conns, "conns", 64, "closed-loop concurrency")
	fs.IntVar(&o.Workers, "workers", 512, "open-loop requests in flight at most")
	fs.BoolVar(&o.Redis, "redis", true, "run the Redis Cluster scenarios (needs redis-server)")
	fs.IntVar(&o.FloodLimit, "flood-limit", 50, "per-second limit of the flooded key; the flood offers 100x")
	fs.DurationVar(&o.RedisTimeout, "redis-timeout", 0, "the sidecars' --redis-timeout (default: the sidecar's 50ms)")
	fs.StringVar(&o.Nginx, "nginx", "", `nginx binary measured beside the sidecar (default: nginx on $PATH or /usr/sbin/nginx; "off": no reference phase)`)
	fs.BoolVar(&o.OnlyReference, "only-reference", false, "run only the reference phase (the sidecar beside nginx)")
	out := fs.String("out", "", "write the JSON report here (default: stdout)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Log = os.Stderr
	rep, err := harness.Run(ctx, o)
	if err != nil {
		return err
	}
	w := os.Stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		if err := rep.WriteJSON(f); err != nil {
			_ = f.Close()
			return err
		}
		return f.Close()
	}
	return rep.WriteJSON(w)
}
