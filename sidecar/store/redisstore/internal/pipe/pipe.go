// Package pipe is the counter store's connection to one Redis node: one
// TCP (or TLS) connection on which the calls of many callers are pipelined.
//
// Callers queue their calls (Enqueue) and wait; one writer goroutine sends
// what has queued in one write, and one reader goroutine reads the answers,
// which come in the order of the commands, and hands each to the Handler.
// No call is ever written twice on a connection. A call unanswered at its
// deadline fails (it may have run; its answer, should it come, is dropped),
// and a connection on which every written call has timed out is closed. A
// connection that fails (a write or read error) fails every call it has
// written and not yet answered, likewise, and those it has not written as
// not sent.
//
// The package knows the Redis handshake (AUTH, CLIENT SETNAME) and ASKING,
// and nothing of what the calls mean: the Handler decides what an answer
// is worth.
package pipe

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/resp"
)

// maxInflight is how many pipelined writes a connection has unanswered
// before new calls start to wait (at most the batch window) for one to be
// answered. With one, calls gather while the last write is out (group
// commit): measured on loopback with 64 callers over 3 masters, that makes
// writes of about 7 decisions instead of 5 with two out, and costs less CPU
// per decision on both sides.
const maxInflight = 1

// Call is one command on a connection. Its methods are called on the
// connection's goroutines and must not block; the values they report must
// not change while the call is queued or written.
type Call interface {
	// Deadline is when the caller stops waiting: a call not written by
	// then is not written, one not answered by then fails.
	Deadline() time.Time
	// Gone reports whether the caller has stopped waiting before the
	// deadline (its context ended).
	Gone() bool
	// Prelude reports how many commands AppendCommand writes before the
	// call's own (ASKING after an ASK redirect, say): their answers are
	// read and dropped, and the last command's answer is the call's.
	Prelude() int
	// AppendCommand appends the command in RESP to b, after its prelude.
	AppendCommand(b []byte) []byte
}

// Failure says why a call got no answer.
type Failure uint8

// Failures.
const (
	// Unsent: the call's caller went, or its deadline passed, before it
	// was written. The node never saw it.
	Unsent Failure = iota
	// Dropped: the connection failed before the call was written. The
	// node never saw it.
	Dropped
	// Unanswered: the call was written, and the connection failed or the
	// deadline passed before its answer. It may have run.
	Unanswered
)

// Handler receives the outcome of every call: exactly one Answered or
// Failed each. Its methods run on the connection's goroutines, or on the
// goroutine that closes it, and must not block.
type Handler interface {
	// Answered gets the reply to the call's command: a script's four
	// integers in vals with res nil, any other reply in res (resp.Nil for
	// a nil), or an error reply (a resp.Error) in err.
	Answered(c Call, vals [4]int64, res any, err error)
	// Failed reports that the call got no answer, why, and the cause.
	Failed(c Call, f Failure, err error)
	// Closed reports that conn has failed and takes no more calls. It is
	// called once, before the Failed of the calls conn held.
	Closed(conn *Conn)
}

// Stats count a node's pipelined writes. They outlive the connections
// that add to them.
type Stats struct {
	// Writes is how many pipelined writes went out.
	Writes atomic.Int64
	// Calls is how many calls they carried.
	Calls atomic.Int64
}

// Config configures a connection.
type Config struct {
	// Addr is the node, host:port.
	Addr string
	// TLS, when set, is used for the connection (cloned).
	TLS *tls.Config
	// Credentials returns the AUTH user and password; no AUTH when the
	// password is empty. Called once per connection.
	Credentials func() (username, password string)
	// ClientName, when set, names the connection (CLIENT SETNAME). A node
	// that answers the name with an error is used all the same.
	ClientName string
	// DialTimeout bounds connecting and the handshake.
	DialTimeout time.Duration
	// WriteTimeout bounds each write.
	WriteTimeout time.Duration
	// BatchWindow is the most a call waits for others while a write is
	// out; 0 writes at once. MaxBatch is the most calls per write.
	BatchWindow time.Duration
	MaxBatch    int
	// Handler receives the outcomes. Required.
	Handler Handler
	// Stats, when set, counts the writes.
	Stats *Stats
}

// Conn is one pipelined connection to a node. Its methods are safe for
// concurrent use.
type Conn struct {
	cfg Config
	nc  net.Conn
	r   *bufio.Reader

	mu       sync.Mutex
	queue    []Call  // waiting to be written
	spare    []Call  // the last queue, reused
	pending  []entry // written (or being written), in command order
	head     int     // pending[head:] are unanswered
	inflight int     // writes with unanswered commands
	err      error   // set once, when the connection fails

	wake     chan struct{} // capacity 1: calls queued
	answered chan struct{} // capacity 1: a write was wholly answered
	stop     chan struct{} // closed on failure
}

