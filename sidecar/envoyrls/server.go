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
// hits_addend, when set, is its cost (0 checks without charging); otherwise
// the call's hits_addend, 0 meaning 1.
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
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/events"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/ruleset"
)

// Bounds on a call. Anything beyond them is INVALID_ARGUMENT: no rule can
// match it (config entries are shorter), and it bounds the work of a call.
const (
	MaxDomainLength       = 1024
	MaxDescriptors        = 64
	MaxEntries            = 32
	MaxKeyLength          = 1024
	MaxValueLength        = 16 << 10
	MaxCost         int64 = limiter.MaxRequests
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
}

// Server implements RateLimitServiceServer.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	o      Options
	state  atomic.Pointer[state]
	health *health.Server
	pool   sync.Pool

	ok, overLimit, invalid, notReady prometheus.Counter
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
		Help: "ShouldRateLimit calls by answer: ok, over_limit, invalid_argument, unavailable (no config loaded yet).",
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

// scratch is the per-call working space, pooled.
type scratch struct {
	hits   []engine.Hit
	owner  []int32 // descriptor of each hit
	hrule  []*ruleset.DescriptorRule
	nodes  []*ruleset.DescriptorNode
	costs  []int64
	drop   []*ruleset.DescriptorRule
	blocks []blockHit
	v      engine.Verdict
	buf    []byte
}

type blockHit struct {
	desc int
	rule *ruleset.DescriptorRule
}

// ShouldRateLimit implements RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	if err := Validate(req); err != nil {
		s.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	st := s.state.Load()
	if st == nil {
		s.notReady.Inc()
		return nil, status.Error(codes.Unavailable, "the rate limiter has no configuration yet")
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
	s.pool.Put(sc)
}

// Validate reports why a call is malformed, or nil.
func Validate(req *rlsv3.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return errors.New("domain must not be empty")
	}
	if len(req.Domain) > MaxDomainLength {
		return fmt.Errorf("domain: at most %d bytes, got %d", MaxDomainLength, len(req.Domain))
	}
	if len(req.Descriptors) == 0 {
		return errors.New("descriptors must not be empty")
	}
	if len(req.Descriptors) > MaxDescriptors {
		return fmt.Errorf("descriptors: at most %d, got %d", MaxDescriptors, len(req.Descriptors))
	}
	if int64(req.HitsAddend) > MaxCost {
		return fmt.Errorf("hits_addend: at most %d, got %d", MaxCost, req.HitsAddend)
	}
	for i, d := range req.Descriptors {
		if d == nil || len(d.Entries) == 0 {
			return fmt.Errorf("descriptors[%d]: entries must not be empty", i)
		}
		if len(d.Entries) > MaxEntries {
			return fmt.Errorf("descriptors[%d]: at most %d entries, got %d", i, MaxEntries, len(d.Entries))
		}
		for j, e := range d.Entries {
			switch {
			case e == nil || e.Key == "":
				return fmt.Errorf("descriptors[%d].entries[%d]: key must not be empty", i, j)
			case len(e.Key) > MaxKeyLength:
				return fmt.Errorf("descriptors[%d].entries[%d]: key: at most %d bytes, got %d", i, j, MaxKeyLength, len(e.Key))
			case len(e.Value) > MaxValueLength:
				return fmt.Errorf("descriptors[%d].entries[%d]: value: at most %d bytes, got %d", i, j, MaxValueLength, len(e.Value))
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.Value > uint64(MaxCost) {
			return fmt.Errorf("descriptors[%d].hits_addend: at most %d, got %d", i, MaxCost, h.Value)
		}
		if d.IsNegativeHits {
			return fmt.Errorf("descriptors[%d].is_negative_hits: refunds are not supported", i)
		}
		if d.Limit != nil {
			return fmt.Errorf("descriptors[%d].limit: limit overrides are not supported; set the limit in the policy", i)
		}
	}
	return nil
}

// costOf returns descriptor d's cost in call req.
func costOf(req *rlsv3.RateLimitRequest, d *rlcommonv3.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(h.Value)
	}
	return max(1, int64(req.HitsAddend))
}

