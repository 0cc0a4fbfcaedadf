package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

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

	self [1]*op // o itself, to send it alone without allocating

	// Where a MOVED or ASK answer pointed (go-redis path).
	redirAddr string
	redirErr  error

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

// args returns o's whole command for go-redis: EVALSHA (or EVAL) script 1
// key now n, then the limit's constants.
func (o *op) args(useSha bool) []any {
	a := make([]any, 0, 6+len(o.la.tailArgs))
	if useSha {
		a = append(a, "evalsha", o.la.sc.shaArg)
	} else {
		a = append(a, "eval", o.la.sc.srcArg)
	}
	a = append(a, "1", o.key, o.now, o.n)
	return append(a, o.la.tailArgs...)
}

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

// shard is one master: its breaker, and its connections: a go-redis
// client for unpipelined calls (batching off), or one pipelined
// connection (batching on).
type shard struct {
	s      *Store
	addr   string
	client *redis.Client // batching off
	br     *breaker

	// Batching on: the live pipelined connection, if any, and the dial in
	// flight, if any.
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
	if s.opts.BatchWindow == NoBatching {
		sh.client = redis.NewClient(s.nodeOptions(addr))
	} else {
		_, _ = sh.startDial() // ready for the first call
	}
	return sh
}

// close closes the shard's connections.
func (sh *shard) close() error {
	if sh.client != nil {
		return sh.client.Close()
	}
	sh.dialMu.Lock()
	sh.closed = true
	sh.dialMu.Unlock()
	if c := sh.conn.Load(); c != nil {
		c.fail(errors.New("store closed"))
	}
	return nil
}

// do sends o to the shard, pipelined or not, and waits for its answer or
// ctx's end, whichever comes first.
func (sh *shard) do(ctx context.Context, o *op) error {
	ok, probe := sh.br.allow()
	if !ok {
		sh.s.reloadTopology() // a failover may have moved the slots
		return unavailable(sh.addr, errors.New("circuit breaker open; failing fast"))
	}
	o.probe = probe
	if sh.client != nil {
		o.self[0] = o
		sh.send(o.self[:], deadlineOf(ctx), 0)
	} else {
		sh.submit(o)
	}
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

// deadlineOf returns ctx's deadline; every op's context has one.
func deadlineOf(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(DefaultTimeout)
	}
	return d
}

// send runs ops on this shard through go-redis (batching off): EVALSHA for
// all of them in one round trip (a plain command for a single op), then
// EVAL once for those the node had no script for, then a bounded number of
// hops for those the node redirected. Only answers that prove the script
// did not run (NOSCRIPT, MOVED, ASK) lead to a resend; an op whose outcome
// is unknown is never sent again. Every op is finished when send returns.
func (sh *shard) send(ops []*op, deadline time.Time, hops int) {
	live := ops
	for i, o := range ops {
		if o.ctx.Err() != nil {
			live = dropGone(sh, ops, i)
			break
		}
	}
	if len(live) == 0 {
		return
	}
	// One op goes under its caller's context. Several serve several
	// callers: one giving up must not cut the others off.
	ctx := live[0].ctx
	if len(live) > 1 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.Background(), deadline)
		defer cancel()
	}

	var redirected []*op
	pending := live
	for _, useSha := range [...]bool{true, false} {
		cmds := sh.exec(ctx, pending, useSha, false)
		var noScript []*op
		for i, o := range pending {
			err := cmds[i].Err()
			switch out := classify(err); out {
			case outNoScript:
				if useSha {
					noScript = append(noScript, o)
					continue
				}
				sh.settle(o, cmds[i], err, out)
			case outMoved, outAsk:
				sh.br.success(o.probe) // the node answered
				o.probe = false
				o.redirAddr, _ = redirect(err)
				o.asking = out == outAsk
				o.redirErr = err
				redirected = append(redirected, o)
			default:
				sh.settle(o, cmds[i], err, out)
			}
		}
		if len(noScript) == 0 {
			break
		}
		pending = noScript
	}
	if len(redirected) > 0 {
		sh.redirect(redirected, deadline, hops)
	}
}

