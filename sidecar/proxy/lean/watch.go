package lean

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/proxy"
)

// errClientGone is a request whose client went away while it waited for
// the application's answer.
var errClientGone = errors.New("the client went away")

// readResponseHeadWatched reads the application's answer head like
// readResponseHead and, while the request holds concurrency slots, watches
// the client connection meanwhile: a client that goes away (its
// connection reads EOF or fails) closes the upstream connection, as the
// net/http front cancels the upstream request, so that the request ends
// and its slots come back at once rather than when the application
// answers. The answer is then errClientGone. Bytes the client sends
// meanwhile (a pipelined request) are kept in the request buffer, and the
// watch ends with them.
func (c *conn) readResponseHeadWatched(up *upConn, d *proxy.Decision) error {
	if !d.Holds() || c.w == len(c.buf) {
		return c.readResponseHead(up, false)
	}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	_ = c.nc.SetReadDeadline(time.Time{})
	c.dlIdle = false
	go func() {
		n, err := c.nc.Read(c.buf[c.w:])
		if n == 0 && err != nil && !isTimeout(err) {
			// Gone: stop waiting for the application.
			_ = up.nc.Close()
		}
		done <- result{n, err}
	}()
	err := c.readResponseHead(up, false)
	// Stop the watch: a read deadline in the past ends the read.
	_ = c.nc.SetReadDeadline(aLongTimeAgo)
	res := <-done
	_ = c.nc.SetReadDeadline(time.Time{})
	c.w += res.n
	if res.n == 0 && res.err != nil && !isTimeout(res.err) {
		return errClientGone
	}
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// sleep is the State's Sleep: a request that waits for a delayed slot
// waits in a read of its client connection with the slot's instant as
// the deadline, so that the wait costs no timer or goroutine of its own
// and a client that goes away (EOF or an error) ends it at once, false.
// Bytes the client sends meanwhile (a pipelined request) are kept in the
// request buffer. With the buffer full it waits on a timer alone.
func (c *conn) sleep(ctx context.Context, d time.Duration) bool {
	until := time.Now().Add(d)
	c.dlIdle = false
	defer func() { _ = c.nc.SetReadDeadline(time.Time{}) }()
	for {
		left := time.Until(until)
		if left <= 0 {
			return true
		}
		if c.w == len(c.buf) {
			return engine.Sleep(ctx, left)
		}
		_ = c.nc.SetReadDeadline(until)
		n, err := c.nc.Read(c.buf[c.w:])
		c.w += n
		switch {
		case err == nil:
		case isTimeout(err):
			return true
		default:
			return false
		}
	}
}
