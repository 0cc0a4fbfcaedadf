// Package lean is floodgate-sidecar's HTTP/1.1 proxy core for the common
// case: keep-alive HTTP/1.1 from the client to the application. Each
// client connection is served by one goroutine that reads requests into a
// reused buffer, parses each head in place (package h1), asks the proxy
// for a decision and either answers from a prebuilt response with one
// write or forwards the request over an upstream connection it keeps for
// the client connection: the head in one write (writev when body bytes
// follow it), bodies spliced between the sockets with splice(2) where both
// ends are TCP, and the response relayed the same way.
//
// Anything else goes to net/http, per connection: a request with Upgrade
// (WebSocket, h2c upgrade), the HTTP/2 preface (h2c, gRPC), HTTP/1.0, a
// request-target that is not a path (CONNECT, OPTIONS *, absolute form)
// and an Expect other than 100-continue hand the connection, with the
// bytes already read, to the net/http server behind Handoff(). The handoff
// happens at a request boundary, before anything was answered, so the
// net/http server sees the connection as if it had accepted it.
//
// What a connection holds is bounded: its read buffer grows for a large
// head only as far as the head budget (Options.Budget) allows, and a
// connection that has waited a second for its next request parks, giving
// back everything it grew and its upstream connection, so that idle
// keep-alive connections cost a 4 KiB buffer and about 2 KiB of state.
package lean

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/proxy"
)

// Options configure a Server.
type Options struct {
	// Upstream is the application's host:port (plain HTTP/1.1).
	Upstream string
	// Proxy returns the proxy in force, or nil while no config is loaded
	// (requests are then answered 503).
	Proxy func() *proxy.Proxy
	// MaxHeaderBytes bounds a request head, request line and blank line
	// included; a larger head is answered 431.
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds the time from a head's first byte to its
	// last; a slower client is answered 408 and disconnected.
	ReadHeaderTimeout time.Duration
	// BodyTimeout, when positive, is how long each proxy.BodyWindow
	// bytes of a request body, and its last part, may take to arrive.
	BodyTimeout time.Duration
	// BodyMinRate, when positive, is the slowest a request body may
	// arrive, in bytes per second over each window (proxy.NewBodyPace).
	BodyMinRate int64
	// Budget, when not nil, is charged for what each connection's head
	// holds beyond proxy.HeadAllowance; a head that does not fit is
	// answered 503 and its connection closed. The listener Serve is
	// given counts the connections themselves against it.
	Budget *proxy.Budget
	// AllowUnderscoreHeaders forwards, and lets the rules read, header
	// fields whose names contain an underscore; by default they are
	// dropped (proxy.UnderscoreName).
	AllowUnderscoreHeaders bool
	// IdleTimeout bounds the wait for the next request on a kept-alive
	// connection.
	IdleTimeout time.Duration
	// MaxIdleUpstream bounds the upstream connections kept idle between
	// client connections.
	MaxIdleUpstream int
	// Log receives connection-level problems at debug level.
	Log *slog.Logger
}

// Server serves client connections with the lean core.
type Server struct {
	o       Options
	pace    proxy.BodyPace // zero Time: bodies are not timed
	handoff *handoffListener
	dialer  net.Dialer

	closing atomic.Bool
	mu      sync.Mutex
	conns   map[*conn]struct{}
	ln      net.Listener
	wg      sync.WaitGroup

	poolMu sync.Mutex
	pool   []*upConn

	date     atomic.Pointer[[]byte]
	second   atomic.Int64 // the Unix second of date: a clock read once a second
	stopTick chan struct{}
}

// New returns a Server.
func New(o Options) *Server {
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = 64 << 10
	}
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = 10 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 2 * time.Minute
	}
	if o.MaxIdleUpstream <= 0 {
		o.MaxIdleUpstream = 1024
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &Server{o: o, conns: map[*conn]struct{}{}, stopTick: make(chan struct{}),
		dialer: net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}}
	if o.BodyTimeout > 0 {
		s.pace = proxy.NewBodyPace(o.BodyTimeout, o.BodyMinRate)
	}
	s.handoff = newHandoffListener()
	s.tick(time.Now())
	return s
}

// Handoff returns the listener on which the connections the lean core
// does not serve arrive; serve it with the net/http server.
func (s *Server) Handoff() net.Listener { return s.handoff }

// tick refreshes the Date value.
func (s *Server) tick(now time.Time) {
	b := now.UTC().AppendFormat(make([]byte, 0, 29), http.TimeFormat)
	s.date.Store(&b)
	s.second.Store(now.Unix())
}

// Serve accepts connections on ln until Shutdown or an accept error.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	if s.closing.Load() {
		_ = ln.Close()
		return http.ErrServerClosed
	}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case now := <-t.C:
				s.tick(now)
			case <-s.stopTick:
				return
			}
		}
	}()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		c := newConn(s, nc)
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			_ = nc.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// Shutdown stops accepting, closes idle connections, lets connections in
// the middle of a request finish it (their answer says Connection: close)
// and waits for them until ctx ends, when it closes the rest. The handoff
// listener is closed too; shut the net/http server down separately.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.closing.Swap(true) {
		return nil
	}
	close(s.stopTick)
	s.mu.Lock()
	if s.ln != nil {
		_ = s.ln.Close()
	}
	s.mu.Unlock()
	_ = s.handoff.Close()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		for c := range s.conns {
			c.closeIfIdle()
		}
		s.mu.Unlock()
		select {
		case <-done:
			s.closePool()
			return nil
		case <-ctx.Done():
			s.mu.Lock()
			for c := range s.conns {
				_ = c.nc.Close()
			}
			s.mu.Unlock()
			<-done
			s.closePool()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// getUp returns an idle upstream connection, or nil.
func (s *Server) getUp() *upConn {
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	if n := len(s.pool); n > 0 {
		u := s.pool[n-1]
		s.pool[n-1] = nil
		s.pool = s.pool[:n-1]
		return u
	}
	return nil
}

// putUp keeps an upstream connection for another client connection,
// with its read buffer back at its first size.
func (s *Server) putUp(u *upConn) {
	if len(u.buf) > bufSize {
		u.buf, u.r, u.w = make([]byte, bufSize), 0, 0
	}
	s.poolMu.Lock()
	if len(s.pool) < s.o.MaxIdleUpstream && !s.closing.Load() {
		s.pool = append(s.pool, u)
		u = nil
	}
	s.poolMu.Unlock()
	if u != nil {
		_ = u.nc.Close()
	}
}

func (s *Server) closePool() {
	s.poolMu.Lock()
	pool := s.pool
	s.pool = nil
	s.poolMu.Unlock()
	for _, u := range pool {
		_ = u.nc.Close()
	}
}

// handoffListener delivers connections to the net/http server.
type handoffListener struct {
	ch     chan net.Conn
	done   chan struct{}
	once   sync.Once
	addrMu sync.Mutex
	addr   net.Addr
}

func newHandoffListener() *handoffListener {
	return &handoffListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

// Accept implements net.Listener.
func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *handoffListener) Addr() net.Addr {
	l.addrMu.Lock()
	defer l.addrMu.Unlock()
	if l.addr == nil {
		return &net.TCPAddr{}
	}
	return l.addr
}

// give hands c to the net/http server; false when the listener is closed.
func (l *handoffListener) give(c net.Conn) bool {
	l.addrMu.Lock()
	if l.addr == nil {
		l.addr = c.LocalAddr()
	}
	l.addrMu.Unlock()
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

// prefixConn is a connection whose first bytes were already read.
type prefixConn struct {
	net.Conn
	prefix []byte
}

// Read implements net.Conn.
func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
