package runner

import (
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/proxy"
)

// lingerListener is the proxy listener. It counts each client connection
// against the budget's cap once, whichever front serves it, and answers
// one past the cap 503 and closes it (proxy.Budget.RefuseConn). Its
// connections read and discard what the client is still sending before
// they close after an error answer, for at most lingerTime and
// lingerBytes: net/http answers 431 to a header block larger than its
// bound and closes, and closing with unread data resets the connection,
// which throws away the answer before the client reads it.
type lingerListener struct {
	net.Listener
	budget *proxy.Budget
}

// Linger bounds.
const (
	lingerTime  = 2 * time.Second
	lingerBytes = 32 << 20
)

// Accept implements net.Listener.
func (l lingerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !l.budget.AcquireConn() {
			l.budget.RefuseConn(c)
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok {
			return &lingerConn{TCPConn: tc, budget: l.budget}, nil
		}
		return &countedConn{Conn: c, budget: l.budget}, nil
	}
}

// lingerConn is a TCP connection that lingers on Close after CloseWrite,
// and leaves the budget's count of connections when it closes. It embeds
// the *net.TCPConn, so that copies to it still splice.
type lingerConn struct {
	*net.TCPConn
	budget     *proxy.Budget
	halfClosed atomic.Bool
	closed     atomic.Bool
}

// CloseWrite implements the half close net/http does before an error
// close (closeWriteAndWait).
func (c *lingerConn) CloseWrite() error {
	c.halfClosed.Store(true)
	return c.TCPConn.CloseWrite()
}

// Close drains what the client still sends after a half close, so that it
// reads the answer, then closes.
func (c *lingerConn) Close() error {
	if c.halfClosed.Load() {
		_ = c.SetReadDeadline(time.Now().Add(lingerTime))
		_, _ = io.CopyN(io.Discard, c.TCPConn, lingerBytes)
	}
	err := c.TCPConn.Close()
	if !c.closed.Swap(true) {
		c.budget.ReleaseConn()
	}
	return err
}

// countedConn is a connection other than TCP that leaves the budget's
// count of connections when it closes.
type countedConn struct {
	net.Conn
	budget *proxy.Budget
	closed atomic.Bool
}

// Close implements net.Conn.
func (c *countedConn) Close() error {
	err := c.Conn.Close()
	if !c.closed.Swap(true) {
		c.budget.ReleaseConn()
	}
	return err
}
