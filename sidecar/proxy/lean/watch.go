package lean

import (
	"context"
	"errors"
	"net"
	"time"

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

// watchClient is the State's WatchClient: while a request waits for a
// delayed slot, it reads the client connection, and a client that goes
// away (EOF or an error) ends the returned context, so that the request
// gives its slot back at once. Bytes the client sends meanwhile (a
// pipelined request) are kept in the request buffer; stop ends the watch.
func (c *conn) watchClient(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	if c.w == len(c.buf) {
		// No room to read into: no watch (the wait still ends).
		return ctx, cancel
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
			cancel()
		}
		done <- result{n, err}
	}()
	return ctx, func() {
		_ = c.nc.SetReadDeadline(aLongTimeAgo)
		res := <-done
		_ = c.nc.SetReadDeadline(time.Time{})
		c.w += res.n
		cancel()
	}
}