func (s *Server) decide(ctx context.Context, st *state, req *rlsv3.RateLimitRequest, sc *scratch) *rlsv3.RateLimitResponse {
	resp, blocks := newAnswer(len(req.Descriptors))
	root := st.set.Descriptors.Domain(req.Domain)
	if root == nil {
		// Unknown domain: nothing applies, as in envoyproxy/ratelimit.
		for i := range blocks {
			blocks[i].status.Code = rlsv3.RateLimitResponse_OK
			resp.Statuses[i] = &blocks[i].status
		}
		return resp
	}

	// Walk every descriptor and collect what the matched rules replace.
	sc.nodes = sc.nodes[:0]
	sc.drop = sc.drop[:0]
	for _, d := range req.Descriptors {
		n := root
		for _, e := range d.Entries {
			if n = n.Next(e.Key, e.Value); n == nil {
				break
			}
		}
		sc.nodes = append(sc.nodes, n)
		if n != nil {
			for _, r := range n.Rules {
				sc.drop = append(sc.drop, r.Replaces...)
			}
		}
	}

	// Build the hits.
	sc.hits, sc.owner, sc.hrule, sc.blocks = sc.hits[:0], sc.owner[:0], sc.hrule[:0], sc.blocks[:0]
	sc.costs = sc.costs[:0]
	blocked := false
	for i, n := range sc.nodes {
		cost := costOf(req, req.Descriptors[i])
		sc.costs = append(sc.costs, cost)
		if n == nil {
			continue
		}
		var hash [hashLen]byte
		hashed := false
		for _, r := range n.Rules {
			if replaced(sc.drop, r) {
				continue
			}
			switch {
			case r.Unlimited:
				r.Metrics.Allowed.Inc()
			case r.Block:
				sc.blocks = append(sc.blocks, blockHit{desc: i, rule: r})
				if r.Shadow {
					r.Metrics.ShadowDenied.Inc()
				} else {
					blocked = true
					r.Metrics.Denied.Inc()
				}
			default:
				if !hashed {
					hash, sc.buf = entriesHash(req.Descriptors[i].Entries, sc.buf)
					hashed = true
				}
				sc.hits = append(sc.hits, engine.Hit{Rule: r.Engine, Key: counterKey(r.Prefix, &hash), Cost: cost})
				sc.owner = append(sc.owner, int32(i))
				sc.hrule = append(sc.hrule, r)
			}
		}
	}
	if blocked {
		// A rule that denies every call matched: charge no enforced rule.
		k := 0
		for j := range sc.hits {
			if sc.hits[j].Rule.Shadow {
				sc.hits[k], sc.owner[k], sc.hrule[k] = sc.hits[j], sc.owner[j], sc.hrule[j]
				k++
			}
		}
		sc.hits, sc.owner, sc.hrule = sc.hits[:k], sc.owner[:k], sc.hrule[:k]
	}
	v := &sc.v
	if len(sc.hits) > 0 {
		st.eng.Decide(ctx, sc.hits, v)
	} else {
		v.Outcome, v.Binding, v.Results = engine.Allow, -1, v.Results[:0]
	}
	if blocked || v.Outcome != engine.Allow {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}

	now := time.Now()
	for i := range resp.Statuses {
		resp.Statuses[i] = s.descriptorStatus(i, sc, v, now, &blocks[i])
	}
	if s.o.ResponseHeaders {
		resp.ResponseHeadersToAdd = s.headers(sc, v, blocked, now)
	}
	s.publish(ctx, sc, v)
	return resp
}

// replaced reports whether r is among the replaced rules.
func replaced(drop []*ruleset.DescriptorRule, r *ruleset.DescriptorRule) bool {
	for _, d := range drop {
		if d == r {
			return true
		}
	}
	return false
}

// hashLen is the length of an entries hash: 128 bits in hex.
const hashLen = 32