// entry is one command awaiting its answer: a call's, or one of its
// prelude's.
type entry struct {
	c       Call
	prelude bool // a command of c's prelude, before c's own
	last    bool // the last command of its write
	dead    bool // c failed at its deadline; never look at it again
}

// ErrNoAnswer is the cause of an Unanswered failure at the call's
// deadline (the node may be stalled), as against a lost connection. It
// wraps context.DeadlineExceeded.
var ErrNoAnswer = fmt.Errorf("no answer by the call deadline (the command may have run): %w", context.DeadlineExceeded)

// Causes of an Unsent failure.
var (
	errNotSentInTime = fmt.Errorf("not sent by the call deadline: %w", context.DeadlineExceeded)
	errCallerGone    = errors.New("not sent: the caller stopped waiting")
)

// Dial connects to the node, authenticates, and starts the connection's
// reader and writer.
func Dial(cfg Config) (*Conn, error) {
	if cfg.Handler == nil {
		return nil, errors.New("pipe: nil handler")
	}
	cfg.MaxBatch = max(1, cfg.MaxBatch)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.DialTimeout)
	defer cancel()
	d := &net.Dialer{KeepAlive: 30 * time.Second}
	var nc net.Conn
	var err error
	if cfg.TLS != nil {
		td := &tls.Dialer{NetDialer: d, Config: cfg.TLS.Clone()}
		nc, err = td.DialContext(ctx, "tcp", cfg.Addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", cfg.Addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	if err := handshake(ctx, nc, cfg); err != nil {
		_ = nc.Close()
		return nil, err
	}
	c := &Conn{
		cfg:      cfg,
		nc:       nc,
		wake:     make(chan struct{}, 1),
		answered: make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	c.r = bufio.NewReaderSize(deadlineReader{c}, 32<<10)
	go c.readLoop()
	go c.writeLoop()
	return c, nil
}

// handshake authenticates on nc (or, without a password, checks with PING
// that the node wants none) and names the connection, in one round
// trip, within ctx's deadline.
func handshake(ctx context.Context, nc net.Conn, cfg Config) error {
	var user, password string
	if cfg.Credentials != nil {
		user, password = cfg.Credentials()
	}
	var b []byte
	switch {
	case password == "":
		// PING stands in for AUTH: a node that wants a password answers
		// NOAUTH, and the connection is refused here instead of failing
		// every script (a sidecar can start before the kubelet fills its
		// optional password volume, and dial again once it has).
		b = append(b, resp.Command("PING")...)
	case user != "":
		b = append(b, resp.Command("AUTH", user, password)...)
	default:
		b = append(b, resp.Command("AUTH", password)...)
	}
	auth := password != ""
	if cfg.ClientName != "" {
		b = append(b, resp.Command("CLIENT", "SETNAME", cfg.ClientName)...)
	}
	dl, _ := ctx.Deadline()
	_ = nc.SetDeadline(dl)
	if _, err := nc.Write(b); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	// A reader of its own: the connection's reader starts after the
	// handshake, which must leave nothing buffered here.
	r := bufio.NewReader(nc)
	if auth {
		if err := expectOK(r, "AUTH", false); err != nil {
			return fmt.Errorf("auth: %w", err)
		}
	} else if err := expectPong(r); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if cfg.ClientName != "" {
		if err := expectOK(r, "CLIENT SETNAME", true); err != nil {
			return fmt.Errorf("client setname: %w", err)
		}
	}
	if r.Buffered() > 0 {
		return fmt.Errorf("%w: data after the handshake replies", resp.ErrProtocol)
	}
	_ = nc.SetDeadline(time.Time{})
	return nil
}

// expectPong reads the reply to PING.
func expectPong(r *bufio.Reader) error {
	v, err := resp.ReadValue(r)
	if err != nil {
		return err
	}
	if re, ok := v.(resp.Error); ok {
		return re
	}
	if v != "PONG" {
		return fmt.Errorf("%w: PING answered %v", resp.ErrProtocol, v)
	}
	return nil
}

// expectOK reads a reply that must be OK, or an error reply when
// errorOK.
func expectOK(r *bufio.Reader, cmd string, errorOK bool) error {
	v, err := resp.ReadValue(r)
	if err != nil {
		return err
	}
	if re, ok := v.(resp.Error); ok {
		if errorOK {
			return nil
		}
		return re
	}
	if v != "OK" {
		return fmt.Errorf("%w: %s answered %v", resp.ErrProtocol, cmd, v)
	}
	return nil
}

// Enqueue queues call to be written, unless the connection has failed; then
// it reports false and call is not the connection's.
func (c *Conn) Enqueue(call Call) bool {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	c.queue = append(c.queue, call)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return true
}

// Close closes the connection with err as the cause, and fails every call
// on it: those written and unanswered as Unanswered, those queued as
// Dropped. Closing a failed connection does nothing.
func (c *Conn) Close(err error) {
	c.mu.Lock()
	c.failLocked(err)
}

// failLocked is Close with c.mu held; it unlocks it.
func (c *Conn) failLocked(err error) {
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	queued := c.queue
	pending := c.pending[c.head:]
	c.queue, c.pending, c.head = nil, nil, 0
	c.mu.Unlock()
	close(c.stop)
	_ = c.nc.Close()
	h := c.cfg.Handler
	h.Closed(c)
	for _, e := range pending {
		if e.prelude || e.dead {
			continue // its call follows, or is finished
		}
		h.Failed(e.c, Unanswered, fmt.Errorf("connection lost before the answer (the command may have run): %w", err))
	}
	for _, call := range queued {
		h.Failed(call, Dropped, fmt.Errorf("not sent: connection lost: %w", err))
	}
}

// writeLoop sends what has queued, one write per batch. With a batch
// window, after a wake-up it yields once, so that the callers the
// scheduler has ready queue theirs first; then, while maxInflight writes
// are unanswered and the batch is not full, it waits for an answer, at
// most the window (group commit). Without one it writes at once.
func (c *Conn) writeLoop() {
	window, maxBatch := c.cfg.BatchWindow, c.cfg.MaxBatch
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var buf []byte
	for {
		select {
		case <-c.wake:
		case <-c.stop:
			return
		}
		for {
			if window > 0 {
				runtime.Gosched()
			}
			c.mu.Lock()
			if window > 0 && len(c.queue) < maxBatch && c.inflight >= maxInflight && c.err == nil {
				c.mu.Unlock()
				if !c.await(timer, window, maxBatch) {
					return
				}
				c.mu.Lock()
			}
			if c.err != nil {
				c.mu.Unlock()
				return
			}
			batch, gone, rest := c.take(maxBatch)
			c.mu.Unlock()

			for _, call := range gone {
				err := errNotSentInTime
				if call.Gone() {
					err = errCallerGone
				}
				c.cfg.Handler.Failed(call, Unsent, err)
			}
			buf = buf[:0]
			for _, call := range batch {
				if call == nil {
					continue
				}
				buf = call.AppendCommand(buf)
			}
			if rest == 0 {
				clear(batch) // batch is the spare queue now: hold no finished call
			}
			if len(buf) > 0 {
				if st := c.cfg.Stats; st != nil {
					st.Writes.Add(1)
					st.Calls.Add(int64(len(batch) - len(gone)))
				}
				_ = c.nc.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
				if _, err := c.nc.Write(buf); err != nil {
					c.Close(fmt.Errorf("write: %w", err))
					return
				}
				if cap(buf) > 1<<20 {
					buf = nil
				}
			}
			if rest == 0 {
				break
			}
		}
	}
}

// await waits, with the lock not held, until fewer than maxInflight writes
// are unanswered or a batch is full, at most window. It reports false when
// the connection has failed.
func (c *Conn) await(timer *time.Timer, window time.Duration, maxBatch int) bool {
	timer.Reset(window)
	defer timer.Stop()
	for {
		select {
		case <-c.answered:
		case <-c.wake:
		case <-timer.C:
			return true
		case <-c.stop:
			return false
		}
		c.mu.Lock()
		ready := len(c.queue) >= maxBatch || c.inflight < maxInflight
		c.mu.Unlock()
		if ready {
			return true
		}
	}
}

// take moves up to maxBatch queued calls to the pending commands and
// returns them (nil in place of those whose callers have gone, which are
// returned in gone, to be failed without being sent), and how many calls
// remain queued. c.mu is held.
func (c *Conn) take(maxBatch int) (batch, gone []Call, rest int) {
	batch = c.queue
	if len(batch) > maxBatch {
		batch = batch[:maxBatch]
	}
	idle := c.idle()
	now := time.Now()
	n := 0
	for i, call := range batch {
		if call.Gone() || !now.Before(call.Deadline()) {
			gone = append(gone, call)
			batch[i] = nil
			continue
		}
		for range call.Prelude() {
			c.pending = append(c.pending, entry{c: call, prelude: true})
		}
		c.pending = append(c.pending, entry{c: call})
		n++
	}
	if n > 0 {
		c.pending[len(c.pending)-1].last = true
		c.inflight++
		if idle {
			// The reader may be waiting with no deadline.
			_ = c.nc.SetReadDeadline(c.nextDeadline())
		}
	}
	rest = len(c.queue) - len(batch)
	if rest == 0 {
		c.queue, c.spare = c.spare[:0], c.queue
	} else {
		// Rare: more than a batch queued. Keep the rest in order.
		c.queue = append(c.spare[:0], c.queue[len(batch):]...)
		c.spare = nil
	}
	return batch, gone, rest
}

// readLoop reads the answers in command order and hands them out.
func (c *Conn) readLoop() {
	for {
		// Wait for an answer to begin; a deadline passing here leaves the
		// stream in step, so the connection may go on.
		if _, err := c.r.Peek(1); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if c.expire() {
					continue
				}
				return // expire closed the connection
			}
			c.Close(fmt.Errorf("read: %w", err))
			return
		}
		vals, res, err := resp.ReadScriptReply(c.r)
		var re resp.Error
		if err != nil && !errors.As(err, &re) {
			c.Close(fmt.Errorf("read: %w", err))
			return
		}
		c.mu.Lock()
		if c.head == len(c.pending) {
			c.mu.Unlock()
			c.Close(fmt.Errorf("%w: an answer to no command", resp.ErrProtocol))
			return
		}
		e := c.pending[c.head]
		c.pending[c.head] = entry{}
		c.head++
		if c.head == len(c.pending) {
			c.pending, c.head = c.pending[:0], 0
		}
		if e.last {
			c.inflight--
		}
		c.mu.Unlock()
		if e.last {
			select {
			case c.answered <- struct{}{}:
			default:
			}
		}
		if e.dead || e.prelude {
			// A dead call failed at its deadline: its answer comes too
			// late. After a prelude command, the call's own answer
			// follows and decides (when ASKING failed, it is a redirect
			// again; when FUNCTION LOAD failed, the function is still
			// missing).
			continue
		}
		c.cfg.Handler.Answered(e.c, vals, res, err)
	}
}