// dropGone finishes the ops, from the first-th on, whose callers have
// gone before they were sent, and returns the others.
func dropGone(sh *shard, ops []*op, first int) []*op {
	live := make([]*op, first, len(ops))
	copy(live, ops[:first])
	for _, o := range ops[first:] {
		if err := o.ctx.Err(); err != nil {
			sh.br.release(o.probe)
			o.fail(unavailable(sh.addr, fmt.Errorf("not sent: %w", err)), sh.addr)
			continue
		}
		live = append(live, o)
	}
	return live
}

// settle finishes o with its go-redis command's final outcome and records
// it with the breaker.
func (sh *shard) settle(o *op, cmd *redis.Cmd, err error, out outcome) {
	switch out {
	case outOK:
		sh.br.success(o.probe)
		o.finish([4]int64{}, cmd.Val(), nil, sh.addr)
	case outUnavailable:
		sh.br.failure(o.probe, 1)
		o.fail(unavailable(sh.addr, fmt.Errorf("%s script: %w", o.la.sc.name, err)), sh.addr)
	case outMoved, outAsk:
		// A second redirect: the slot is moving. Nothing ran.
		sh.br.success(o.probe)
		o.fail(unavailable(sh.addr, fmt.Errorf("%s script: slot in migration: %w", o.la.sc.name, err)), sh.addr)
	default:
		// The node answered with an error: it is up, the script or the
		// data is wrong (or a redirect came where none may).
		sh.br.success(o.probe)
		o.fail(fmt.Errorf("redisstore: %s script on %s: %w", o.la.sc.name, sh.addr, err), sh.addr)
	}
}

// exec runs one command per op on the node, in one round trip. useSha
// picks EVALSHA or EVAL; asking prefixes each with ASKING. A single op
// without ASKING goes as a plain command, not a pipeline.
func (sh *shard) exec(ctx context.Context, ops []*op, useSha, asking bool) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(ops))
	for i, o := range ops {
		cmds[i] = redis.NewCmd(ctx, o.args(useSha)...)
	}
	if len(ops) == 1 && !asking {
		_ = sh.client.Process(ctx, cmds[0]) // the error is on the command
		return cmds
	}
	pipe := sh.client.Pipeline()
	for _, c := range cmds {
		if asking {
			_ = pipe.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
		}
		_ = pipe.Process(ctx, c)
	}
	_, _ = pipe.Exec(ctx) // the errors are on the commands
	return cmds
}

// redirect sends ops that a node answered MOVED or ASK for to the node the
// answer names (go-redis path). None of them has run.
func (sh *shard) redirect(ops []*op, deadline time.Time, hops int) {
	sh.s.reloadTopology()
	type target struct {
		addr   string
		asking bool
	}
	groups := map[target][]*op{}
	for _, o := range ops {
		if hops >= maxRedirects || o.redirAddr == "" || sh.s.opts.Single {
			o.fail(unavailable(sh.addr, fmt.Errorf("%s script: redirect not followed after %d hops: %w", o.la.sc.name, hops, o.redirErr)), sh.addr)
			continue
		}
		k := target{o.redirAddr, o.asking}
		groups[k] = append(groups[k], o)
	}
	for k, group := range groups {
		t := sh.s.shard(k.addr)
		admitted := make([]*op, 0, len(group))
		for _, o := range group {
			ok, probe := t.br.allow()
			if !ok {
				o.fail(unavailable(t.addr, errors.New("circuit breaker open; failing fast")), t.addr)
				continue
			}
			o.probe = probe
			admitted = append(admitted, o)
		}
		if len(admitted) == 0 {
			continue
		}
		if k.asking {
			t.sendAsking(admitted, deadline)
		} else {
			t.send(admitted, deadline, hops+1)
		}
	}
}

// sendAsking runs ops on a node that is importing their slot: ASKING then
// EVAL, so that a node without the script cached needs no second trip.
// Another redirect here is not followed.
func (sh *shard) sendAsking(ops []*op, deadline time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cmds := sh.exec(ctx, ops, false, true)
	for i, o := range ops {
		err := cmds[i].Err()
		sh.settle(o, cmds[i], err, classify(err))
	}
}
