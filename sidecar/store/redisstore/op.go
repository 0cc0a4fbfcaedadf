package redisstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/pipe"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/resp"
)

var _ pipe.Call = (*op)(nil)

// op is one decision on its way to a shard: a pipe.Call. An op is reused
// (opPool) only when its caller got its answer, after which nothing refers
// to it but, possibly, timed-out entries of a pipelined connection, which
// never look at it again.
type op struct {
	ctx      context.Context
	deadline time.Time // the call's: the op is finished by then
	// full: the deadline is the whole call budget (Options.Timeout), not a
	// caller's shorter one. Only such a call's timeout trips the breaker.
	full  bool
	la    *limitArgs
	key   string
	now   string // µs, or "" for Redis TIME
	n     int64
	probe bool // the half-open probe of the breaker it was admitted by
	// lease, when leased is set, is a lease script's ARGV after the
	// limit's constants: want, return, window.
	lease  [3]int64
	leased bool

	// load sends FUNCTION LOAD first, after a "Function not found"
	// answer; asking sends ASKING first, after an ASK redirect; hops
	// counts redirects followed.
	load   bool
	asking bool
	hops   int

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

// Deadline implements pipe.Call.
func (o *op) Deadline() time.Time { return o.deadline }

// Gone implements pipe.Call.
func (o *op) Gone() bool { return o.ctx.Err() != nil }

// Prelude implements pipe.Call: FUNCTION LOAD and ASKING, as needed.
func (o *op) Prelude() int {
	n := 0
	if o.load {
		n++
	}
	if o.asking {
		n++
	}
	return n
}

// askingCmd is ASKING in RESP.
var askingCmd = resp.Command("ASKING")

// AppendCommand implements pipe.Call: FCALL of the op's function, after
// FUNCTION LOAD of the library following a "Function not found" answer,
// and after ASKING following an ASK redirect (ASKING holds for the next
// command only).
func (o *op) AppendCommand(b []byte) []byte {
	if o.load {
		b = append(b, libraryLoad...)
	}
	if o.asking {
		b = append(b, askingCmd...)
	}
	b = append(b, o.la.head...)
	b = resp.AppendBulk(b, o.key)
	b = resp.AppendBulk(b, o.now)
	b = resp.AppendBulkInt(b, o.n)
	b = append(b, o.la.tailRESP...)
	if o.leased {
		for _, v := range o.lease {
			b = resp.AppendBulkInt(b, v)
		}
	}
	return b
}

// decision turns o's answer into a Decision.
func (o *op) decision(p *limiter.Params) (limiter.Decision, error) {
	var d limiter.Decision
	var err error
	if o.res != nil {
		d, err = ParseReply(o.res, p)
	} else {
		d, err = checkReply(o.vals, p)
	}
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("redisstore: %s script on %s: %w", o.la.sc.Name, o.addr, err)
	}
	return d, nil
}
