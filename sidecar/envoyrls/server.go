// Package envoyrls serves Envoy's rate-limit service API,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, on the
// sidecar's decision engine: the same rules, store, local deny cache,
// fallback buckets, shadow mode and metrics as the HTTP proxy.
//
// # Matching
//
// A call names a domain and one or more descriptors. Each descriptor is
// matched against the descriptor rules of that domain (rules with
// match.descriptors, see ruleset.Descriptors) as envoyproxy/ratelimit
// matches it: entry by entry, an equal value before a wildcard value
// before a key-only entry, with no backtracking, and only rules with as
// many entries as the descriptor. Every rule on the node a descriptor ends
// on applies, so a per-second burst and a daily quota on the same
// descriptor are both enforced. A rule named in another applying rule's
// replaces is dropped for the call. A key-only or wildcard entry counts per
// distinct value: the counter key hashes every entry's key and value.
//
// # Decision
//
// All the counted hits of a call, over all its descriptors, go to one
// engine decision, so tightest wins across descriptors: if any enforced
// rule denies, the call is OVER_LIMIT and no counter is charged for it
// (envoyproxy/ratelimit would still increment the others). A descriptor's
// hits_addend, when set, is its cost; otherwise the call's hits_addend, 0
// meaning 1. A descriptor's hits_addend of 0 is a check ("is one unit
// left?"): decided as a cost of 1, OVER_LIMIT on a spent key, it charges
// and changes nothing (limiter.Request.Cost).
//
// # Answer
//
// overall_code is OK or OVER_LIMIT. There is one status per descriptor:
// OVER_LIMIT when one of its enforced rules denied, else OK; current_limit,
// limit_remaining and duration_until_reset describe its binding rule (the
// denying one with the longest wait, else the one with the least
// remaining). A descriptor that matched no rule gets a bare OK; an
// unlimited one OK with limit_remaining 2^32-1. Shadow rules are counted
// and reported in their descriptor's status but answer OK. A fail-closed
// rule whose store is unreachable makes the call OVER_LIMIT with
// duration_until_reset 1s: Envoy's failure_mode_deny only covers RPC
// errors, and with it off (its default) an error would admit the request.
//
// Malformed calls get INVALID_ARGUMENT; a call before the first config is
// loaded gets UNAVAILABLE. A Server is safe for concurrent use.
package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/events"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// ServiceName is the gRPC service name, also the health service name.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Options configure a Server.
type Options struct {
	// Registerer receives the server's metrics. Required.
	Registerer prometheus.Registerer
	// Events receives deny events; nil disables them.
	Events *events.Queue
	// ResponseHeaders adds the rate-limit response fields of the binding
	// rule to response_headers_to_add, as the HTTP proxy sets them:
	// X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset,
	// RateLimit-Policy, RateLimit, and Retry-After on OVER_LIMIT.
	ResponseHeaders bool
	// Log receives errors; nil uses slog.Default().
	Log *slog.Logger
	// Authenticate serves only authenticated gateways: a call must come
	// over TLS with a verified client certificate (the listener's TLS
	// configuration requires and verifies one; this is the check behind
	// it), and a request descriptor is honoured only from a Gateway that
	// its policy lists (config.Policy.Gateways), as the certificate's
	// gateway identity names it (config.GatewayOf). A call without a
	// verified certificate gets UNAUTHENTICATED; a call with a request
	// descriptor for a policy that does not list the caller's gateway
	// (or from a certificate that names none) gets PERMISSION_DENIED,
	// and charges nothing. Descriptors of descriptor rules, which belong
	// to no gateway, are answered to any authenticated caller.
	Authenticate bool
}

// Server implements RateLimitServiceServer.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	o      Options
	state  atomic.Pointer[state]
	health *health.Server
	pool   sync.Pool

	ok, overLimit, invalid, notReady prometheus.Counter
	unauthenticated, denied          prometheus.Counter
	duration                         prometheus.Observer
}

type state struct {
	eng *engine.Engine
	set *ruleset.Set
}

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

// New returns a Server. It answers UNAVAILABLE, and its health service
// NOT_SERVING, until Install is called.
func New(o Options) (*Server, error) {
	if o.Registerer == nil {
		return nil, errors.New("envoyrls: Registerer is required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &Server{o: o, health: health.NewServer()}
	s.pool.New = func() any { return new(scratch) }
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "floodgate_sidecar", Subsystem: "rls", Name: "calls_total",
		Help: "ShouldRateLimit calls by answer: ok, over_limit, invalid_argument, unavailable (no config loaded yet), unauthenticated (no verified client certificate), permission_denied (a request descriptor of a policy whose gateways do not include the caller's).",
	}, []string{"code"})
	dur := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "floodgate_sidecar", Subsystem: "rls", Name: "call_duration_seconds",
		Help:    "Time to answer one ShouldRateLimit call, from the decoded request to the response, store calls included.",
		Buckets: []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1},
	})
	if err := o.Registerer.Register(calls); err != nil {
		return nil, fmt.Errorf("envoyrls: register metrics: %w", err)
	}
	if err := o.Registerer.Register(dur); err != nil {
		return nil, fmt.Errorf("envoyrls: register metrics: %w", err)
	}
	s.ok = calls.WithLabelValues("ok")
	s.overLimit = calls.WithLabelValues("over_limit")
	s.invalid = calls.WithLabelValues("invalid_argument")
	s.notReady = calls.WithLabelValues("unavailable")
	s.unauthenticated = calls.WithLabelValues("unauthenticated")
	s.denied = calls.WithLabelValues("permission_denied")
	s.duration = dur
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	return s, nil
}

// Install puts an engine and a compiled rule set in force for the calls
// that start afterwards, and turns the health service SERVING.
func (s *Server) Install(eng *engine.Engine, set *ruleset.Set) {
	if eng == nil || set == nil {
		return
	}
	s.state.Store(&state{eng: eng, set: set})
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// Shutdown turns the health service NOT_SERVING for good, so that
// clients move away before the listener closes.
func (s *Server) Shutdown() { s.health.Shutdown() }

// Register registers the rate-limit service, the gRPC health service
// (grpc.health.v1) and server reflection on g.
func (s *Server) Register(g *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
	reflection.Register(g)
}

// ShouldRateLimit implements RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	var caller string
	if s.o.Authenticate {
		cert := verifiedClient(ctx)
		if cert == nil {
			s.unauthenticated.Inc()
			return nil, status.Error(codes.Unauthenticated, "the rate-limit service serves only callers with a verified client certificate")
		}
		caller, _ = config.GatewayOf(cert.URIs)
	}
	if err := Validate(req); err != nil {
		s.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	st := s.state.Load()
	if st == nil {
		s.notReady.Inc()
		return nil, status.Error(codes.Unavailable, "the rate limiter has no configuration yet")
	}
	if s.o.Authenticate {
		if err := authorize(st, req, caller); err != nil {
			s.denied.Inc()
			return nil, err
		}
	}
	sc := s.pool.Get().(*scratch)
	defer s.release(sc)
	resp := s.decide(ctx, st, req, sc)
	if resp.OverallCode == rlsv3.RateLimitResponse_OK {
		s.ok.Inc()
	} else {
		s.overLimit.Inc()
	}
	s.duration.Observe(time.Since(start).Seconds())
	return resp, nil
}

func (s *Server) release(sc *scratch) {
	clear(sc.hits)
	clear(sc.hrule)
	clear(sc.nodes)
	clear(sc.drop)
	clear(sc.blocks)
	clear(sc.http.vals)
	clear(sc.http.h)
	s.pool.Put(sc)
}
