package redisstore

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
	"time"
)

// maxInflight is how many pipelined writes a connection has unanswered
// before new decisions start to wait (at most the batch window) for one to
// be answered. With one, decisions gather while the last write is out
// (group commit): measured on loopback with 64 callers over 3 masters,
// that makes writes of about 7 decisions instead of 5 with two out, and
// costs less CPU per decision on both sides.
const maxInflight = 1

// pconn is one pipelined connection to a node. Callers queue their ops
// (enqueue) and wait; one writer goroutine sends what has queued in one
// write, and one reader goroutine reads the answers, which come in the
// order of the commands, and completes the ops. No op is ever written
// twice on a connection. An op unanswered at its call's deadline fails as
// unavailable (it may have run; its answer, should it come, is dropped),
// and a connection on which every written op has timed out is closed. A connection that fails (a write or read error) fails
// every op it has written and not yet answered, likewise.
type pconn struct {
	sh      *shard
	nc      net.Conn
	r       *bufio.Reader
	timeout time.Duration

	mu       sync.Mutex
	queue    []*op   // waiting to be written
	spare    []*op   // the last queue, reused
	pending  []entry // written (or being written), in command order
	head     int     // pending[head:] are unanswered
	inflight int     // writes with unanswered commands
	err      error   // set once, when the connection fails

	wake     chan struct{} // capacity 1: ops queued
	answered chan struct{} // capacity 1: a write was wholly answered
	stop     chan struct{} // closed on failure
}

// entry is one command awaiting its answer: an op's script, or the ASKING
// before it.
type entry struct {
	o      *op
	asking bool // the ASKING command before o's script
	last   bool // the last command of its write
	dead   bool // o failed at its deadline; o may be reused: never look
}

