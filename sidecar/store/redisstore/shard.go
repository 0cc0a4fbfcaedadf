package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// op is one decision on its way to a shard. An op is reused (opPool) only
// when its caller got its answer, after which nothing refers to it but,
// possibly, timed-out entries of a pipelined connection, which never look
// at it again.
type op struct {
	ctx      context.Context
	deadline time.Time // the call's: the op is finished by then
	la       *limitArgs
	key      string
	now      string // µs, or "" for Redis TIME
	n        int64
	probe    bool // the half-open probe of the breaker it was admitted by

	// On a pipelined connection: EVALSHA until a NOSCRIPT answer, then
	// EVAL; asking sends ASKING first; hops counts redirects followed.
	useEval bool
	asking  bool
	hops    int

	// Set once, before done is signalled: the script's answer in vals, or
	// another reply in res, or err.
	vals [4]int64
	res  any
	err  error
	addr string        // the shard that answered, for error messages
	done chan struct{} // capacity 1: finish sends once
}

var opPool = sync.Pool{New: func() any { return &op{done: make(chan struct{}, 1)} }}

func getOp() *op { return opPool.Get().(*op) }

// putOp recycles o, whose caller has received its answer.
func putOp(o *op) {
	done := o.done
	*o = op{done: done}
	opPool.Put(o)
}

func (o *op) finish(vals [4]int64, res any, err error, addr string) {
	o.vals, o.res, o.err, o.addr = vals, res, err, addr
	o.done <- struct{}{}
}

func (o *op) fail(err error, addr string) { o.finish([4]int64{}, nil, err, addr) }

// decision turns o's answer into a Decision.
func (o *op) decision(p *limiter.Params) (limiter.Decision, error) {
	var d limiter.Decision
	var err error
	if o.res != nil {
		d, err = parseReply(o.res, p)
	} else {
		d, err = checkReply(o.vals, p)
	}
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("redisstore: %s script on %s: %w", o.la.sc.name, o.addr, err)
	}
	return d, nil
}

// shard is one master: its breaker and its pipelined connection.
type shard struct {
	s    *Store
	addr string
	br   *breaker

	// The live pipelined connection, if any, and the dial in flight, if
	// any.
	conn    atomic.Pointer[pconn]
	dialMu  sync.Mutex
	dialing *dialCall
	closed  bool // under dialMu

	writes, ops atomic.Int64 // pipelined writes, and the ops they carried
}

// dialCall is one connection attempt that callers wait for.
type dialCall struct {
	done chan struct{}
	c    *pconn
	err  error
}

func newShard(s *Store, addr string) *shard {
	sh := &shard{s: s, addr: addr}
	sh.br = newBreaker(s.opts.BreakerFailures, s.opts.BreakerCooldown, time.Now, func(st BreakerState) {
		if st != BreakerClosed {
			s.reloadTopology()
		}
	})
	_, _ = sh.startDial() // ready for the first call
	return sh
}

// close closes the shard's connection.
func (sh *shard) close() error {
	sh.dialMu.Lock()
	sh.closed = true
	sh.dialMu.Unlock()
	if c := sh.conn.Load(); c != nil {
		c.fail(errors.New("store closed"))
	}
	return nil
}

// do sends o to the shard and waits for its answer or ctx's end, whichever
// comes first.
func (sh *shard) do(ctx context.Context, o *op) error {
	ok, probe := sh.br.allow()
	if !ok {
		sh.s.reloadTopology() // a failover may have moved the slots
		return unavailable(sh.addr, errors.New("circuit breaker open; failing fast"))
	}
	o.probe = probe
	sh.submit(o)
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		// The script may still run: the count is unknown.
		return unavailable(sh.addr, fmt.Errorf("no answer within the call deadline: %w", ctx.Err()))
	}
}

// submit queues o on the shard's pipelined connection, dialling one if
// there is none (waiting at most until o's context ends). It does not wait
// for the answer.
func (sh *shard) submit(o *op) {
	for {
		c := sh.conn.Load()
		if c == nil {
			var err error
			if c, err = sh.connect(o.ctx, o.deadline); err != nil {
				sh.br.failure(o.probe, 1)
				o.fail(unavailable(sh.addr, err), sh.addr)
				return
			}
		}
		if c.enqueue(o) {
			return
		}
		// The connection failed between the load and the enqueue; o was
		// not sent. Forget it and dial again.
		sh.conn.CompareAndSwap(c, nil)
	}
}

