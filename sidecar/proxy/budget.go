package proxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HeadAllowance is the part of each request head that no budget counts:
// every connection holds a buffer of this size anyway (the lean core's
// read buffer, net/http's bufio.Reader), which the cap on connections
// bounds. Heads are charged for what they hold beyond it.
const HeadAllowance = 4 << 10

// titleUnavailable is the title of the 503 problems.
const titleUnavailable = "Service Unavailable"

// ProblemAtCapacity is the problem type of a connection refused because
// the sidecar holds as many connections, or as many bytes of request
// heads, as it is allowed.
const ProblemAtCapacity = "https://floodgate.dev/problems/at-capacity"

// AtCapacity answers 503 and closes the connection: the sidecar holds
// --max-connections connections, or a head would take it past
// --max-pending-head-bytes. Its Detail says which.
const AtCapacity Outcome = 32

// The details of AtCapacity answers.
const (
	DetailMaxConnections = "the sidecar holds as many client connections as it may (--max-connections); retry shortly"
	DetailHeadBudget     = "the sidecar holds as many bytes of request heads as it may (--max-pending-head-bytes); retry shortly"
)

// Refusal reasons, the values of the "reason" label of
// floodgate_sidecar_connections_refused_total.
const (
	ReasonMaxConnections = "max_connections"
	ReasonHeadBudget     = "head_budget"
)

// H2ConnWeight is what an HTTP/2 connection counts against the cap on
// connections: measured, about 34 KiB of memory when idle, against 10-16
// KiB for an HTTP/1.1 connection with a partial head.
const H2ConnWeight = 2

// The read errors of connections the budget refused. ErrHeadBudget has
// been answered 503; ErrH2AtCapacity, an HTTP/2 connection, is closed
// without an answer.
var (
	ErrHeadBudget   = errors.New("request head refused: the pending head budget is spent")
	ErrH2AtCapacity = errors.New("HTTP/2 connection refused: the sidecar holds as many connections as it may")
)

// BudgetOptions configure a Budget.
type BudgetOptions struct {
	// MaxConnections caps the client connections open at once, over both
	// fronts; 0 is no cap.
	MaxConnections int
	// MaxPendingHeadBytes caps the bytes of request heads held beyond
	// each head's HeadAllowance, over both fronts; 0 is no cap.
	MaxPendingHeadBytes int64
	// Registerer receives the budget's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Budget bounds what the client connections of both HTTP fronts hold:
// how many are open at once, and how many bytes of request heads they
// hold beyond each head's first HeadAllowance bytes, from the head's
// first byte until its request is answered (a head that is still
// arriving, or whose request is being served).
//
// The listener counts each accepted client connection once (AcquireConn,
// ReleaseConn), whichever front serves it; the lean core charges its
// read buffer as it grows (ReserveHead, ReleaseHead), and the net/http
// front the bytes it reads before a head is complete (HeadListener,
// ConnState, ConnContext, Handler). A connection that would go past a
// bound is answered 503 (AtCapacity) and closed; the others are served
// as usual.
//
// HTTP/2 costs more: its server runs two goroutines per connection and
// one per request, so an HTTP/2 connection counts as H2ConnWeight
// connections, and each HTTP/2 request in progress as one more (one past
// the cap is answered 503, on a connection that stays open).
//
// A Budget is safe for concurrent use, and nil bounds nothing. Its
// counts are atomic: a few atomic operations per connection and per
// grown head; a net/http connection counts its head under a mutex of
// its own.
type Budget struct {
	maxConns int64
	maxHead  int64
	conns    atomic.Int64
	head     atomic.Int64

	refusedConns, refusedHeads prometheus.Counter
	// refuseConn is the prebuilt answer at the cap on connections.
	refuseConn []byte

	// idle lists the HTTP/1.1 connections that wait for their next
	// request, oldest first: at the cap, a new connection takes the place
	// of one idle for at least IdleEvictAfter (see Idle).
	idleMu  sync.Mutex
	idle    idleList
	evicted prometheus.Counter
	now     func() time.Time
}

// IdleEvictAfter is how long a kept-alive connection must have waited for
// its next request before a new connection may take its place at the cap
// on connections.
const IdleEvictAfter = time.Second

// IdleConn is a client connection's place in the budget's list of idle
// connections. The zero value is not listed.
type IdleConn struct {
	prev, next *IdleConn
	listed     bool
	since      time.Time
	// close closes the connection if it still waits, and reports whether
	// it did; it must not block.
	close func() bool
}

// idleList is a list of IdleConns, oldest first.
type idleList struct{ head, tail *IdleConn }

func (l *idleList) push(c *IdleConn) {
	c.prev, c.next, c.listed = l.tail, nil, true
	if l.tail != nil {
		l.tail.next = c
	} else {
		l.head = c
	}
	l.tail = c
}

func (l *idleList) remove(c *IdleConn) {
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		l.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		l.tail = c.prev
	}
	c.prev, c.next, c.listed = nil, nil, false
}

