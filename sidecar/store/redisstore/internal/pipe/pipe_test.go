package pipe_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/pipe"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/resp"
	"github.com/floodgate-dev/floodgate/test/redistest"
)

// call is a pipe.Call of any command, with its outcome.
type call struct {
	args     []string
	deadline time.Time
	prelude  [][]string // commands before args, whose answers are dropped

	res     any
	err     error
	failure pipe.Failure
	failed  bool
	done    chan struct{}
}

func newCall(deadline time.Time, args ...string) *call {
	return &call{args: args, deadline: deadline, done: make(chan struct{})}
}

func (c *call) Deadline() time.Time { return c.deadline }
func (c *call) Gone() bool          { return false }
func (c *call) Prelude() int        { return len(c.prelude) }
func (c *call) AppendCommand(b []byte) []byte {
	for _, p := range c.prelude {
		b = append(b, resp.Command(p...)...)
	}
	return append(b, resp.Command(c.args...)...)
}

func (c *call) wait(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%v: no outcome", c.args)
	}
}

// handler records outcomes; every call must get exactly one.
type handler struct {
	mu     sync.Mutex
	closed []*pipe.Conn
}

func (h *handler) Answered(c pipe.Call, _ [4]int64, res any, err error) {
	cl := c.(*call)
	cl.res, cl.err = res, err
	close(cl.done)
}

func (h *handler) Failed(c pipe.Call, f pipe.Failure, err error) {
	cl := c.(*call)
	cl.failed, cl.failure, cl.err = true, f, err
	close(cl.done)
}

func (h *handler) Closed(conn *pipe.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = append(h.closed, conn)
}

func dial(t *testing.T, addr, password string, h pipe.Handler, st *pipe.Stats, window time.Duration) *pipe.Conn {
	t.Helper()
	c, err := pipe.Dial(pipe.Config{
		Addr: addr, Credentials: func() (string, string) { return "", password },
		DialTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		BatchWindow: window, MaxBatch: 16, Handler: h, Stats: st,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(errors.New("test over")) })
	return c
}

// TestAnswersInOrder sends many calls at once, some after ASKING, and
// checks that each gets its own answer: the reader keeps the commands and
// the replies in step, swallowing ASKING's own reply (an error here, on a
// server without cluster mode).
func TestAnswersInOrder(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{Password: "pw"})
	for _, window := range []time.Duration{0, 100 * time.Microsecond} {
		t.Run(fmt.Sprintf("window=%v", window), func(t *testing.T) {
			h := &handler{}
			var st pipe.Stats
			c := dial(t, srv.Addr(), "pw", h, &st, window)
			deadline := time.Now().Add(10 * time.Second)
			calls := make([]*call, 100)
			for i := range calls {
				calls[i] = newCall(deadline, "ECHO", fmt.Sprintf("answer %d", i))
				switch {
				case i%7 == 3:
					calls[i].prelude = [][]string{{"ASKING"}}
				case i%11 == 5:
					calls[i].prelude = [][]string{{"ECHO", "not the answer"}, {"PING"}}
				}
			}
			var wg sync.WaitGroup
			for _, cl := range calls {
				wg.Go(func() {
					if !c.Enqueue(cl) {
						t.Error("Enqueue on a live connection failed")
					}
				})
			}
			wg.Wait()
			for i, cl := range calls {
				cl.wait(t)
				if cl.failed || cl.err != nil {
					t.Fatalf("call %d: failed %v (%v), err %v", i, cl.failed, cl.failure, cl.err)
				}
				if got, want := cl.res, fmt.Sprintf("answer %d", i); got != want {
					t.Errorf("call %d answered %q, want %q", i, got, want)
				}
			}
			if w, n := st.Writes.Load(), st.Calls.Load(); w < 1 || w > n || n != int64(len(calls)) {
				t.Errorf("stats: %d writes, %d calls; want 1 to %d writes carrying %d calls", w, n, len(calls), len(calls))
			}
			if len(h.closed) != 0 {
				t.Errorf("connection closed: %v", h.closed)
			}
		})
	}
}

// TestErrorReplyKeepsConnection: an error reply is an answer, not a
// connection failure.
func TestErrorReplyKeepsConnection(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	h := &handler{}
	c := dial(t, srv.Addr(), "", h, nil, 0)
	deadline := time.Now().Add(10 * time.Second)
	bad, good := newCall(deadline, "FCALL", "fg_missing", "0"), newCall(deadline, "PING")
	c.Enqueue(bad)
	c.Enqueue(good)
	bad.wait(t)
	good.wait(t)
	if got := resp.Classify(bad.err); bad.failed || got != resp.NoFunction {
		t.Errorf("FCALL of an unknown function: failed %v, err %v (%v), want a \"Function not found\" answer", bad.failed, bad.err, got)
	}
	if good.failed || good.err != nil || good.res != "PONG" {
		t.Errorf("PING after an error reply: %v, %v, %v", good.failed, good.err, good.res)
	}
}

// TestDeadlineOnStoppedServer stops the server: a written call fails as
// Unanswered at its deadline, the connection closes once every written
// call has timed out, and it refuses new calls.
func TestDeadlineOnStoppedServer(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	h := &handler{}
	c := dial(t, srv.Addr(), "", h, nil, 0)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	start := time.Now()
	cl := newCall(start.Add(100*time.Millisecond), "PING")
	c.Enqueue(cl)
	cl.wait(t)
	if !cl.failed || cl.failure != pipe.Unanswered {
		t.Fatalf("call on a stopped server: failed %v, failure %v, err %v; want Unanswered", cl.failed, cl.failure, cl.err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("failed after %v, want about its 100ms deadline", took)
	}
	// The connection closes right after the call fails.
	for i := 0; ; i++ {
		h.mu.Lock()
		n := len(h.closed)
		h.mu.Unlock()
		if n == 1 {
			break
		}
		if i == 200 {
			t.Fatalf("connection not closed after its only written call timed out (%d Closed)", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c.Enqueue(newCall(time.Now().Add(time.Second), "PING")) {
		t.Error("a closed connection took a call")
	}
}

// TestCloseFailsQueuedCalls: calls queued behind a write that is not
// answered fail when the connection closes, as Dropped or Unanswered, and
// an expired one is never written.
func TestCloseFailsQueuedCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	h := &handler{}
	// A long window: later calls wait for the first write's answer.
	c := dial(t, srv.Addr(), "", h, nil, 10*time.Millisecond)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	deadline := time.Now().Add(10 * time.Second)
	first := newCall(deadline, "PING")
	c.Enqueue(first)
	expired := newCall(time.Now().Add(-time.Second), "PING")
	later := newCall(deadline, "PING")
	c.Enqueue(expired)
	c.Enqueue(later)
	expired.wait(t)
	if !expired.failed || expired.failure != pipe.Unsent || !errors.Is(expired.err, context.DeadlineExceeded) {
		t.Errorf("expired call: failed %v, failure %v, err %v; want Unsent by the deadline", expired.failed, expired.failure, expired.err)
	}
	cause := errors.New("shutting down")
	c.Close(cause)
	for _, cl := range []*call{first, later} {
		cl.wait(t)
		if !cl.failed || cl.failure == pipe.Unsent || !errors.Is(cl.err, cause) {
			t.Errorf("call after Close: failed %v, failure %v, err %v; want Dropped or Unanswered with the cause", cl.failed, cl.failure, cl.err)
		}
	}
	if first.failure != pipe.Unanswered {
		t.Errorf("the written call failed as %v, want Unanswered", first.failure)
	}
}
