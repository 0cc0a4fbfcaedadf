package grpcclient

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// limitedHealth is a health service on a real socket that rejects its
// first calls with RESOURCE_EXHAUSTED and a pushback trailer, and counts
// the calls it receives.
type limitedHealth struct {
	healthpb.UnimplementedHealthServer
	reject   int
	pushback string // "" sends none
	mu       sync.Mutex
	calls    []time.Time
}

func (h *limitedHealth) admit(ctx context.Context) error {
	h.mu.Lock()
	n := len(h.calls)
	h.calls = append(h.calls, time.Now())
	h.mu.Unlock()
	if n < h.reject {
		if h.pushback != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(PushbackKey, h.pushback))
		}
		return status.Error(codes.ResourceExhausted, "quota exceeded")
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("ratelimit", `"svc.calls";r=9;t=1`, "ratelimit-policy", `"svc.calls";q=10;w=1`))
	return nil
}

func (h *limitedHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := h.admit(ctx); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *limitedHealth) Watch(req *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	if req.GetService() != "svc" {
		return status.Error(codes.InvalidArgument, "the replayed request lost its service")
	}
	if err := h.admit(ss.Context()); err != nil {
		ss.SetTrailer(metadata.Pairs(PushbackKey, h.pushback))
		return err
	}
	return ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

func (h *limitedHealth) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.calls)
}

func (h *limitedHealth) gap(i int) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[i].Sub(h.calls[i-1])
}

// serve serves h on a real socket and returns a client with the
// interceptors of o and then extra dial options (an interceptor given
// there runs inside o's: it sees each attempt).
func serve(t *testing.T, h *limitedHealth, o Options, extra ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, h)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	in := New(o)
	cc, err := grpc.NewClient(ln.Addr().String(), append(append(in.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials())), extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return healthpb.NewHealthClient(cc)
}

func always(string) bool { return true }

func noJitter() float64 { return 0 }

func TestUnaryRetriesAfterThePushback(t *testing.T) {
	t.Parallel()
	h := &limitedHealth{reject: 1, pushback: "300"}
	c := serve(t, h, Options{Idempotent: always, Rand: noJitter})
	resp, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.GetStatus(), healthpb.HealthCheckResponse_SERVING; got != want {
		t.Errorf("status %v, want %v", got, want)
	}
	if got, want := h.count(), 2; got != want {
		t.Fatalf("the server saw %d calls, want %d", got, want)
	}
	if g := h.gap(1); g < 300*time.Millisecond {
		t.Errorf("retried after %v, want at least the 300ms pushback", g)
	}
}

func TestUnaryRetryRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		h        *limitedHealth
		o        Options
		deadline time.Duration
		calls    int
		code     codes.Code
	}{
		{"a negative pushback means no retry", &limitedHealth{reject: 1, pushback: "-1"}, Options{Idempotent: always}, 0, 1, codes.ResourceExhausted},
		{"a malformed pushback means no retry", &limitedHealth{reject: 1, pushback: "soon"}, Options{Idempotent: always}, 0, 1, codes.ResourceExhausted},
		{"without pushback: backoff with full jitter", &limitedHealth{reject: 2}, Options{Idempotent: always, BaseDelay: 10 * time.Millisecond}, 0, 3, codes.OK},
		{"a method not known to be idempotent is not retried", &limitedHealth{reject: 1, pushback: "10"}, Options{}, 0, 1, codes.ResourceExhausted},
		{"unless told to", &limitedHealth{reject: 1, pushback: "10"}, Options{RetryNonIdempotent: true}, 0, 2, codes.OK},
		{"within MaxRetries", &limitedHealth{reject: 10, pushback: "1"}, Options{Idempotent: always, MaxRetries: 3}, 0, 4, codes.ResourceExhausted},
		// A 2-minute pushback cannot fit a 1-minute deadline: the error
		// comes back before the deadline, where a wait would have ended
		// (DEADLINE_EXCEEDED).
		{"no wait beyond the deadline", &limitedHealth{reject: 1, pushback: "120000"}, Options{Idempotent: always}, time.Minute, 1, codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.o.Rand = noJitter
			c := serve(t, tc.h, tc.o)
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			start := time.Now()
			_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
			if got := status.Code(err); got != tc.code {
				t.Errorf("code %v (%v), want %v", got, err, tc.code)
			}
			if got := tc.h.count(); got != tc.calls {
				t.Errorf("the server saw %d calls, want %d", got, tc.calls)
			}
			if e := time.Since(start); tc.deadline > 0 && e >= tc.deadline {
				t.Errorf("returned after %v, want before the %v deadline: the wait cannot fit it", e, tc.deadline)
			}
		})
	}
}

