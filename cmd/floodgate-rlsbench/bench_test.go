package main

import (
	"context"
	"net"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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

// The load generator counts every answer of a real server over a socket.
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
	t.Cleanup(func() { cancel(); <-done })
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := waitServing(ctx, c); err != nil {
		t.Fatal(err)
	}
	ok, over, errs := load(ctx, []*grpc.ClientConn{c}, 4, 200*time.Millisecond, func(int64) *rlcommonv3.RateLimitDescriptor { return entry("k", "v") })
	if ok == 0 || over != 0 || errs != 0 {
		t.Errorf("load: ok %d, over %d, errors %d; want only OKs", ok, over, errs)
	}
	_ = rlsv3.RateLimitResponse_OK
}
