package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/pipe"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/resp"
)

var _ pipe.Handler = (*shard)(nil)

// shard is one master: its breaker and its pipelined connection. It is the
// connection's pipe.Handler: it decides what each answer is worth.
type shard struct {
	s    *Store
	addr string
	br   *breaker

	// The live pipelined connection, if any, and the dial in flight, if
	// any.
	conn    atomic.Pointer[pipe.Conn]
	dialMu  sync.Mutex
	dialing *dialCall
	closed  bool // under dialMu
	// lost is set when the connection failed: the next dial waits a
	// random pause first (under dialMu).
	lost bool

	stats pipe.Stats
}

// dialCall is one connection attempt that callers wait for.
type dialCall struct {
	at   time.Time // when the dial starts
	done chan struct{}
	c    *pipe.Conn
	err  error
}

// maxRedialPause bounds the random pause before a shard is dialled again
// after its connection failed. When a node restarts, every sidecar loses
// its connection to it at the same instant; the pause spreads their
// reconnections (and the handshakes and script loads that follow) over
// up to this long instead of the millisecond their next calls share.
const maxRedialPause = 100 * time.Millisecond

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

// close closes the shard's connection, failing the decisions on it.
func (sh *shard) close() {
	sh.dialMu.Lock()
	sh.closed = true
	sh.dialMu.Unlock()
	if c := sh.conn.Load(); c != nil {
		c.Close(errors.New("store closed"))
	}
}

// do sends o to the shard and waits for its answer or ctx's end, whichever
// comes first. It returns the address of the shard that answered or
// failed: this one, or the one a redirect led to.
func (sh *shard) do(ctx context.Context, o *op) (string, error) {
	ok, probe := sh.br.allow()
	if !ok {
		// A failover may have moved the slots to a replica: reload the
		// slot map, at most every ~250ms (jittered) however many calls
		// fail, so that a fleet waiting out an outage asks the cluster
		// for its map at staggered times, not all at once.
		sh.s.reloadWhileOpen()
		return sh.addr, unavailable(sh.addr, errors.New("circuit breaker open; failing fast"))
	}
	o.probe = probe
	sh.submit(o)
	// The connection fails o at its deadline too, but from its reader,
	// which a busy machine may run late, after a socket deadline that may
	// fire late itself: the caller keeps its own timer, so that it returns
	// as late as any sleeping goroutine and no later.
	t := getTimer(time.Until(o.deadline))
	defer putTimer(t)
	select {
	case <-o.done:
		return o.addr, o.err
	case <-ctx.Done():
		// The script may still run: the count is unknown.
		return sh.addr, unavailable(sh.addr, fmt.Errorf("no answer within the call deadline: %w", ctx.Err()))
	case <-t.C:
		return sh.addr, unavailable(sh.addr, fmt.Errorf("no answer within the call deadline: %w", context.DeadlineExceeded))
	}
}

// timerPool recycles the callers' deadline timers: one per store call.
var timerPool sync.Pool

// getTimer returns a timer that fires after d.
func getTimer(d time.Duration) *time.Timer {
	if t, ok := timerPool.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

// putTimer stops t and recycles it. Since Go 1.23 a stopped timer's
// channel holds no stale tick, so the next Reset starts clean.
func putTimer(t *time.Timer) {
	t.Stop()
	timerPool.Put(t)
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
				if o.full && errors.Is(err, context.DeadlineExceeded) {
					// The node took the whole call budget to accept
					// the connection and its handshake: stalled.
					sh.br.timedOut(o.probe)
				} else {
					sh.br.failure(o.probe, 1)
				}
				o.fail(unavailable(sh.addr, err), sh.addr)
				return
			}
		}
		if c.Enqueue(o) {
			return
		}
		// The connection failed between the load and the enqueue; o was
		// not sent. Forget it and dial again.
		sh.conn.CompareAndSwap(c, nil)
	}
}

// resubmit queues o again after an answer that proves its script did not
// run ("Function not found", MOVED, ASK). It never blocks: it runs on a connection's
// reader.
func (sh *shard) resubmit(o *op) {
	if c := sh.conn.Load(); c != nil && c.Enqueue(o) {
		return
	}
	go sh.submit(o)
}