// expire fails the calls whose deadline has passed, unanswered. It reports
// false, having closed the connection, when every written call has now
// timed out: the node has stopped answering.
func (c *Conn) expire() bool {
	now := time.Now()
	var gone []Call
	alive := false
	c.mu.Lock()
	for i := c.head; i < len(c.pending); i++ {
		e := &c.pending[i]
		if e.dead {
			continue
		}
		if now.Before(e.c.Deadline()) {
			alive = true
			continue
		}
		e.dead = true
		if !e.prelude {
			gone = append(gone, e.c)
		}
	}
	for _, call := range gone {
		c.cfg.Handler.Failed(call, Unanswered, ErrNoAnswer)
	}
	if !alive {
		// Close it before anything more is written to it: a call written
		// now would fail at once, and might run later.
		c.failLocked(errors.New("no answer by the call deadline of any call written"))
		return false
	}
	c.mu.Unlock()
	return true
}

// idle reports whether no answer is due. c.mu is held.
func (c *Conn) idle() bool { return c.nextDeadline().IsZero() }

// nextDeadline returns the deadline of the oldest unanswered call still
// waiting, or zero when there is none. Calls are written in about the
// order of their deadlines; one that is out of order (a caller's own
// shorter deadline) fails a little late, its caller having returned at its
// own deadline anyway. c.mu is held.
func (c *Conn) nextDeadline() time.Time {
	for i := c.head; i < len(c.pending); i++ {
		if e := c.pending[i]; !e.dead {
			return e.c.Deadline()
		}
	}
	return time.Time{}
}

// deadlineReader reads from the connection with a read deadline while
// answers are due: the deadline of the oldest call still waiting. With none
// due it waits without one (the writer sets it when it writes to an idle
// connection).
type deadlineReader struct{ c *Conn }

func (d deadlineReader) Read(p []byte) (int, error) {
	c := d.c
	// Under the lock, so that a writer making the connection busy sets
	// its deadline after this one, never before.
	c.mu.Lock()
	_ = c.nc.SetReadDeadline(c.nextDeadline())
	c.mu.Unlock()
	return c.nc.Read(p)
}