// entriesHash returns the hex SHA-256/128 of the entries, each key and
// value length-prefixed so that no two descriptors share an encoding.
func entriesHash(es []*rlcommonv3.RateLimitDescriptor_Entry, buf []byte) ([hashLen]byte, []byte) {
	buf = buf[:0]
	for _, e := range es {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(e.Key)))
		buf = append(buf, e.Key...)
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(e.Value)))
		buf = append(buf, e.Value...)
	}
	sum := sha256.Sum256(buf)
	var hx [hashLen]byte
	hex.Encode(hx[:], sum[:hashLen/2])
	return hx, buf
}

// counterKey returns prefix followed by hash, in one allocation: the
// key is the one string a hit keeps after the call.
func counterKey(prefix string, hash *[hashLen]byte) string {
	var b strings.Builder
	b.Grow(len(prefix) + hashLen)
	b.WriteString(prefix)
	b.Write(hash[:])
	return b.String()
}

// statusBlock holds one descriptor status and the messages it points to,
// so that a status costs no allocation of its own.
type statusBlock struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	mult   wrapperspb.UInt32Value
	reset  durationpb.Duration
}

// answer1 is the whole answer to a call of one descriptor, the common
// case, in one allocation.
type answer1 struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	blocks   [1]statusBlock
}

// newAnswer returns an OK response with room for nd statuses, and the
// blocks to build them in. The statuses are left nil. Everything is new:
// the response outlives the call (gRPC marshals it afterwards), so none of
// it may be pooled.
func newAnswer(nd int) (*rlsv3.RateLimitResponse, []statusBlock) {
	if nd == 1 {
		a := &answer1{}
		a.resp.OverallCode = rlsv3.RateLimitResponse_OK
		a.resp.Statuses = a.statuses[:]
		return &a.resp, a.blocks[:]
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, nd)}
	return resp, make([]statusBlock, nd)
}

// view is what one status or header set reports about a rule's decision.
type view struct {
	rule      *ruleset.DescriptorRule
	denied    bool // enforced and not admitted
	remaining int64
	reset     time.Duration
	retry     time.Duration
	evaluated bool
}

