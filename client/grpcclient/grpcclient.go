// Package grpcclient holds gRPC client interceptors that back off when a
// service rate-limits its callers, the gRPC counterpart of package
// github.com/floodgate-dev/floodgate/client.
//
// A call is rate-limited when it fails with RESOURCE_EXHAUSTED, or with
// UNAVAILABLE because an HTTP proxy in front of the service, such as
// floodgate's sidecar, answered 429 (gRPC maps that status to UNAVAILABLE).
// Such a call is retried:
//
//   - after the grpc-retry-pushback-ms trailer when the server sent one
//     (gRFC A6), plus a random extra of up to twice as much, capped by
//     MaxJitter; a negative or malformed pushback means "do not retry";
//   - otherwise after an exponential backoff with full jitter;
//   - within a budget: at most MaxRetries, no wait beyond MaxWait or the
//     call's deadline (the error is then returned at once);
//   - only when the method is idempotent: its proto declares
//     idempotency_level NO_SIDE_EFFECTS or IDEMPOTENT, Options.Idempotent
//     says so, or RetryNonIdempotent is set.
//
// With Pace set, the interceptors also read the rate-limit fields a
// service sends as header metadata (ratelimit, ratelimit-policy,
// x-ratelimit-*, retry-after) into a client.Pacer per connection target,
// which spaces the calls before they are denied.
//
// A stream is retried only while nothing has been received on it and it
// sends at most one message (server-streaming calls): the message is
// replayed on the new stream.
package grpcclient

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/floodgate-dev/floodgate/client"
)

// PushbackKey is the trailer in which a server says how long to wait before
// retrying, in milliseconds (gRFC A6).
const PushbackKey = "grpc-retry-pushback-ms"

// Options configure the interceptors. The zero value is usable.
type Options struct {
	// MaxRetries bounds the retries of one call; 0 means
	// client.DefaultMaxRetries, negative disables retries.
	MaxRetries int
	// MaxWait bounds the time one call spends waiting between attempts;
	// 0 means client.DefaultMaxWait. The call's deadline bounds it too.
	MaxWait time.Duration
	// BaseDelay and MaxDelay shape the backoff with full jitter used when
	// the server sent no pushback; defaults client.DefaultBaseDelay and
	// client.DefaultMaxDelay.
	BaseDelay, MaxDelay time.Duration
	// MaxJitter caps the random extra added to a pushback; 0 means
	// client.DefaultMaxJitter.
	MaxJitter time.Duration
	// Idempotent, when set, says whether a method ("/pkg.Service/Method")
	// may be retried; it overrides the proto's idempotency_level.
	Idempotent func(method string) bool
	// RetryNonIdempotent retries every method.
	RetryNonIdempotent bool
	// Pace spaces the calls from the rate-limit fields of the answers.
	Pace bool
	// Rand returns a uniform number in [0, 1); nil uses math/rand/v2.
	Rand func() float64
}

// Interceptors holds the shared state of a unary and a stream interceptor:
// their pacers. It is safe for concurrent use.
type Interceptors struct {
	o      Options
	mu     sync.Mutex
	pacers map[string]*client.Pacer
}

// New returns interceptors with o's settings.
func New(o Options) *Interceptors {
	if o.MaxRetries == 0 {
		o.MaxRetries = client.DefaultMaxRetries
	}
	if o.MaxWait <= 0 {
		o.MaxWait = client.DefaultMaxWait
	}
	if o.BaseDelay <= 0 {
		o.BaseDelay = client.DefaultBaseDelay
	}
	if o.MaxDelay <= 0 {
		o.MaxDelay = client.DefaultMaxDelay
	}
	if o.MaxJitter <= 0 {
		o.MaxJitter = client.DefaultMaxJitter
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	return &Interceptors{o: o, pacers: map[string]*client.Pacer{}}
}

// DialOptions returns the options that install both interceptors.
func (in *Interceptors) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(in.Unary()), grpc.WithChainStreamInterceptor(in.Stream())}
}

func (in *Interceptors) pacer(target string) *client.Pacer {
	if !in.o.Pace {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	p := in.pacers[target]
	if p == nil {
		p = &client.Pacer{MaxJitter: in.o.MaxJitter, Rand: in.o.Rand}
		in.pacers[target] = p
	}
	return p
}

// call is the retry state of one call.
type call struct {
	in        *Interceptors
	ctx       context.Context
	method    string
	pacer     *client.Pacer
	budget    time.Time
	retryable bool
}

func (in *Interceptors) newCall(ctx context.Context, cc *grpc.ClientConn, method string) *call {
	c := &call{in: in, ctx: ctx, method: method, pacer: in.pacer(cc.Target()), budget: time.Now().Add(in.o.MaxWait)}
	if dl, ok := ctx.Deadline(); ok && dl.Before(c.budget) {
		c.budget = dl
	}
	c.retryable = in.o.RetryNonIdempotent || in.idempotent(method)
	return c
}

// pace waits for the caller's slot, unless it does not fit the budget.
func (c *call) pace() error {
	if c.pacer == nil {
		return nil
	}
	now := time.Now()
	if wait := c.pacer.Reserve(now); wait > 0 && !now.Add(wait).After(c.budget) {
		return sleep(c.ctx, wait)
	}
	return nil
}

// observe feeds the pacer an attempt's outcome.
func (c *call) observe(header, trailer metadata.MD, err error) {
	if c.pacer == nil {
		return
	}
	now := time.Now()
	f := client.ParseFields(toHTTP(header, trailer), now)
	code := http.StatusOK
	if limited(err) {
		code = http.StatusTooManyRequests
		if ms, ok := pushback(trailer); ok && ms >= 0 {
			f.RetryAfter, f.HasRetryAfter = time.Duration(ms)*time.Millisecond, true
		}
	}
	c.pacer.Observe(now, code, f)
}

// retryDelay says whether a failed attempt is retried, and after how long.
func (c *call) retryDelay(attempt int, trailer metadata.MD, err error) (time.Duration, bool) {
	o := &c.in.o
	if err == nil || !c.retryable || attempt >= o.MaxRetries || !limited(err) {
		return 0, false
	}
	now := time.Now()
	var d time.Duration
	if ms, ok := pushback(trailer); ok {
		if ms < 0 {
			return 0, false
		}
		p := time.Duration(ms) * time.Millisecond
		d = p + time.Duration(o.Rand()*float64(min(2*p, o.MaxJitter)))
	} else {
		d = client.FullJitter(o.BaseDelay, o.MaxDelay, attempt, o.Rand)
	}
	if c.pacer != nil {
		d = max(d, c.pacer.Wait(now))
	}
	if now.Add(d).After(c.budget) {
		return 0, false
	}
	return d, true
}

// Unary returns the unary client interceptor.
func (in *Interceptors) Unary() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		c := in.newCall(ctx, cc, method)
		for attempt := 0; ; attempt++ {
			if err := c.pace(); err != nil {
				return err
			}
			var header, trailer metadata.MD
			err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&header), grpc.Trailer(&trailer))...)
			c.observe(header, trailer, err)
			d, ok := c.retryDelay(attempt, trailer, err)
			if !ok {
				return err
			}
			if err := sleep(ctx, d); err != nil {
				return status.FromContextError(err).Err()
			}
		}
	}
}