// Idle lists c, a connection that has waited for its next request for
// waited already: at the cap on connections, once it has waited
// IdleEvictAfter, close may be called to make room for a new connection.
// Active takes it off the list.
func (b *Budget) Idle(c *IdleConn, waited time.Duration, close func() bool) {
	if b == nil || b.maxConns == 0 {
		return
	}
	since := b.now().Add(-waited)
	b.idleMu.Lock()
	if c.listed {
		b.idle.remove(c)
	}
	c.since, c.close = since, close
	b.idle.push(c)
	b.idleMu.Unlock()
}

// Active takes c off the list of idle connections: it has a request in
// progress, or it closed.
func (b *Budget) Active(c *IdleConn) {
	if b == nil || b.maxConns == 0 {
		return
	}
	b.idleMu.Lock()
	if c.listed {
		b.idle.remove(c)
	}
	b.idleMu.Unlock()
}

// evictIdle closes the oldest idle connection that has waited at least
// IdleEvictAfter, and reports whether there was one. The connection
// leaves the count when it has closed, a moment later: until then the
// count may be past the cap by the connections being evicted.
func (b *Budget) evictIdle() bool {
	cutoff := b.now().Add(-IdleEvictAfter)
	for {
		b.idleMu.Lock()
		c := b.idle.head
		if c == nil || c.since.After(cutoff) {
			b.idleMu.Unlock()
			return false
		}
		b.idle.remove(c)
		close := c.close
		b.idleMu.Unlock()
		if close() {
			b.evicted.Inc()
			return true
		}
		// It had started a request: try the next.
	}
}

// NewBudget returns a Budget, with its metrics registered on
// o.Registerer:
//
//	floodgate_sidecar_connections_open
//	floodgate_sidecar_connections_refused_total{reason}
//	floodgate_sidecar_pending_head_bytes
func NewBudget(o BudgetOptions) *Budget {
	b := &Budget{maxConns: int64(max(o.MaxConnections, 0)), maxHead: max(o.MaxPendingHeadBytes, 0), now: time.Now}
	b.evicted = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "floodgate_sidecar", Name: "connections_evicted_total",
		Help: "Idle keep-alive client connections closed to make room for a new connection at --max-connections: each had waited at least a second for its next request.",
	})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "floodgate_sidecar", Name: "connections_refused_total",
		Help: "Client connections (and HTTP/2 requests) refused by reason: max_connections (at --max-connections) or head_budget (a request head would go past --max-pending-head-bytes).",
	}, []string{"reason"})
	b.refusedConns = refused.WithLabelValues(ReasonMaxConnections)
	b.refusedHeads = refused.WithLabelValues(ReasonHeadBudget)
	if o.Registerer != nil {
		o.Registerer.MustRegister(refused, b.evicted,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "floodgate_sidecar", Name: "connections_open",
				Help: "Client connections open on the proxy listener, over both HTTP fronts, as --max-connections counts them: an HTTP/2 connection twice, and each HTTP/2 request in progress once more.",
			}, func() float64 { return float64(b.conns.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "floodgate_sidecar", Name: "pending_head_bytes",
				Help: "Bytes of request heads held beyond each head's first 4 KiB, counted against --max-pending-head-bytes.",
			}, func() float64 { return float64(b.head.Load()) }))
	}
	d := Decision{Outcome: AtCapacity, Detail: DetailMaxConnections}
	b.refuseConn = AppendProblem(nil, &d, nil, true)
	return b
}

// AcquireConn counts a new client connection; false, and nothing
// counted, when the sidecar holds MaxConnections already.
func (b *Budget) AcquireConn() bool {
	if b == nil {
		return true
	}
	if n := b.conns.Add(1); b.maxConns > 0 && n > b.maxConns {
		if b.evictIdle() {
			return true
		}
		b.conns.Add(-1)
		return false
	}
	return true
}

