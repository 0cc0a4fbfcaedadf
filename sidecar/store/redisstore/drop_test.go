package redisstore_test

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// replyDropper is a TCP proxy in front of a real redis-server that lets a
// script reach the server and then cuts the connection instead of passing
// the script's reply back: the script ran, the client cannot know it. Only
// a fault a real server cannot produce on demand is faked here.
type replyDropper struct {
	ln      net.Listener
	target  string
	dropped atomic.Int64
	wg      sync.WaitGroup
}

func newReplyDropper(t *testing.T, target string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{ln: ln, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	return p
}

func (p *replyDropper) addr() string { return p.ln.Addr().String() }

func (p *replyDropper) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.pipe(c) })
	}
}

// pipe forwards one connection until a script has been sent and its reply
// starts to come back, then closes both sides.
func (p *replyDropper) pipe(c net.Conn) {
	defer func() { _ = c.Close() }()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer func() { _ = s.Close() }()
	var scriptSent atomic.Bool
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if low := bytes.ToLower(buf[:n]); bytes.Contains(low, []byte("\r\nfcall\r\n")) {
					scriptSent.Store(true)
				}
				if _, werr := s.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = s.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if scriptSent.Load() {
				p.dropped.Add(1)
				return // the reply is lost with the connection
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestDroppedConnectionIsNeverRetried: a connection that drops after the
// script ran, before its reply arrived, fails the decision with
// ErrUnavailable, and the script is not sent again, with a batch window or
// without. go-redis would resend on EOF with retries on, charging the key
// twice or more.
func TestDroppedConnectionIsNeverRetried(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	proxy := newReplyDropper(t, srv.Addr())
	now := time.Unix(1_700_000_000, 0)
	direct, err := redisstore.New(redisstore.Options{BatchWindow: redisstore.DefaultBatchWindow, Addrs: []string{srv.Addr()}, Single: true, Timeout: suiteTimeout, Now: at(now)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = direct.Close() }()
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: time.Hour}
	// Load the library on the server first: a "Function not found" reply
	// dropped by the proxy would prove nothing, the function not having
	// run.
	if _, _, err := direct.Take(t.Context(), limiter.Request{Key: uniqueKey(t), Limit: l, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	for _, window := range []time.Duration{redisstore.DefaultBatchWindow, 0} {
		s, err := redisstore.New(redisstore.Options{BatchWindow: window, Addrs: []string{proxy.addr()}, Single: true, Timeout: suiteTimeout, Now: at(now)})
		if err != nil {
			t.Fatal(err)
		}
		key := uniqueKey(t)
		before := proxy.dropped.Load()
		_, _, err = s.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: 3})
		_ = s.Close()
		if !errors.Is(err, limiter.ErrUnavailable) {
			t.Fatalf("window %v: take through a dropped connection: %v, want ErrUnavailable", window, err)
		}
		if got := proxy.dropped.Load() - before; got != 1 {
			t.Fatalf("window %v: %d replies dropped, want 1: the script was sent %d times", window, got, got)
		}
		d, _, err := direct.Take(t.Context(), limiter.Request{Key: key, Limit: l, Cost: 0})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := d.Remaining, int64(7); got != want {
			t.Errorf("window %v: remaining %d after one dropped take of 3, want %d: charged once, exactly", window, got, want)
		}
	}
}