func TestUnaryCancelledDuringTheWait(t *testing.T) {
	t.Parallel()
	// A 2-minute pushback, within MaxWait; the caller cancels once the
	// first attempt has failed, before or while the interceptor waits:
	// either way the wait ends with the cancellation, not 2 minutes later.
	const wait = 2 * time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelled time.Time
	attempts := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) == codes.ResourceExhausted {
			cancelled = time.Now()
			cancel()
		}
		return err
	})
	h := &limitedHealth{reject: 5, pushback: "120000"}
	c := serve(t, h, Options{Idempotent: always, MaxWait: time.Hour, Rand: noJitter}, attempts)
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
	if got, want := status.Code(err), codes.Canceled; got != want {
		t.Errorf("code %v, want %v", got, want)
	}
	if e := time.Since(cancelled); e >= wait/2 {
		t.Errorf("returned %v after the cancellation, want at it, not after the %v wait", e, wait)
	}
	if got, want := h.count(), 1; got != want {
		t.Errorf("the server saw %d calls, want %d: a cancelled call is not retried", got, want)
	}
}

func TestServerStreamRetriedBeforeItReceives(t *testing.T) {
	t.Parallel()
	h := &limitedHealth{reject: 1, pushback: "100"}
	c := serve(t, h, Options{Idempotent: always, Rand: noJitter})
	ws, err := c.Watch(context.Background(), &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ws.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	if got, want := resp.GetStatus(), healthpb.HealthCheckResponse_SERVING; got != want {
		t.Errorf("status %v, want %v", got, want)
	}
	if got, want := h.count(), 2; got != want {
		t.Errorf("the server saw %d streams, want %d", got, want)
	}
}

func TestPacingHoldsTheNextCall(t *testing.T) {
	t.Parallel()
	h := &limitedHealth{reject: 1, pushback: "800"}
	c := serve(t, h, Options{Idempotent: always, Pace: true, MaxRetries: -1, Rand: noJitter})
	if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("first call: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if g := h.gap(1); g < 800*time.Millisecond {
		t.Errorf("the next call went %v after the pushback of 800ms", g)
	}
}

func TestIdempotencyFromTheProto(t *testing.T) {
	t.Parallel()
	level := func(l descriptorpb.MethodOptions_IdempotencyLevel) *descriptorpb.MethodOptions {
		return &descriptorpb.MethodOptions{IdempotencyLevel: l.Enum()}
	}
	fd := &descriptorpb.FileDescriptorProto{
		Name:        proto.String("floodgate/grpcclient/test/idem.proto"),
		Package:     proto.String("floodgate.grpcclienttest"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("M")}},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Svc"),
			Method: []*descriptorpb.MethodDescriptorProto{
				{Name: proto.String("Get"), InputType: proto.String(".floodgate.grpcclienttest.M"), OutputType: proto.String(".floodgate.grpcclienttest.M"), Options: level(descriptorpb.MethodOptions_NO_SIDE_EFFECTS)},
				{Name: proto.String("Put"), InputType: proto.String(".floodgate.grpcclienttest.M"), OutputType: proto.String(".floodgate.grpcclienttest.M"), Options: level(descriptorpb.MethodOptions_IDEMPOTENT)},
				{Name: proto.String("Create"), InputType: proto.String(".floodgate.grpcclienttest.M"), OutputType: proto.String(".floodgate.grpcclienttest.M")},
			},
		}},
	}
	f, err := protodesc.NewFile(fd, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(f); err != nil {
		t.Fatal(err)
	}
	in := New(Options{})
	for method, want := range map[string]bool{
		"/floodgate.grpcclienttest.Svc/Get": true, "/floodgate.grpcclienttest.Svc/Put": true,
		"/floodgate.grpcclienttest.Svc/Create": false, "/floodgate.grpcclienttest.Svc/Nope": false,
		"/no.Such/Method": false, "garbage": false,
	} {
		if got := in.idempotent(method); got != want {
			t.Errorf("idempotent(%q) = %v, want %v", method, got, want)
		}
	}
}

func TestLimited(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]bool{
		status.Error(codes.ResourceExhausted, "quota"): true,
		status.Error(codes.Unavailable, "unexpected HTTP status code received from server: 429 (Too Many Requests); transport: received unexpected content-type \"application/problem+json\""): true,
		status.Error(codes.Unavailable, "connection refused"): false,
		status.Error(codes.Internal, "429"):                   false,
		context.Canceled:                                      false,
	} {
		if got := limited(err); got != want {
			t.Errorf("limited(%v) = %v, want %v", err, got, want)
		}
	}
}
