package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// op is one decision on its way to a shard.
type op struct {
	ctx    context.Context
	script *script
	args   []any // the whole EVALSHA command
	probe  bool  // the half-open probe of the breaker it was admitted by

	self [1]*op // o itself, to send it alone without allocating

	// Where a MOVED or ASK answer pointed.
	redirAddr string
	asking    bool
	redirErr  error

	// Set once, before done is closed.
	res  any
	err  error
	addr string // the shard that answered, for error messages
	done chan struct{}
}

func (o *op) finish(res any, err error, addr string) {
	o.res, o.err, o.addr = res, err, addr
	close(o.done)
}

// maxInflight is how many pipelines a shard has out at once before new
// decisions start to wait (at most the batch window) for one to return.
const maxInflight = 2

// shard is one master: its node client, its breaker and its open batch.
type shard struct {
	s      *Store
	addr   string
	client *redis.Client
	br     *breaker

	inflight atomic.Int32  // pipelines out
	freed    chan struct{} // a pipeline returned; capacity 1

	mu   sync.Mutex
	open *batch // collecting ops; nil when none is
}

func newShard(s *Store, addr string, client *redis.Client) *shard {
	return &shard{s: s, addr: addr, client: client, freed: make(chan struct{}, 1)}
}

// batch is a set of ops that leave together in one round trip.
type batch struct {
	ops    []*op
	sealed atomic.Bool   // full: no op may join
	full   chan struct{} // closed when sealed
}

// do sends o to the shard, batched or not, and waits for its answer or
// ctx's end, whichever comes first.
func (sh *shard) do(ctx context.Context, o *op) (any, error) {
	ok, probe := sh.br.allow()
	if !ok {
		sh.s.reloadTopology() // a failover may have moved the slots
		return nil, unavailable(sh.addr, errors.New("circuit breaker open; failing fast"))
	}
	o.probe = probe
	if sh.s.opts.BatchWindow < 0 {
		o.self[0] = o
		sh.send(o.self[:], deadlineOf(ctx), 0)
	} else {
		sh.enqueue(o)
	}
	select {
	case <-o.done:
		return o.res, o.err
	case <-ctx.Done():
		// The script may still run: the count is unknown.
		return nil, unavailable(sh.addr, fmt.Errorf("no answer within the call deadline: %w", ctx.Err()))
	}
}

// enqueue adds o to the shard's open batch. The op that opens a batch
// leads it and sends it from its own goroutine: at once when fewer than
// maxInflight pipelines are out, so that an idle shard adds no latency;
// otherwise as soon as one of them returns, the batch fills up, or the
// batch window ends, whichever comes first. Under load the batches are
// thus what arrives during part of a round trip (group commit).
//
// The window is a Go timer, which fires late when the scheduler is idle
// (by up to about a millisecond on Linux). It bounds the wait only when
// Redis is slower than the window; otherwise a returning pipeline ends it.
// The leader blocks rather than spins, so that the network poller, which
// sees the pipelines return, keeps running even with GOMAXPROCS=1.
func (sh *shard) enqueue(o *op) {
	sh.mu.Lock()
	b := sh.open
	lead := b == nil
	if lead {
		b = &batch{ops: make([]*op, 0, 16), full: make(chan struct{})}
		sh.open = b
	}
	b.ops = append(b.ops, o)
	if len(b.ops) >= sh.s.opts.MaxBatch {
		sh.open = nil
		b.sealed.Store(true)
		close(b.full)
	}
	sh.mu.Unlock()
	if !lead {
		return
	}
	if !b.sealed.Load() && sh.inflight.Load() >= maxInflight {
		t := time.NewTimer(sh.s.opts.BatchWindow)
	wait:
		for !b.sealed.Load() && sh.inflight.Load() >= maxInflight {
			select {
			case <-b.full:
			case <-sh.freed: // maybe stale: the loop checks again
			case <-t.C:
				break wait
			}
		}
		t.Stop()
	}
	sh.mu.Lock()
	if sh.open == b {
		sh.open = nil
	}
	ops := b.ops
	sh.mu.Unlock()
	sh.inflight.Add(1)
	sh.send(ops, batchDeadline(ops), 0)
	sh.inflight.Add(-1)
	select {
	case sh.freed <- struct{}{}:
	default:
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

// batchDeadline is the latest deadline of the ops: the pipeline serves all
// of them, and each caller stops waiting at its own deadline anyway.
func batchDeadline(ops []*op) time.Time {
	var d time.Time
	for _, o := range ops {
		if od := deadlineOf(o.ctx); od.After(d) {
			d = od
		}
	}
	return d
}

// send runs ops on this shard: EVALSHA for all of them in one round trip
// (one pipeline, or a plain command for a single op), then EVAL once for
// those the node had no script for, then a bounded number of hops for those
// the node redirected. Only answers that prove the script did not run
// (NOSCRIPT, MOVED, ASK) lead to a resend; an op whose outcome is unknown
// is never sent again. Every op is finished when send returns.
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
	// One op goes under its caller's context. A batch serves several
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
			o.finish(nil, unavailable(sh.addr, fmt.Errorf("not sent: %w", err)), sh.addr)
			continue
		}
		live = append(live, o)
	}
	return live
}

// settle finishes o with its command's final outcome and records it with
// the breaker.
func (sh *shard) settle(o *op, cmd *redis.Cmd, err error, out outcome) {
	switch out {
	case outOK:
		sh.br.success(o.probe)
		o.finish(cmd.Val(), nil, sh.addr)
	case outUnavailable:
		sh.br.failure(o.probe, 1)
		o.finish(nil, unavailable(sh.addr, fmt.Errorf("%s script: %w", o.script.name, err)), sh.addr)
	case outMoved, outAsk:
		// A second redirect: the slot is moving. Nothing ran.
		sh.br.success(o.probe)
		o.finish(nil, unavailable(sh.addr, fmt.Errorf("%s script: slot in migration: %w", o.script.name, err)), sh.addr)
	default:
		// The node answered with an error: it is up, the script or the
		// data is wrong (or a redirect came where none may).
		sh.br.success(o.probe)
		o.finish(nil, fmt.Errorf("redisstore: %s script on %s: %w", o.script.name, sh.addr, err), sh.addr)
	}
}

// exec runs one command per op on the node, in one round trip. useSha
// picks EVALSHA or EVAL; asking prefixes each with ASKING. A single op
// without ASKING goes as a plain command, not a pipeline.
func (sh *shard) exec(ctx context.Context, ops []*op, useSha, asking bool) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(ops))
	for i, o := range ops {
		a := o.args
		if !useSha {
			a = evalCommand(a, o.script)
		}
		cmds[i] = redis.NewCmd(ctx, a...)
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
// answer names. None of them has run.
func (sh *shard) redirect(ops []*op, deadline time.Time, hops int) {
	sh.s.reloadTopology()
	type target struct {
		addr   string
		asking bool
	}
	groups := map[target][]*op{}
	for _, o := range ops {
		if hops >= maxRedirects || o.redirAddr == "" || sh.s.opts.Single {
			o.finish(nil, unavailable(sh.addr, fmt.Errorf("%s script: redirect not followed after %d hops: %w", o.script.name, hops, o.redirErr)), sh.addr)
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
				o.finish(nil, unavailable(t.addr, errors.New("circuit breaker open; failing fast")), t.addr)
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
