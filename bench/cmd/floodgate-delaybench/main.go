// Command floodgate-delaybench measures a rule with onExceed: Delay (the
// leaky bucket that queues, issue 37) beside nginx's limit_req without
// nodelay, in one run, on loopback.
//
// Delay phase: a 3-master Redis Cluster, 3 floodgate-sidecar processes
// sharing it (the real binary, standalone with a policy file), each in
// front of its own application (a re-exec of this binary that records the
// arrival time of every request), and one rule of -rate per second on one
// key with onExceed: Delay, maxDelay -max-delay and delayAfter
// -delay-after. An open-loop load offers -offered requests a second for
// -duration, spread over the 3 sidecars in turn, on that one key, so that
// the rule's rate is global. Every request carries its number (X-Req); the
// applications log it with their arrival time, and the load generator
// records its status and latency, so each request is known to have been
// passed at once, delayed (and by how much: its arrival less its
// scheduled send) or refused with 429.
//
// nginx phase: one nginx (one process, one worker loop, as floodgate-bench
// runs it) with limit_req zone=... rate=-rate r/s burst=-nginx-burst, no
// nodelay, answering 429 past the burst, in front of the same kind of
// application, on the same traffic. nginx passes $limit_req_status
// (PASSED, DELAYED, REJECTED) to the application, which logs it.
//
// For both: the arrivals per second across the applications (the bar: the
// rate ± 2% in every full second of the offer after the first), the
// requests delayed and refused, the delay distribution, and the CPU time
// of the limiting processes (the 3 sidecars; nginx) per delayed request,
// from /proc; the bar is the sidecars' at most 1.2 times nginx's.
//
// Memory phase: one sidecar (Redis store, --max-delayed raised) and a
// rule of 1 a minute per key with maxDelay 60s and delayAfter 1; one
// primer per key (passed at once), then -mem-waiting connections, one per
// key, each sending one request that waits for the rest of the minute, so
// that none is released while the phase runs: the sidecar's RSS before
// and with them all waiting, and bytes per waiting request. Then the same
// in nginx (limit_req rate=1r/m burst=1).
//
// Where taskset exists and there are two CPUs, the limiting processes
// (sidecars, nginx) run on CPU 0, the load generator, the applications
// and Redis on CPU 1. The table goes to stdout, the JSON report to -out.
//
//	floodgate-delaybench [-sidecar bin/floodgate-sidecar] [-duration 30s] [-phases delay,nginx,memory] [-out delay.json]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "floodgate-delaybench:", err)
		os.Exit(1)
	}
}

// options are the bench's settings.
type options struct {
	sidecar    string
	nginx      string
	duration   time.Duration
	rate       int
	offered    float64
	maxDelay   time.Duration
	delayAfter int
	nginxBurst int
	workers    int
	phases     map[string]bool
	sidecarArg []string
	memWaiting int
	memRate    float64
	out        string
	pin        bool
	limit      string
	profile    string
}

func run(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if len(args) > 0 && args[0] == "app" {
		fs := flag.NewFlagSet("app", flag.ContinueOnError)
		addr := fs.String("listen", "127.0.0.1:8080", "address to serve on")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return serveApp(ctx, *addr)
	}
	fs := flag.NewFlagSet("floodgate-delaybench", flag.ContinueOnError)
	var o options
	var phases, extra string
	fs.StringVar(&o.sidecar, "sidecar", "", "floodgate-sidecar binary, e.g. bin/floodgate-sidecar from make build (default: go build it)")
	fs.StringVar(&o.nginx, "nginx", "", `nginx binary (default: nginx on $PATH or /usr/sbin/nginx; "off": no nginx phase)`)
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "how long the load is offered in each phase")
	fs.IntVar(&o.rate, "rate", 100, "the rule's (and nginx's) rate, requests per second, on one key")
	fs.Float64Var(&o.offered, "offered", 300, "requests per second offered, open loop")
	fs.DurationVar(&o.maxDelay, "max-delay", 2*time.Second, "the rule's maxDelay")
	fs.IntVar(&o.delayAfter, "delay-after", 1, "the rule's delayAfter")
	fs.IntVar(&o.nginxBurst, "nginx-burst", 200, "nginx limit_req burst (rate x maxDelay queues as long as the rule)")
	fs.IntVar(&o.workers, "workers", 2000, "open-loop requests in flight at most")
	fs.StringVar(&phases, "phases", "delay,nginx,memory,nginx-memory", "phases to run: delay (the sidecars), nginx (the same traffic through nginx), memory (requests waiting in a sidecar), nginx-memory (the same in nginx); not by default: deny and nginx-deny (the same traffic and meter answering 429 at once, for the cost per request without delays)")
	fs.StringVar(&extra, "sidecar-args", "", "extra floodgate-sidecar flags for every sidecar, space-separated (e.g. a per-rule waiting bound)")
	fs.IntVar(&o.memWaiting, "mem-waiting", 10000, "memory phase: requests left waiting")
	fs.Float64Var(&o.memRate, "mem-rate", 1000, "memory phase: primers, then connections, sent per second")
	fs.StringVar(&o.limit, "limit", "", "replace the rules' limit in the sidecar config document (default: built from -rate, -max-delay, -delay-after; checking the plumbing only)")
	fs.StringVar(&o.profile, "profile", "", "write a CPU profile of the first sidecar over the delay phase's offer here (go tool pprof)")
	fs.StringVar(&o.out, "out", "", "write the JSON report here too")
	fs.BoolVar(&o.pin, "pin", true, "pin the limiters to CPU 0 and the load, applications and Redis to CPU 1 with taskset, where it exists")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.phases = map[string]bool{}
	for _, p := range strings.Split(phases, ",") {
		switch p = strings.TrimSpace(p); p {
		case "delay", "nginx", "memory", "nginx-memory", "deny", "nginx-deny":
			o.phases[p] = true
		case "":
		default:
			return fmt.Errorf("-phases: unknown phase %q", p)
		}
	}
	o.sidecarArg = strings.Fields(extra)
	if o.rate <= 0 || o.offered <= 0 || o.duration < 3*time.Second || o.maxDelay <= 0 || o.delayAfter < 1 || o.workers <= 0 {
		return errors.New("-rate, -offered, -max-delay, -workers must be positive, -delay-after at least 1 and -duration at least 3s")
	}
	if o.memWaiting <= 0 || o.memRate <= 0 {
		return errors.New("-mem-waiting and -mem-rate must be positive")
	}
	rep, err := runBench(ctx, o)
	if rep != nil {
		rep.table(os.Stdout)
		if o.out != "" {
			b, jerr := json.MarshalIndent(rep, "", "  ")
			if jerr != nil {
				return jerr
			}
			if werr := os.WriteFile(o.out, append(b, '\n'), 0o644); werr != nil {
				return fmt.Errorf("write the report: %w", werr)
			}
		}
	}
	return err
}
