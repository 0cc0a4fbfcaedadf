package main

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/test/envoyemu"
)

func TestParseStatCPU(t *testing.T) {
	t.Parallel()
	// A command name with spaces and a parenthesis, utime 250, stime 50.
	line := "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 3 0 100 1000000 200 18446744073709551615"
	got, err := parseStatCPU(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * time.Second; got != want {
		t.Errorf("parseStatCPU = %v, want %v", got, want)
	}
	if _, err := parseStatCPU("garbage"); err == nil {
		t.Error("no error for a line without a command field")
	}
}

// The load generator counts every answer of a real server over a socket:
// exactly the OK answers its calls returned. The run ends once the calls
// have had answers enough (okAnswers), not after a stretch of wall time
// in which a busy machine may answer none.
func TestLoadAgainstNullServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveNull(ctx, addr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("null server: %v", err)
		}
	})
	const okAnswers = 50
	runCtx, endRun := context.WithCancel(ctx)
	defer endRun()
	// answers counts, from the start of the run, the OK answers the
	// load's calls return, and ends the run at okAnswers.
	var running atomic.Bool
	var answers atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if out, ok := reply.(*rlsv3.RateLimitResponse); ok && err == nil && running.Load() && out.OverallCode == rlsv3.RateLimitResponse_OK {
			if answers.Add(1) == okAnswers {
				endRun()
			}
		}
		return err
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(count))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if err := waitServing(ctx, c); err != nil {
		t.Fatal(err)
	}
	running.Store(true)
	ok, over, errs := load(runCtx, []*grpc.ClientConn{c}, 4, time.Hour, func(int64) *rlcommonv3.RateLimitDescriptor { return entry("k", "v") })
	if got, want := ok, answers.Load(); got != want || got < okAnswers {
		t.Errorf("load counted %d OKs, its calls returned %d (the run ended at %d)", got, want, okAnswers)
	}
	if over != 0 || errs != 0 {
		t.Errorf("load: ok %d, over %d, errors %d; want only OKs", ok, over, errs)
	}
}

// The control endpoint starts and stops a CPU profile over a real socket,
// and refuses a second start or a stop without a profile.
func TestProfileControl(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveControl(ctx, addr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	// Wait for the control server: until it answers the stop without a
	// profile (409), or fails to start.
	var err2 error
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err2 = profileCall(ctx, addr, ""); err2 != nil && strings.Contains(err2.Error(), "409") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the control server never answered: %v", err2)
		}
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("the control server ended: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !strings.Contains(err2.Error(), "no profile is running") {
		t.Fatalf("stop without a profile: %v, want a conflict", err2)
	}
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	if err := profileCall(ctx, addr, path); err != nil {
		t.Fatal(err)
	}
	if err := profileCall(ctx, addr, path+".2"); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second start: %v, want a conflict", err)
	}
	if err := profileCall(ctx, addr, ""); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A CPU profile is gzip-compressed protobuf.
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("profile %s is not gzip data: % x", path, b[:min(len(b), 8)])
	}
}

func TestRoundRatio(t *testing.T) {
	t.Parallel()
	// Rounds 1 and 3 ran under outside load that slowed both servers.
	got := roundRatio([]float64{60, 40, 90}, []float64{30, 20, 45})
	if want := 2.0; got != want {
		t.Errorf("roundRatio = %v, want %v", got, want)
	}
	if got := roundRatio([]float64{10, 30}, []float64{0, 10}); got != 3 {
		t.Errorf("roundRatio with a zero floor = %v, want 3 (the round without a floor skipped)", got)
	}
	if got := roundRatio(nil, nil); got != 0 {
		t.Errorf("roundRatio of no rounds = %v, want 0", got)
	}
}

// TestRequestDescriptorIsTheGateways checks that the central service's
// workload sends what a gateway with floodgate's generated route actions
// sends for the same request.
func TestRequestDescriptorIsTheGateways(t *testing.T) {
	t.Parallel()
	rl := gatewayconfig.RateLimit(gatewayconfig.Policy{Name: "gw", Headers: []string{"X-Api-Key"}})
	ds, err := envoyemu.Descriptors([]*routev3.RateLimit{rl}, gatewayconfig.Stage, &envoyemu.Request{
		Method: "GET", Target: "/api/items?page=2", Authority: "api.example.com",
		Headers: http.Header{"X-Api-Key": {"k1"}}, Client: netip.MustParseAddr("203.0.113.7"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 {
		t.Fatalf("%d descriptors, want 1", len(ds))
	}
	if got, want := ds[0], requestDescriptor("gw", "k1"); !proto.Equal(got, want) {
		t.Errorf("gateway sends %v, the workload %v", got, want)
	}
}

func TestCentralRatios(t *testing.T) {
	t.Parallel()
	r := &Report{Cases: []Case{
		{ID: "null", Server: serverNull, CPUMicrosPerDecision: 10, Rounds: []float64{10, 10}},
		{ID: "hot-allowed", Server: serverFloodgate, CPUMicrosPerDecision: 20, Rounds: []float64{20, 40}},
		{ID: "central-hot-allowed", Server: serverCentral, CPUMicrosPerDecision: 30, Rounds: []float64{30, 40}},
	}}
	r.centralRatios()
	c := r.Cases[2]
	if got, want := c.CentralOverSidecar, 1.5; got != want {
		t.Errorf("CentralOverSidecar = %v, want %v", got, want)
	}
	if got, want := c.RoundCentralOverSidecar, roundRatio([]float64{30, 40}, []float64{20, 40}); got != want {
		t.Errorf("RoundCentralOverSidecar = %v, want %v", got, want)
	}
	if r.Cases[1].CentralOverSidecar != 0 {
		t.Error("a sidecar case got a central ratio")
	}
}

// The Redis command count sums the calls of every command clients send,
// not INFO's (the harness's own reads) nor those scripts run inside Redis.
func TestParseCommandStats(t *testing.T) {
	t.Parallel()
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=1200,usec=5000,usec_per_call=4.17,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=7,usec=300,usec_per_call=42.86,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_cluster|slots:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_time:calls=1200,usec=600,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_set:calls=1100,usec=900,usec_per_call=0.82,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_incrby:calls=40,usec=40,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n"
	got, err := parseCommandStats(info)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(1243); got != want {
		t.Errorf("parseCommandStats = %d, want %d", got, want)
	}
	if _, err := parseCommandStats("cmdstat_evalsha:calls=x,usec=1\r\n"); err == nil {
		t.Error("no error for a calls field that is not a number")
	}
}
