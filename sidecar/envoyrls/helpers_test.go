package envoyrls_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/rlsimport"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// rls is a Server on a real loopback socket with a client connected.
type rls struct {
	srv    *envoyrls.Server
	reg    *prometheus.Registry
	conn   *grpc.ClientConn
	client rlsv3.RateLimitServiceClient
	eng    *engine.Engine
}

type setup struct {
	store     limiter.Store
	parallel  bool
	headers   bool
	noInstall bool
	// clock is the in-memory stores' clock (the store when store is nil,
	// and the fallback); nil is one that stands still at testNow, so that
	// a test's calls never straddle the edge of a window.
	clock func() time.Time
}

// testNow is the instant the in-memory stores' clock stands still at by
// default: well inside its minute, hour and day.
var testNow = time.Date(2026, 3, 1, 12, 29, 30, 0, time.UTC)

// newRLS serves doc (either config format) on 127.0.0.1:0. A nil store
// is a fresh in-memory store.
func newRLS(t *testing.T, doc string, s setup) *rls {
	t.Helper()
	c, _, _, err := rlsimport.LoadAny([]byte(doc), rlsimport.Options{})
	if err != nil {
		t.Fatalf("load config: %v", err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.NewMetrics(reg)
	set, err := ruleset.Compile(c, labels.Set{}, m)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	if s.clock == nil {
		s.clock = func() time.Time { return testNow }
	}
	if s.store == nil {
		if s.store, err = memstore.New(memstore.WithClock(s.clock)); err != nil {
			t.Fatal(err)
		}
	}
	fallback, err := memstore.New(memstore.WithClock(s.clock))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Options{Store: s.store, Fallback: fallback, Metrics: m, Parallel: s.parallel})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := envoyrls.New(envoyrls.Options{Registerer: reg, ResponseHeaders: s.headers})
	if err != nil {
		t.Fatal(err)
	}
	if !s.noInstall {
		srv.Install(eng, set)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(ln)
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
		<-done
	})
	return &rls{srv: srv, reg: reg, conn: conn, client: rlsv3.NewRateLimitServiceClient(conn), eng: eng}
}

// d builds a descriptor from "key=value" pairs.
func d(pairs ...string) *rlcommonv3.RateLimitDescriptor {
	out := &rlcommonv3.RateLimitDescriptor{}
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		out.Entries = append(out.Entries, &rlcommonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return out
}

func req(domain string, ds ...*rlcommonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// call makes one ShouldRateLimit call and fails the test on an RPC error.
func (r *rls) call(t *testing.T, in *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := r.client.ShouldRateLimit(ctx, in)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", in, err)
	}
	if got, want := len(out.Statuses), len(in.Descriptors); got != want {
		t.Fatalf("%d statuses for %d descriptors", got, want)
	}
	return out
}

// count makes n identical calls and returns how many were OK.
func (r *rls) count(t *testing.T, n int, in *rlsv3.RateLimitRequest) (ok int) {
	t.Helper()
	for range n {
		if r.call(t, in).OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// metric sums the series of a counter of the server's registry that carry
// the given label pairs.
func (r *rls) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)