// ReleaseConn counts a client connection closed; once per AcquireConn
// that returned true.
func (b *Budget) ReleaseConn() {
	if b != nil {
		b.conns.Add(-1)
	}
}

// RefuseConn answers a connection that AcquireConn refused, 503 with
// Retry-After: 1, without reading its request, and closes it. The answer
// is one small write on a fresh connection, which does not block.
func (b *Budget) RefuseConn(nc net.Conn) {
	b.refusedConns.Inc()
	_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = nc.Write(b.refuseConn)
	_ = nc.Close()
}

// HeadBudget reports whether there is a head budget.
func (b *Budget) HeadBudget() bool { return b != nil && b.maxHead > 0 }

// ReserveHead charges n more bytes of request heads; false, and nothing
// charged, when they do not fit in the budget. The caller then answers
// the connection with RefusedHead and closes it.
func (b *Budget) ReserveHead(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	if v := b.head.Add(n); b.maxHead > 0 && v > b.maxHead {
		b.head.Add(-n)
		return false
	}
	return true
}

// ReleaseHead gives back n bytes that ReserveHead charged.
func (b *Budget) ReleaseHead(n int64) {
	if b != nil && n > 0 {
		b.head.Add(-n)
	}
}

// RefusedHead counts a connection refused for the head budget.
func (b *Budget) RefusedHead() {
	if b != nil {
		b.refusedHeads.Inc()
	}
}

// OpenConns returns the client connections open, as the cap counts them.
func (b *Budget) OpenConns() int64 {
	if b == nil {
		return 0
	}
	return b.conns.Load()
}

// PendingHeadBytes returns the bytes charged to the head budget.
func (b *Budget) PendingHeadBytes() int64 {
	if b == nil {
		return 0
	}
	return b.head.Load()
}

// The net/http front. A net/http server reads a head through its own
// bufio.Reader, so the budget counts the bytes its connection reads:
// from the first byte of a head (a new connection, or one that went back
// to idle) until the handler runs, when the head is complete; what the
// head was charged is given back when the handler returns. Bytes read
// meanwhile are the body's, and are not counted. The bytes of an HTTP/2
// connection (the h2c preface) are not: net/http's HTTP/2 server bounds
// its own header lists; the connection is weighed instead.

// HeadListener returns ln with its connections' head bytes counted, and
// its HTTP/2 connections weighed (H2ConnWeight), for the net/http server
// that serves it, which must use ConnState, ConnContext and Handler too.
// The connections must have been counted once already (AcquireConn).
func (b *Budget) HeadListener(ln net.Listener) net.Listener {
	if b == nil {
		return ln
	}
	return headListener{Listener: ln, b: b}
}

type headListener struct {
	net.Listener
	b *Budget
}

// Accept implements net.Listener.
func (l headListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &headConn{Conn: c, b: l.b}, nil
}

// The phases of a headConn.
const (
	phaseHead  = iota // reading a head: bytes are charged
	phaseBody         // the handler runs: bytes are the body's
	phaseAfter        // the handler returned; waiting for net/http to go idle
	phaseOff          // HTTP/2, hijacked or closed: nothing is counted
)

// h2Preface starts an HTTP/2 connection without TLS; net/http reads no
// more of it at first.
var h2Preface = []byte("PRI * HTTP/2.0")

// headConn is a connection of the net/http front whose head bytes are
// counted. Read runs on the connection's goroutine; the hooks may run on
// others, hence the mutex.
type headConn struct {
	net.Conn
	b *Budget

	mu      sync.Mutex
	phase   int
	read    int64 // bytes read in this head
	charged int64 // bytes of them charged to the budget
	h2      bool  // an HTTP/2 connection, weighed
	began   bool  // bytes of this head have arrived

	idle IdleConn // its place among the idle connections
}

func (c *headConn) isH2() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.h2
}

// closeIdle closes the connection to make room for a new one, unless it
// has started reading a request: net/http reports StateActive only once a
// request's first bytes are read.
func (c *headConn) closeIdle() bool {
	c.mu.Lock()
	started := c.began || c.h2
	c.mu.Unlock()
	if started {
		return false
	}
	_ = c.Conn.Close()
	return true
}