// resubmit queues o again after an answer that proves its script did not
// run (NOSCRIPT, MOVED, ASK). It never blocks: it runs on a connection's
// reader.
func (sh *shard) resubmit(o *op) {
	if c := sh.conn.Load(); c != nil && c.enqueue(o) {
		return
	}
	go sh.submit(o)
}

// connect returns the live connection, or waits for a dial (starting one
// if none is in flight) until ctx ends or the deadline passes.
func (sh *shard) connect(ctx context.Context, deadline time.Time) (*pconn, error) {
	d, err := sh.startDial()
	if err != nil {
		return nil, err
	}
	if d == nil {
		if c := sh.conn.Load(); c != nil {
			return c, nil
		}
		return nil, errors.New("connection lost")
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-d.done:
		if d.err != nil {
			return nil, d.err
		}
		return d.c, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("connecting: %w", ctx.Err())
	case <-t.C:
		return nil, fmt.Errorf("connecting: %w", context.DeadlineExceeded)
	}
}

// startDial starts a dial unless a connection is live (then it returns
// nil) or a dial is in flight (then it returns that one). The dial runs
// under Options.DialTimeout, not under any caller's deadline, so that a
// caller giving up does not fail the others.
func (sh *shard) startDial() (*dialCall, error) {
	sh.dialMu.Lock()
	defer sh.dialMu.Unlock()
	if sh.closed {
		return nil, errors.New("store is closed")
	}
	if sh.conn.Load() != nil {
		return nil, nil
	}
	if sh.dialing != nil {
		return sh.dialing, nil
	}
	d := &dialCall{done: make(chan struct{})}
	sh.dialing = d
	go func() {
		c, err := dialPipe(sh)
		sh.dialMu.Lock()
		if err == nil && sh.closed {
			c.fail(errors.New("store closed"))
			err = errors.New("store is closed")
		}
		if err == nil {
			sh.conn.Store(c)
		}
		d.c, d.err = c, err
		sh.dialing = nil
		sh.dialMu.Unlock()
		close(d.done)
	}()
	return d, nil
}

// dropConn forgets c, a failed connection, so that the next call dials.
func (sh *shard) dropConn(c *pconn) { sh.conn.CompareAndSwap(c, nil) }

// complete handles the answer to o on a pipelined connection: NOSCRIPT is
// sent again as EVAL, MOVED and ASK to the node named (a bounded number of
// hops), and anything else is o's outcome. It runs on the connection's
// reader and never blocks.
func (sh *shard) complete(o *op, vals [4]int64, res any, err error) {
	out := classify(err)
	switch out {
	case outNoScript:
		if !o.useEval {
			// The script did not run: send it once more with its source,
			// which also caches it again.
			o.useEval = true
			sh.resubmit(o)
			return
		}
	case outMoved, outAsk:
		sh.br.success(o.probe) // the node answered
		o.probe = false
		addr, _ := redirect(err)
		if o.asking || o.hops >= maxRedirects || addr == "" || sh.s.opts.Single {
			// A second redirect, or too many: the slot is moving.
			// Nothing ran.
			msg := "slot in migration"
			if !o.asking {
				msg = fmt.Sprintf("redirect not followed after %d hops", o.hops)
			}
			o.fail(unavailable(sh.addr, fmt.Errorf("%s script: %s: %w", o.la.sc.name, msg, err)), sh.addr)
			return
		}
		sh.s.reloadTopology()
		o.hops++
		t := sh.s.shard(addr)
		ok, probe := t.br.allow()
		if !ok {
			o.fail(unavailable(t.addr, errors.New("circuit breaker open; failing fast")), t.addr)
			return
		}
		o.probe = probe
		if out == outAsk {
			// ASKING then EVAL, so that a node without the script
			// cached needs no second trip.
			o.asking, o.useEval = true, true
		}
		t.resubmit(o)
		return
	}
	switch out {
	case outOK:
		sh.br.success(o.probe)
		o.finish(vals, res, nil, sh.addr)
	case outUnavailable:
		sh.br.failure(o.probe, 1)
		o.fail(unavailable(sh.addr, fmt.Errorf("%s script: %w", o.la.sc.name, err)), sh.addr)
	default:
		// The node answered with an error: it is up, the script or the
		// data is wrong.
		sh.br.success(o.probe)
		o.fail(fmt.Errorf("redisstore: %s script on %s: %w", o.la.sc.name, sh.addr, err), sh.addr)
	}
}