// descriptorStatus builds descriptor i's status from its hits, in blk.
func (s *Server) descriptorStatus(i int, sc *scratch, v *engine.Verdict, now time.Time, blk *statusBlock) *rlsv3.RateLimitResponse_DescriptorStatus {
	ds := &blk.status
	ds.Code = rlsv3.RateLimitResponse_OK
	n := sc.nodes[i]
	if n == nil {
		return ds
	}
	var best *view
	var cand view
	pick := func(c view) {
		switch {
		case best == nil:
		case c.denied != best.denied:
			if !c.denied {
				return
			}
		case c.denied:
			if c.retry <= best.retry {
				return
			}
		case c.rule.Shadow != best.rule.Shadow:
			if c.rule.Shadow {
				return
			}
		case c.remaining >= best.remaining:
			return
		}
		cand = c
		best = &cand
	}
	unlimited := false
	for _, b := range sc.blocks {
		if b.desc == i {
			pick(blockView(b.rule, now))
		}
	}
	for j := range sc.hits {
		if int(sc.owner[j]) != i {
			continue
		}
		pick(hitView(sc.hrule[j], j, v))
	}
	if best == nil {
		for _, r := range n.Rules {
			if r.Unlimited && !replaced(sc.drop, r) {
				unlimited = true
			}
		}
		if unlimited {
			ds.LimitRemaining = math.MaxUint32
		}
		return ds
	}
	if best.denied {
		ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	ds.CurrentLimit = currentLimit(best.rule, blk)
	ds.LimitRemaining = uint32(min(max(best.remaining, 0), math.MaxUint32))
	if best.evaluated {
		blk.reset.Seconds = ceilSeconds(max(best.reset, best.retry), 0)
		ds.DurationUntilReset = &blk.reset
	}
	return ds
}

func hitView(r *ruleset.DescriptorRule, j int, v *engine.Verdict) view {
	res := v.Results[j]
	c := view{rule: r, remaining: res.Remaining, reset: res.ResetAfter, retry: res.RetryAfter, evaluated: res.Source != engine.NotEvaluated}
	switch {
	case !c.evaluated:
		// Decided before this hit was checked: the call took nothing.
		c.remaining = 0
	case res.Source == engine.FromNowhere:
		c.denied, c.remaining = !r.Shadow, 0
	case !res.Allowed:
		c.denied, c.remaining = !r.Shadow, 0
	}
	return c
}

// blockView reports a rule that denies every call: nothing remains until
// the end of its window.
func blockView(r *ruleset.DescriptorRule, now time.Time) view {
	p := r.Limit.Period
	left := p - time.Duration(now.UnixNano()%int64(p))
	return view{rule: r, denied: !r.Shadow, remaining: 0, reset: left, retry: left, evaluated: true}
}

// currentLimit expresses a rule's limit in Envoy's units, in blk: the
// largest unit that divides the period, with a multiplier when it is not 1.
func currentLimit(r *ruleset.DescriptorRule, blk *statusBlock) *rlsv3.RateLimitResponse_RateLimit {
	l := &blk.limit
	l.Name, l.RequestsPerUnit = r.PolicyName, uint32(min(r.Limit.Requests, math.MaxUint32))
	p := r.Limit.Period
	for _, u := range units {
		if p%u.d == 0 {
			l.Unit = u.unit
			if m := p / u.d; m != 1 {
				blk.mult.Value = uint32(min(int64(m), math.MaxUint32))
				l.UnitMultiplier = &blk.mult
			}
			return l
		}
	}
	return l
}

var units = []struct {
	d    time.Duration
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
	{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// headers builds the response fields of the call's binding rule.
func (s *Server) headers(sc *scratch, v *engine.Verdict, blocked bool, now time.Time) []*corev3.HeaderValue {
	var b view
	switch {
	case blocked:
		for _, bh := range sc.blocks {
			if !bh.rule.Shadow {
				b = blockView(bh.rule, now)
				break
			}
		}
	case v.Binding >= 0:
		b = hitView(sc.hrule[v.Binding], v.Binding, v)
	default:
		return nil
	}
	reset := max(b.reset, b.retry)
	resetSec := strconv.FormatInt(ceilSeconds(reset, 0), 10)
	remaining := strconv.FormatInt(b.remaining, 10)
	lim := b.rule.Limit
	capacity := lim.Capacity()
	name := strconv.Quote(b.rule.PolicyName)
	hs := []*corev3.HeaderValue{
		{Key: "X-RateLimit-Limit", Value: strconv.FormatInt(capacity, 10)},
		{Key: "X-RateLimit-Remaining", Value: remaining},
		{Key: "X-RateLimit-Reset", Value: resetSec},
		{Key: "RateLimit-Policy", Value: name + ";q=" + strconv.FormatInt(lim.Requests, 10) + ";w=" + strconv.FormatInt(int64(lim.Period/time.Second), 10)},
		{Key: "RateLimit", Value: name + ";r=" + remaining + ";t=" + resetSec},
	}
	if b.denied {
		retry := b.retry
		if retry <= 0 {
			retry = reset
		}
		hs = append(hs, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(ceilSeconds(retry, 1), 10)})
	}
	return hs
}

// ceilSeconds rounds d up to whole seconds, at least floor.
func ceilSeconds(d time.Duration, floor int64) int64 {
	return max(int64((d+time.Second-1)/time.Second), floor)
}

// publish queues a deny event for each denying hit, shadow ones included.
func (s *Server) publish(ctx context.Context, sc *scratch, v *engine.Verdict) {
	if s.o.Events == nil {
		return
	}
	var client string
	for j, res := range v.Results {
		if res.Source == engine.NotEvaluated || res.Allowed || res.Source == engine.FromNowhere {
			continue
		}
		if client == "" {
			if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
				client = p.Addr.String()
			}
		}
		h := sc.hits[j]
		s.o.Events.Publish(events.Event{
			Time: time.Now(), Policy: h.Rule.Policy, Rule: h.Rule.Name, Key: h.Key,
			Shadow: h.Rule.Shadow, Source: res.Source.String(), Limit: res.Limit, Cost: h.Cost,
			RetryAfter: res.RetryAfter, Method: "ShouldRateLimit", Client: client,
		})
	}
}