// headConnKey holds a request's *headConn in its context.
type headConnKey struct{}

// Read implements net.Conn: it charges what a head reads beyond its
// allowance, and fails a read that would go past the budget, having
// answered the connection 503.
func (c *headConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	refused := c.count(p[:n])
	if refused == nil {
		return n, err
	}
	if errors.Is(refused, ErrHeadBudget) {
		c.b.RefusedHead()
		d := Decision{Outcome: AtCapacity, Detail: DetailHeadBudget}
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(AppendProblem(nil, &d, nil, true))
	}
	// A read error of this kind makes net/http close the connection
	// without answering it again.
	return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: refused}
}

// count charges the bytes p just read, or weighs the connection when
// they start HTTP/2: nil, or ErrHeadBudget or ErrH2AtCapacity when they
// do not fit.
func (c *headConn) count(p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phase != phaseHead {
		return nil
	}
	if len(p) > 0 {
		c.began = true
	}
	if c.read == 0 && bytes.HasPrefix(p, h2Preface) {
		c.phase = phaseOff
		for range H2ConnWeight - 1 {
			if !c.b.AcquireConn() {
				c.b.refusedConns.Inc()
				return ErrH2AtCapacity
			}
			c.h2 = true
		}
		return nil
	}
	if !c.b.HeadBudget() {
		return nil
	}
	c.read += int64(len(p))
	want := c.read - HeadAllowance
	if want <= c.charged {
		return nil
	}
	if !c.b.ReserveHead(want - c.charged) {
		return ErrHeadBudget
	}
	c.charged = want
	return nil
}

// set moves the connection to phase, giving back its charge unless it
// goes to phaseBody (the head is complete, and held until the handler
// returns).
func (c *headConn) set(phase int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.phase == phaseOff {
		return
	}
	c.phase = phase
	if phase == phaseBody {
		return
	}
	c.b.ReleaseHead(c.charged)
	c.charged, c.read, c.began = 0, 0, false
}

// CloseWrite half-closes the connection when the one under it can, as
// net/http does before closing after an error answer.
func (c *headConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Close implements net.Conn.
func (c *headConn) Close() error {
	c.set(phaseOff)
	c.mu.Lock()
	if c.h2 {
		c.h2 = false
		for range H2ConnWeight - 1 {
			c.b.ReleaseConn()
		}
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

// ConnState is the net/http server's ConnState hook: a connection that
// goes idle starts a new head; a hijacked or closed one gives back its
// charge.
func (b *Budget) ConnState(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*headConn)
	if !ok {
		return
	}
	switch st {
	case http.StateNew:
		// Silent so far: it may make room once it has waited, as an
		// idle one does (the lean core's fresh connections park too).
		b.Idle(&c.idle, 0, c.closeIdle)
	case http.StateIdle:
		c.set(phaseHead)
		if !c.isH2() {
			b.Idle(&c.idle, 0, c.closeIdle)
		}
	case http.StateActive:
		b.Active(&c.idle)
	case http.StateHijacked, http.StateClosed:
		c.set(phaseOff)
		b.Active(&c.idle)
	}
}

// ConnContext is the net/http server's ConnContext hook: it keeps the
// connection in its requests' context, for Handler.
func (b *Budget) ConnContext(ctx context.Context, nc net.Conn) context.Context {
	if c, ok := nc.(*headConn); ok {
		return context.WithValue(ctx, headConnKey{}, c)
	}
	return ctx
}

// Handler returns h with its requests' heads marked complete when it
// starts, and their charge given back when it returns. An HTTP/2 request
// counts as a connection while it is in progress; one past the cap is
// answered 503 (a gRPC call, UNAVAILABLE with a retry pushback).
func (b *Budget) Handler(h http.Handler) http.Handler {
	if b == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor >= 2 {
			if !b.AcquireConn() {
				b.refusedConns.Inc()
				ps := (&Decision{Outcome: AtCapacity, Detail: DetailMaxConnections}).problem()
				problem(w, r, nil, &ps)
				return
			}
			defer b.ReleaseConn()
			h.ServeHTTP(w, r)
			return
		}
		c, ok := r.Context().Value(headConnKey{}).(*headConn)
		if !ok {
			h.ServeHTTP(w, r)
			return
		}
		c.set(phaseBody)
		defer c.set(phaseAfter)
		h.ServeHTTP(w, r)
	})
}