// dialPipe connects to sh's node, authenticates, and starts the
// connection's reader and writer.
func dialPipe(sh *shard) (*pconn, error) {
	o := sh.s.opts
	ctx, cancel := context.WithTimeout(context.Background(), o.DialTimeout)
	defer cancel()
	d := &net.Dialer{KeepAlive: 30 * time.Second}
	var nc net.Conn
	var err error
	if o.TLS != nil {
		td := &tls.Dialer{NetDialer: d, Config: o.TLS.Clone()}
		nc, err = td.DialContext(ctx, "tcp", sh.addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", sh.addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	r := bufio.NewReaderSize(nc, 32<<10)
	// Without a password, PING instead of AUTH: a node that wants one
	// answers NOAUTH, and the connection is closed here rather than kept
	// failing every script after the password has appeared (a sidecar
	// that starts before the kubelet fills its optional Secret volume).
	user, password := o.Credentials()
	dl, _ := ctx.Deadline()
	_ = nc.SetDeadline(dl)
	var b []byte
	want := "PONG"
	switch {
	case password == "":
		b = appendBulk(arrayHeader(1), "PING")
	case user != "":
		b = appendBulk(appendBulk(appendBulk(arrayHeader(3), "AUTH"), user), password)
		want = "OK"
	default:
		b = appendBulk(appendBulk(arrayHeader(2), "AUTH"), password)
		want = "OK"
	}
	if _, err := nc.Write(b); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("auth: %w", err)
	}
	v, err := readValue(r)
	if err == nil {
		if re, ok := v.(replyError); ok {
			err = re
		} else if v != want {
			err = fmt.Errorf("%w: %s answered %v", errProtocol, want, v)
		}
	}
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("auth: %w", err)
	}
	_ = nc.SetDeadline(time.Time{})
	c := &pconn{
		sh:       sh,
		nc:       nc,
		r:        r,
		timeout:  o.Timeout,
		wake:     make(chan struct{}, 1),
		answered: make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	c.r = bufio.NewReaderSize(deadlineReader{c}, 32<<10)
	if r.Buffered() > 0 {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: data after the AUTH reply", errProtocol)
	}
	go c.readLoop()
	go c.writeLoop()
	return c, nil
}

// enqueue queues o to be written, unless the connection has failed.
func (c *pconn) enqueue(o *op) bool {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	c.queue = append(c.queue, o)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return true
}

// fail closes the connection once and fails every op on it: those written
// and unanswered as unavailable (they may have run), those queued as not
// sent.
func (c *pconn) fail(err error) {
	c.mu.Lock()
	c.failLocked(err)
}

// failLocked is fail with c.mu held; it unlocks it.
func (c *pconn) failLocked(err error) {
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
	sh := c.sh
	sh.dropConn(c)
	for _, e := range pending {
		if e.asking || e.dead {
			continue // its op follows, or is finished
		}
		sh.br.failure(e.o.probe, 1)
		e.o.fail(unavailable(sh.addr, fmt.Errorf("%s script: connection lost before the answer (the script may have run): %w", e.o.la.sc.name, err)), sh.addr)
	}
	for _, o := range queued {
		sh.br.failure(o.probe, 1)
		o.fail(unavailable(sh.addr, fmt.Errorf("not sent: connection lost: %w", err)), sh.addr)
	}
}

// writeLoop sends what has queued, one write per batch. After a wake-up it
// yields once, so that the callers the scheduler has ready queue theirs
// first; then, while maxInflight writes are unanswered and the batch is not
// full, it waits for an answer, at most the batch window (group commit).
func (c *pconn) writeLoop() {
	opts := c.sh.s.opts
	window, maxBatch := opts.BatchWindow, opts.MaxBatch
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
			runtime.Gosched()
			c.mu.Lock()
			if len(c.queue) < maxBatch && c.inflight >= maxInflight && c.err == nil {
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

			for _, o := range gone {
				// Not sent: the breaker learns nothing from it.
				c.sh.br.release(o.probe)
				cause := o.ctx.Err()
				if cause == nil {
					cause = context.DeadlineExceeded
				}
				o.fail(unavailable(c.sh.addr, fmt.Errorf("not sent by the call deadline: %w", cause)), c.sh.addr)
			}
			buf = buf[:0]
			for _, o := range batch {
				if o != nil {
					buf = o.appendCommand(buf)
				}
			}
			if rest == 0 {
				clear(batch) // batch is the spare queue now: hold no finished op
			}
			if len(buf) > 0 {
				c.sh.writes.Add(1)
				c.sh.ops.Add(int64(len(batch) - len(gone)))
				_ = c.nc.SetWriteDeadline(time.Now().Add(c.timeout))
				if _, err := c.nc.Write(buf); err != nil {
					c.fail(fmt.Errorf("write: %w", err))
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
func (c *pconn) await(timer *time.Timer, window time.Duration, maxBatch int) bool {
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

// take moves up to maxBatch queued ops to the pending commands and returns
// them (nil in place of those whose callers have gone, which are returned
// in gone, to be finished without being sent), and how many ops remain
// queued. c.mu is held.
func (c *pconn) take(maxBatch int) (batch, gone []*op, rest int) {
	batch = c.queue
	if len(batch) > maxBatch {
		batch = batch[:maxBatch]
	}
	idle := c.idle()
	now := time.Now()
	n := 0
	for i, o := range batch {
		if o.ctx.Err() != nil || !now.Before(o.deadline) {
			gone = append(gone, o)
			batch[i] = nil
			continue
		}
		if o.asking {
			c.pending = append(c.pending, entry{o: o, asking: true})
		}
		c.pending = append(c.pending, entry{o: o})
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

// readLoop reads the answers in command order and completes their ops.
func (c *pconn) readLoop() {
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
			c.fail(fmt.Errorf("read: %w", err))
			return
		}
		vals, res, err := readScriptReply(c.r)
		var re replyError
		if err != nil && !errors.As(err, &re) {
			c.fail(fmt.Errorf("read: %w", err))
			return
		}
		c.mu.Lock()
		if c.head == len(c.pending) {
			c.mu.Unlock()
			c.fail(fmt.Errorf("%w: an answer to no command", errProtocol))
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
		if e.dead {
			continue // failed at its deadline; the answer comes too late
		}
		if e.asking {
			// The script's own answer follows and decides.
			switch {
			case err != nil:
				e.o.redirErr = fmt.Errorf("ASKING: %w", err)
			case res != "OK":
				e.o.redirErr = fmt.Errorf("ASKING answered %q", res)
			}
			continue
		}
		c.sh.complete(e.o, vals, res, err)
	}
}

// expire fails the ops whose deadline has passed, unanswered. It reports
// false, having closed the connection, when every written op has now
// timed out: the node has stopped answering.
func (c *pconn) expire() bool {
	now := time.Now()
	var gone []*op
	alive := false
	c.mu.Lock()
	for i := c.head; i < len(c.pending); i++ {
		e := &c.pending[i]
		if e.dead {
			continue
		}
		if now.Before(e.o.deadline) {
			alive = true
			continue
		}
		e.dead = true
		if !e.asking {
			gone = append(gone, e.o)
		}
	}
	sh := c.sh
	for _, o := range gone {
		sh.br.failure(o.probe, 1)
		o.fail(unavailable(sh.addr, fmt.Errorf("%s script: no answer by the call deadline (the script may have run)", o.la.sc.name)), sh.addr)
	}
	if !alive {
		// Close it before anything more is written to it: an op written
		// now would fail at once, and might run later.
		c.failLocked(fmt.Errorf("no answer by the call deadline of any op written"))
		return false
	}
	c.mu.Unlock()
	return true
}

// idle reports whether no answer is due. c.mu is held.
func (c *pconn) idle() bool { return c.nextDeadline().IsZero() }

// nextDeadline returns the deadline of the oldest unanswered op still
// waiting, or zero when there is none. Ops are written in about the order
// of their deadlines; one that is out of order (a caller's own shorter
// deadline) fails a little late, its caller having returned at its own
// deadline anyway. c.mu is held.
func (c *pconn) nextDeadline() time.Time {
	for i := c.head; i < len(c.pending); i++ {
		if e := c.pending[i]; !e.dead {
			return e.o.deadline
		}
	}
	return time.Time{}
}

// deadlineReader reads from the connection with a read deadline while
// answers are due: the deadline of the oldest op still waiting. With none
// due it waits without one (the writer sets it when it writes to an idle
// connection).
type deadlineReader struct{ c *pconn }

func (d deadlineReader) Read(p []byte) (int, error) {
	c := d.c
	// Under the lock, so that a writer making the connection busy sets
	// its deadline after this one, never before.
	c.mu.Lock()
	_ = c.nc.SetReadDeadline(c.nextDeadline())
	c.mu.Unlock()
	return c.nc.Read(p)
}