// connect returns the live connection, or waits for a dial (starting one
// if none is in flight) until ctx ends or the deadline passes.
func (sh *shard) connect(ctx context.Context, deadline time.Time) (*pipe.Conn, error) {
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
	if d.at.After(deadline) {
		// The reconnection waits its pause past this call's deadline:
		// fail now rather than at the deadline.
		return nil, fmt.Errorf("reconnecting in %v, after the call deadline", time.Until(d.at).Round(time.Millisecond))
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
	d := &dialCall{at: time.Now(), done: make(chan struct{})}
	var pause time.Duration
	if sh.lost {
		sh.lost = false
		pause = rand.N(maxRedialPause)
		d.at = d.at.Add(pause)
	}
	sh.dialing = d
	go func() {
		if pause > 0 {
			time.Sleep(pause)
		}
		o := sh.s.opts
		tc, err := o.dialTLS()
		var c *pipe.Conn
		if err == nil {
			c, err = pipe.Dial(pipe.Config{
				Addr: sh.addr, TLS: tc, Credentials: o.Credentials, ClientName: o.ClientName,
				DialTimeout: o.DialTimeout, WriteTimeout: o.Timeout,
				BatchWindow: o.BatchWindow, MaxBatch: o.MaxBatch,
				Handler: sh, Stats: &sh.stats,
			})
		}
		sh.dialMu.Lock()
		if err == nil && sh.closed {
			c.Close(errors.New("store closed"))
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

// Closed implements pipe.Handler: it forgets c, a failed connection, so
// that the next call dials, after a random pause (maxRedialPause).
func (sh *shard) Closed(c *pipe.Conn) {
	sh.dialMu.Lock()
	sh.lost = true
	sh.dialMu.Unlock()
	sh.conn.CompareAndSwap(c, nil)
}

// Failed implements pipe.Handler: a call that got no answer leaves the
// count unknown. One the node never saw tells the breaker nothing; one it
// did not answer within the whole call budget (Options.Timeout, not a
// caller's shorter deadline) trips it at once (see breaker).
func (sh *shard) Failed(c pipe.Call, f pipe.Failure, err error) {
	o := c.(*op)
	switch {
	case f == pipe.Unsent:
		sh.br.release(o.probe)
	case f == pipe.Unanswered && o.full && errors.Is(err, pipe.ErrNoAnswer):
		sh.br.timedOut(o.probe)
	default:
		sh.br.failure(o.probe, 1)
	}
	if f == pipe.Unanswered {
		err = fmt.Errorf("%s script: %w", o.la.sc.Name, err)
	}
	o.fail(unavailable(sh.addr, err), sh.addr)
}

// Answered implements pipe.Handler: "Function not found" is sent again
// after FUNCTION LOAD, MOVED
// and ASK to the node named (a bounded number of hops), and anything else
// is the op's outcome. It runs on the connection's reader and never
// blocks.
func (sh *shard) Answered(c pipe.Call, vals [4]int64, res any, err error) {
	o := c.(*op)
	switch out := resp.Classify(err); out {
	case resp.Done:
		sh.br.success(o.probe)
		o.finish(vals, res, nil, sh.addr)
	case resp.NoFunction:
		sh.br.success(o.probe) // the node answered
		if o.load {
			// FUNCTION LOAD went first and the function is still missing:
			// this user may not load it. Until the manager does, the
			// count is unknown.
			o.fail(unavailable(sh.addr, fmt.Errorf("%s script: library %s is not loaded, and this store user may not load it (FUNCTION LOAD): %w",
				o.la.sc.Name, libraryName(), err)), sh.addr)
			return
		}
		// The function did not run: send it once more after FUNCTION
		// LOAD, whose own answer is dropped (another client may have
		// loaded the library first).
		o.probe = false
		o.load = true
		sh.resubmit(o)
	case resp.Moved, resp.Ask:
		sh.br.success(o.probe) // the node answered
		o.probe = false
		sh.redirect(o, out == resp.Ask, err)
	case resp.Unavailable:
		sh.br.failure(o.probe, 1)
		o.fail(unavailable(sh.addr, fmt.Errorf("%s script: %w", o.la.sc.Name, err)), sh.addr)
	default:
		sh.failScript(o, err)
	}
}

// failScript fails o with an error the node answered: it is up, the
// script or the data is wrong.
func (sh *shard) failScript(o *op, err error) {
	sh.br.success(o.probe)
	o.fail(fmt.Errorf("redisstore: %s script on %s: %w", o.la.sc.Name, sh.addr, err), sh.addr)
}

// redirect sends o, which the shard answered with MOVED or ASK (the
// script did not run), to the node the answer names, unless it has
// followed a redirect too many or cannot follow this one: then the slot is
// moving, and o fails as unavailable.
func (sh *shard) redirect(o *op, ask bool, err error) {
	addr, ok := resp.Redirect(err, sh.addr)
	if o.asking || o.hops >= maxRedirects || !ok || sh.s.opts.Single {
		msg := "slot in migration"
		if !o.asking {
			msg = fmt.Sprintf("redirect not followed after %d hops", o.hops)
		}
		o.fail(unavailable(sh.addr, fmt.Errorf("%s script: %s: %w", o.la.sc.Name, msg, err)), sh.addr)
		return
	}
	sh.s.reloadTopology()
	o.hops++
	t := sh.s.shard(addr)
	okt, probe := t.br.allow()
	if !okt {
		o.fail(unavailable(t.addr, errors.New("circuit breaker open; failing fast")), t.addr)
		return
	}
	o.probe = probe
	o.asking = ask
	t.resubmit(o)
}