// Stream returns the stream client interceptor.
func (in *Interceptors) Stream() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		c := in.newCall(ctx, cc, method)
		if err := c.pace(); err != nil {
			return nil, err
		}
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			c.observe(nil, nil, err)
			return nil, err
		}
		s := &stream{ClientStream: cs, c: c, desc: desc, cc: cc, streamer: streamer, opts: opts}
		s.replayable = c.retryable && !desc.ClientStreams
		return s, nil
	}
}

// stream retries a server-streaming call that fails, rate-limited, before
// it has received anything.
type stream struct {
	grpc.ClientStream
	c        *call
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	streamer grpc.Streamer
	opts     []grpc.CallOption

	replayable bool // nothing received yet, at most one message sent
	sent       []any
	closed     bool
	attempt    int
}

func (s *stream) SendMsg(m any) error {
	if s.replayable {
		if len(s.sent) > 0 {
			s.replayable = false
		} else {
			s.sent = append(s.sent, m)
		}
	}
	return s.ClientStream.SendMsg(m)
}

func (s *stream) CloseSend() error {
	s.closed = true
	return s.ClientStream.CloseSend()
}

func (s *stream) RecvMsg(m any) error {
	for {
		err := s.ClientStream.RecvMsg(m)
		if err == nil || errors.Is(err, io.EOF) {
			if err == nil && s.attempt == 0 && s.c.pacer != nil {
				if h, herr := s.Header(); herr == nil {
					s.c.observe(h, nil, nil)
				}
			}
			s.replayable = false
			return err
		}
		trailer := s.Trailer()
		s.c.observe(nil, trailer, err)
		if !s.replayable {
			return err
		}
		d, ok := s.c.retryDelay(s.attempt, trailer, err)
		if !ok {
			return err
		}
		if serr := sleep(s.c.ctx, d); serr != nil {
			return status.FromContextError(serr).Err()
		}
		if perr := s.c.pace(); perr != nil {
			return status.FromContextError(perr).Err()
		}
		s.attempt++
		cs, nerr := s.streamer(s.c.ctx, s.desc, s.cc, s.c.method, s.opts...)
		if nerr != nil {
			return nerr
		}
		s.ClientStream = cs
		for _, msg := range s.sent {
			if serr := cs.SendMsg(msg); serr != nil {
				return serr
			}
		}
		if s.closed {
			if cerr := cs.CloseSend(); cerr != nil {
				return cerr
			}
		}
	}
}

// http429 is how grpc-go reports an HTTP 429 answer from a proxy, which it
// maps to UNAVAILABLE.
const http429 = "unexpected HTTP status code received from server: 429"

// limited reports whether err says the call was rate-limited.
func limited(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.ResourceExhausted:
		return true
	case codes.Unavailable:
		return strings.Contains(s.Message(), http429)
	}
	return false
}

// pushback reads the pushback trailer: its value in milliseconds, and
// whether it was present. A malformed value reads as -1, "do not retry".
func pushback(trailer metadata.MD) (int64, bool) {
	v := trailer.Get(PushbackKey)
	if len(v) == 0 {
		return 0, false
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64)
	if err != nil || ms < 0 {
		return -1, true
	}
	return min(ms, int64(24*time.Hour/time.Millisecond)), true
}

// toHTTP turns metadata into an http.Header for client.ParseFields.
func toHTTP(mds ...metadata.MD) http.Header {
	h := http.Header{}
	for _, md := range mds {
		for k, vs := range md {
			for _, v := range vs {
				h.Add(k, v)
			}
		}
	}
	return h
}

// idempotent reports whether a method may be retried: Options.Idempotent,
// else the proto's idempotency_level, looked up in the global registry.
func (in *Interceptors) idempotent(method string) bool {
	if in.o.Idempotent != nil {
		return in.o.Idempotent(method)
	}
	svc, name, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok {
		return false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return false
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return false
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return false
	}
	mo, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || mo == nil {
		return false
	}
	switch mo.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_NO_SIDE_EFFECTS, descriptorpb.MethodOptions_IDEMPOTENT:
		return true
	}
	return false
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
