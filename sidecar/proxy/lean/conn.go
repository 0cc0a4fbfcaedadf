package lean

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/h1"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/proxy"
	"github.com/floodgate-dev/floodgate/sidecar/ratelimitheaders"
)

// Connection states, for Shutdown.
const (
	stateActive int32 = iota
	stateIdle
	stateClosed
)

// The buffer sizes: a connection starts with bufSize and grows its
// request buffer up to the head bound when a head needs it; once it has
// waited parkAfter for its next request, it parks (see park) and its
// buffer is back at bufSize.
const (
	bufSize       = proxy.HeadAllowance
	maxRespHead   = 1 << 20
	smallBody     = 2 << 10 // buffered body bytes copied next to the head rather than written by writev
	maxCanonNames = 256
	parkAfter     = time.Second
)

// conn is one client connection.
type conn struct {
	s      *Server
	nc     net.Conn
	remote string
	peer   string // remote's host, as X-Forwarded-For gets it
	state  atomic.Int32
	// idle is its place among the budget's idle connections, while it
	// is parked; evict is closeIfIdle, for the budget.
	idle  proxy.IdleConn
	evict func() bool

	buf  []byte // request bytes; buf[r:w] not yet consumed
	r, w int

	req   h1.Request
	hreq  http.Request
	url   url.URL
	hdr   http.Header
	vals  []string
	canon map[string]string
	st    proxy.State
	// sleepFn is c.sleep, made once: the State's Sleep.
	sleepFn func(context.Context, time.Duration) bool
	chunk   h1.Chunked

	up  *upConn
	out []byte // the head being written; see scratch

	// charged is what the head budget holds for this connection: its
	// request buffer beyond bufSize.
	charged int64
	// parked is set while the connection waits for a request with no
	// more than it needs for that (see park).
	parked bool
	// fresh is set until the client sends its first byte: a new
	// connection waits for its first request no longer than a head may
	// take, as net/http's do.
	fresh bool

	// deadline bookkeeping: what kind of read deadline is set and when it
	// was set for an idle wait.
	dlIdle bool
	dlAt   int64 // the server's second when the idle deadline was set

	// the last deny answer, reused while its values do not change.
	deny     []byte
	denyKey  denyKey
	denyDate *[]byte
}

// denyKey is what a 429 answer depends on besides its rule's constants.
type denyKey struct {
	// rule is the binding rule as the engine sees it, which has every
	// constant of the rule that the answer shows. It is held, so that its
	// address is never another rule's: an allocation of its own, where a
	// *ruleset.Rule, an element of its set's array, would keep every rule
	// of a replaced set alive for as long as the connection lasts.
	rule *engine.Rule
	// fields is the rule's responseHeaders, which decides what of the
	// rest the answer shows. A rule's mode is fixed when the rule is
	// built, so rule implies it today; the key names it all the same, so
	// that an answer built under one mode is never served under another.
	fields              ratelimitheaders.Mode
	limit, reset, retry int64
	closing             bool
}

// upConn is a connection to the application with its read buffer.
type upConn struct {
	nc    net.Conn
	buf   []byte
	r, w  int
	resp  h1.Response
	chunk h1.Chunked
	// headLen is the length of the answer head at buf[r:].
	headLen int
	used    bool // it has carried a request before
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, buf: make([]byte, bufSize), hdr: http.Header{}, canon: map[string]string{}, fresh: true}
	c.sleepFn = c.sleep
	c.remote = nc.RemoteAddr().String()
	c.peer = c.remote
	if host, _, err := net.SplitHostPort(c.remote); err == nil {
		c.peer = host
	}
	c.hreq.Proto, c.hreq.ProtoMajor, c.hreq.ProtoMinor = "HTTP/1.1", 1, 1
	c.hreq.URL = &c.url
	c.hreq.Header = c.hdr
	c.hreq.RemoteAddr = c.remote
	return c
}

// closeIfIdle closes the connection if it waits for a request, and
// reports whether it did.
func (c *conn) closeIfIdle() bool {
	if c.state.CompareAndSwap(stateIdle, stateClosed) {
		_ = c.nc.SetReadDeadline(aLongTimeAgo)
		return true
	}
	return false
}

var aLongTimeAgo = time.Unix(1, 0)

// releaseUp gives the upstream connection back to the pool when it holds
// no unread bytes, and closes it otherwise.
func (c *conn) releaseUp() {
	if c.up == nil {
		return
	}
	if c.up.r == c.up.w {
		c.s.putUp(c.up)
	} else {
		_ = c.up.nc.Close()
	}
	c.up = nil
}

func (c *conn) serve() {
	handedOff := false
	defer func() {
		c.s.o.Budget.Active(&c.idle)
		c.releaseUp()
		if !handedOff {
			_ = c.nc.Close()
		}
		c.s.o.Budget.ReleaseHead(c.charged)
		c.charged = 0
		c.s.forget(c)
	}()
	for {
		n, ok := c.readHead()
		if !ok {
			return
		}
		if c.leaveToNetHTTP() {
			handedOff = c.handoff()
			return
		}
		if !c.serveOne(n) || c.s.closing.Load() {
			return
		}
	}
}

// readHead reads until buf[r:] starts with a complete request head and
// returns its length; false when the connection is to be closed (after
// answering a bad head).
func (c *conn) readHead() (int, bool) {
	partial := false
	for {
		if c.r < c.w {
			n, err := h1.ParseRequest(c.buf[c.r:c.w], &c.req, c.s.o.MaxHeaderBytes)
			if err != nil {
				var he *h1.Error
				if errors.As(err, &he) {
					c.answerError(he.Status, he.Reason)
				}
				return 0, false
			}
			if n > 0 {
				return n, true
			}
		} else {
			c.r, c.w = 0, 0
		}
		// More bytes are needed.
		if c.r > 0 {
			c.w = copy(c.buf, c.buf[c.r:c.w])
			c.r = 0
		}
		if c.w == len(c.buf) && !c.grow() {
			return 0, false
		}
		idle := c.w == 0
		if idle {
			c.state.Store(stateIdle)
			if c.s.closing.Load() {
				return 0, false
			}
			c.idleDeadline()
			// Let the other connections run first: by the time this one
			// reads again its client has often sent the next request,
			// and the read finds it instead of returning EAGAIN and
			// waiting for the poller (a system call saved).
			runtime.Gosched()
		} else if !partial {
			partial = true
			c.dlIdle = false
			_ = c.nc.SetReadDeadline(time.Now().Add(c.s.o.ReadHeaderTimeout))
		}
		m, err := c.nc.Read(c.buf[c.w:])
		if idle && !c.state.CompareAndSwap(stateIdle, stateActive) {
			return 0, false // Shutdown closed it
		}
		c.w += m
		if m > 0 && (c.parked || c.fresh) {
			if c.parked {
				c.s.o.Budget.Active(&c.idle)
			}
			c.parked, c.fresh, c.dlIdle = false, false, false
		}
		if err != nil {
			var ne net.Error
			timeout := errors.As(err, &ne) && ne.Timeout()
			if c.w == 0 && timeout && !c.parked && c.idleTimeout() > parkAfter {
				c.park()
				continue
			}
			if c.w > 0 && timeout {
				c.answerError(http.StatusRequestTimeout, "request head not received in time")
			}
			return 0, false
		}
	}
}

// grow doubles the request buffer, up to the head bound, for a head that
// fills it, charging the head budget for it. False when the connection
// is to be closed: the head is too large (431), or its buffer does not
// fit in the budget (503).
func (c *conn) grow() bool {
	limit := c.s.o.MaxHeaderBytes + 64
	if len(c.buf) >= limit {
		c.answerError(http.StatusRequestHeaderFieldsTooLarge, "request header fields too large")
		return false
	}
	n := min(2*len(c.buf), limit)
	if more := int64(n-bufSize) - c.charged; more > 0 {
		if !c.s.o.Budget.ReserveHead(more) {
			c.s.o.Budget.RefusedHead()
			c.refuse(proxy.DetailHeadBudget)
			return false
		}
		c.charged += more
	}
	nb := make([]byte, n)
	copy(nb, c.buf[:c.w])
	c.buf = nb
	return true
}

// park lets go of what a connection that waits for its next request
// holds beyond its first read buffer, so that idle keep-alive connections
// cost little: the grown request buffer (and its head budget charge), the
// scratch, the upstream connection (back to the server's pool), the
// parsed head and its header map, and the decision's scratch. They are
// taken again, at their first sizes, by the next request. A connection
// parks once it has waited parkAfter (by its idle deadline), and then
// waits the rest of the idle timeout.
func (c *conn) park() {
	c.parked = true
	if len(c.buf) > bufSize {
		c.buf = make([]byte, bufSize)
	}
	c.r, c.w = 0, 0
	c.s.o.Budget.ReleaseHead(c.charged)
	c.charged = 0
	c.out, c.deny, c.denyKey, c.denyDate = nil, nil, denyKey{}, nil
	c.releaseUp()
	if cap(c.req.Fields) > 0 {
		// A head was parsed since the connection last parked.
		c.req = h1.Request{}
		c.hdr, c.vals = http.Header{}, nil
		c.hreq.Header = c.hdr
	}
	if len(c.canon) > 0 {
		c.canon = map[string]string{}
	}
	c.st = proxy.State{}
	c.dlIdle, c.dlAt = true, c.s.second.Load()
	_ = c.nc.SetReadDeadline(time.Now().Add(c.idleTimeout() - parkAfter))
	// Idle for parkAfter already: at the cap on connections, a new one
	// may take its place.
	if c.evict == nil {
		c.evict = c.closeIfIdle
	}
	c.s.o.Budget.Idle(&c.idle, parkAfter, c.evict)
}

// idleTimeout is how long the connection may wait for its next request:
// the idle timeout, or the read header timeout for its first request
// when that is shorter.
func (c *conn) idleTimeout() time.Duration {
	if c.fresh {
		return min(c.s.o.IdleTimeout, c.s.o.ReadHeaderTimeout)
	}
	return c.s.o.IdleTimeout
}

// idleDeadline sets the idle read deadline, at most once a second (by
// the server's once-a-second clock, so a request reads no clock for it):
// parkAfter from now (park), or the idle timeout when that is shorter.
// A new connection's first wait sets it afresh.
func (c *conn) idleDeadline() {
	sec := c.s.second.Load()
	if c.parked || c.dlIdle && c.dlAt == sec {
		// A parked connection keeps the deadline park set.
		return
	}
	c.dlIdle, c.dlAt = true, sec
	_ = c.nc.SetReadDeadline(time.Now().Add(min(parkAfter, c.idleTimeout())))
}

// scratch returns the connection's scratch buffer, empty, for an answer
// or a head to be written.
func (c *conn) scratch() []byte {
	if c.out == nil {
		c.out = make([]byte, 0, bufSize)
	}
	return c.out[:0]
}

// refuse answers 503 at capacity (detail says which bound), and the
// connection closes.
func (c *conn) refuse(detail string) {
	d := proxy.Decision{Outcome: proxy.AtCapacity, Detail: detail}
	c.out = proxy.AppendProblem(c.scratch(), &d, *c.s.date.Load(), true)
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.nc.Write(c.out)
}

// noDeadline lifts the read deadline while a body streams.
func (c *conn) noDeadline() {
	c.dlIdle = false
	_ = c.nc.SetReadDeadline(time.Time{})
}

// leaveToNetHTTP reports whether the request at buf[r:] is one net/http
// serves rather than the lean core.
func (c *conn) leaveToNetHTTP() bool {
	q := &c.req
	return q.Upgrade || q.PRI || q.Minor == 0 || q.OtherExpect || len(q.Target) == 0 || q.Target[0] != '/'
}

// handoff gives the connection, with the bytes read so far, to net/http.
func (c *conn) handoff() bool {
	_ = c.nc.SetReadDeadline(time.Time{})
	prefix := append([]byte(nil), c.buf[c.r:c.w]...)
	return c.s.handoff.give(&prefixConn{Conn: c.nc, prefix: prefix})
}

// request fills the *http.Request the decision reads: method, path,
// query, canonical header map, Host and peer. Its strings alias buf and
// are valid until the next request.
func (c *conn) request() (*http.Request, bool) {
	q := &c.req
	r := &c.hreq
	r.Method = method(q.Method)
	r.Host = str(q.Host)
	c.url.RawQuery = str(q.Query)
	c.url.Path = str(q.Path)
	for _, b := range q.Path {
		if b == '%' {
			p, err := url.PathUnescape(c.url.Path)
			if err != nil {
				return r, false
			}
			c.url.Path = p
			break
		}
	}
	clear(c.hdr)
	vals := c.vals[:0]
	for i := range q.Fields {
		f := &q.Fields[i]
		if c.dropped(f.Name) {
			// Not forwarded, so not decided on (proxy/forwarded.go).
			continue
		}
		name, ok := c.canon[string(f.Name)]
		if !ok {
			name = textproto.CanonicalMIMEHeaderKey(string(f.Name))
			if len(c.canon) < maxCanonNames {
				c.canon[string(f.Name)] = name
			}
		}
		if name == "Host" {
			continue
		}
		v := str(f.Value)
		if old, ok := c.hdr[name]; ok {
			c.hdr[name] = append(old[:len(old):len(old)], v)
			continue
		}
		vals = append(vals, v)
		c.hdr[name] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	if cap(vals) > cap(c.vals) {
		c.vals = vals[:0]
	}
	return r, true
}

// str views b as a string without copying; b must not change while the
// string is in use.
func str(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// method returns the method as a string, without allocating for the
// common ones.
func method(b []byte) string {
	switch string(b) {
	case "GET":
		return http.MethodGet
	case "POST":
		return http.MethodPost
	case "HEAD":
		return http.MethodHead
	case "PUT":
		return http.MethodPut
	case "DELETE":
		return http.MethodDelete
	case "PATCH":
		return http.MethodPatch
	case "OPTIONS":
		return http.MethodOptions
	}
	return string(b)
}

// serveOne serves the request whose head is buf[r:r+n]. It reports
// whether the connection stays open.
func (c *conn) serveOne(n int) bool {
	r, ok := c.request()
	if !ok {
		c.answerError(http.StatusBadRequest, "malformed request target")
		return false
	}
	p := c.s.o.Proxy()
	var d *proxy.Decision
	if p == nil {
		d = &noConfig
	} else {
		c.st.Sleep = c.sleepFn
		d = p.Check(r, &c.st)
	}
	// The connection keeps its State between requests; what the request
	// held of the rules in force goes with it.
	defer c.st.Reset()
	switch d.Outcome {
	case proxy.Pass, proxy.Allowed:
		keep := c.forward(p, d, n)
		d.Finish()
		return keep
	}
	return c.answer(d, n)
}

var noConfig = proxy.Decision{Outcome: proxy.NoConfig}

// answer answers a request that is not proxied, from the last such
// answer when nothing in it changed, in one write. A body the client
// already sent is skipped; one still to come closes the connection.
func (c *conn) answer(d *proxy.Decision, n int) bool {
	closing := c.req.Close || c.s.closing.Load()
	bodyStart := c.r + n
	next := bodyStart
	switch {
	case c.req.Chunked:
		c.chunk.Reset()
		m, err := c.chunk.Scan(c.buf[bodyStart:c.w])
		if err != nil || !c.chunk.Done() {
			closing = true
		}
		next += m
	case c.req.ContentLength > 0:
		if int64(c.w-bodyStart) < c.req.ContentLength {
			closing = true
		}
		next += int(min(c.req.ContentLength, int64(c.w-bodyStart)))
	}
	date := c.s.date.Load()
	var out []byte
	if d.Outcome == proxy.Denied {
		// The prebuilt answer depends on the rule, its mode and these
		// values of its binding only (a deny reports Remaining 0).
		b := &d.Binding
		k := denyKey{rule: d.Rule.Engine, fields: b.Mode, limit: b.Limit,
			reset: ratelimitheaders.CeilSeconds(max(b.ResetAfter, b.RetryAfter), 0),
			retry: b.RetrySeconds(), closing: closing}
		if k != c.denyKey || date != c.denyDate || c.deny == nil {
			c.deny = proxy.AppendProblem(c.deny[:0], d, *date, closing)
			c.denyKey, c.denyDate = k, date
		}
		out = c.deny
	} else {
		c.out = proxy.AppendProblem(c.scratch(), d, *date, closing)
		out = c.out
	}
	c.r = next
	if _, err := c.nc.Write(out); err != nil {
		return false
	}
	return !closing
}

// answerError answers a malformed request and the connection closes.
func (c *conn) answerError(status int, reason string) {
	text := http.StatusText(status)
	b := c.scratch()
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	b = append(b, text...)
	b = append(b, "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(text)+2+len(reason)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, text...)
	b = append(b, ": "...)
	b = append(b, reason...)
	c.out = b
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.nc.Write(b)
}

var errUpstreamHead = errors.New("malformed response from the application")

// forward proxies the request whose head is buf[r:r+n] and relays the
// answer. It reports whether the client connection stays open.
func (c *conn) forward(p *proxy.Proxy, d *proxy.Decision, n int) bool {
	q := &c.req
	head := q.Method[0] == 'H' && string(q.Method) == http.MethodHead
	idempotent := head || string(q.Method) == http.MethodGet || string(q.Method) == http.MethodOptions
	bodyStart := c.r + n

	// The body bytes already read, and what is still to come.
	var inBuf int
	var rest int64 // Content-Length bytes still to read from the client
	chunkDone := true
	switch {
	case q.Chunked:
		c.chunk.Reset()
		m, err := c.chunk.Scan(c.buf[bodyStart:c.w])
		if err != nil {
			c.answerError(http.StatusBadRequest, "malformed chunked body")
			return false
		}
		inBuf, chunkDone = m, c.chunk.Done()
	case q.ContentLength > 0:
		inBuf = int(min(q.ContentLength, int64(c.w-bodyStart)))
		rest = q.ContentLength - int64(inBuf)
	}
	bodyPending := rest > 0 || !chunkDone

	c.out = c.appendRequestHead(c.scratch(), d, bodyPending)
	body := c.buf[bodyStart : bodyStart+inBuf]
	c.r = bodyStart + inBuf

	// The request may be sent again on a fresh connection when a kept
	// connection turns out to be closed and nothing of the answer came:
	// only an idempotent request with its whole body sent.
	replayable := idempotent && !bodyPending
	var up *upConn
	var err error
	for attempt := 0; ; attempt++ {
		up, err = c.upstream(attempt > 0)
		if err == nil {
			err = writeHead(up.nc, c.out, body)
		}
		if err == nil && !bodyPending {
			// The answer cannot be there yet: let the other connections
			// run first, so that the read usually finds it rather than
			// returning EAGAIN and waiting for the poller.
			runtime.Gosched()
			err = c.readResponseHeadWatched(up, d)
		}
		retry := replayable && up != nil && up.used && up.r == up.w && attempt == 0 && !errors.Is(err, errClientGone)
		if err == nil || !retry {
			break
		}
		_ = up.nc.Close()
		c.up = nil
	}
	if err != nil {
		return c.upstreamFailed(p, up, err)
	}
	if bodyPending {
		if q.Expect100 {
			if _, err := c.nc.Write(continueLine); err != nil {
				c.dropUp(up)
				return false
			}
		}
		if err := c.streamBody(up, rest); err != nil {
			var ce clientErr
			if errors.As(err, &ce) {
				c.dropUp(up)
				if isTimeout(ce.error) {
					c.answerError(http.StatusRequestTimeout, "request body not received in time")
				}
				return false
			}
			return c.upstreamFailed(p, up, err)
		}
		if err := c.readResponseHeadWatched(up, d); err != nil {
			return c.upstreamFailed(p, up, err)
		}
	}
	up.used = true
	d.Responded()
	return c.relay(up, d, head)
}

var continueLine = []byte("HTTP/1.1 100 Continue\r\n\r\n")

// clientErr is a failure reading from the client while streaming its
// body.
type clientErr struct{ error }

// upstream returns the connection to the application: the one this
// client connection holds, an idle one, or a new one (fresh forces a new
// one).
func (c *conn) upstream(fresh bool) (*upConn, error) {
	if !fresh {
		if c.up != nil {
			return c.up, nil
		}
		if u := c.s.getUp(); u != nil {
			c.up = u
			return u, nil
		}
	}
	nc, err := c.s.dialer.Dial("tcp", c.s.o.Upstream)
	if err != nil {
		return nil, err
	}
	c.up = &upConn{nc: nc, buf: make([]byte, bufSize)}
	return c.up, nil
}

func (c *conn) dropUp(up *upConn) {
	if up != nil {
		_ = up.nc.Close()
	}
	if c.up == up {
		c.up = nil
	}
}

// upstreamFailed answers 502 when nothing of the answer reached the
// client yet, and closes both connections.
func (c *conn) upstreamFailed(p *proxy.Proxy, up *upConn, err error) bool {
	c.dropUp(up)
	if errors.Is(err, errClientGone) {
		return false // nobody is listening
	}
	if p != nil {
		p.UpstreamFailed(err, string(c.req.Method), string(c.req.Path))
	}
	d := proxy.UpstreamError
	c.out = proxy.AppendProblem(c.scratch(), &d, *c.s.date.Load(), true)
	_, _ = c.nc.Write(c.out)
	return false
}

// writeHead writes head and the body bytes after it in one system call.
func writeHead(nc net.Conn, head, body []byte) error {
	if len(body) == 0 {
		_, err := nc.Write(head)
		return err
	}
	bufs := net.Buffers{head, body}
	_, err := bufs.WriteTo(nc)
	return err
}

// appendRequestHead appends the head sent to the application: the
// request line, the client's fields less the hop-by-hop ones and the
// forwarding ones it may not set, the framing the body was read by
// (Transfer-Encoding: chunked, or Content-Length written from the parsed
// length, never the client's field as sent), and X-Forwarded-For (the client's chain with the peer
// appended), X-Forwarded-Host and X-Forwarded-Proto, as the net/http path
// sends them.
func (c *conn) appendRequestHead(b []byte, d *proxy.Decision, bodyPending bool) []byte {
	q := &c.req
	b = append(b, q.Method...)
	b = append(b, ' ')
	if clean := match.CleanPath(c.url.Path); clean != c.url.Path {
		// The application serves the path the rules matched, as on the
		// net/http path ("/a/../admin" is sent as "/admin").
		u := url.URL{Path: clean, RawQuery: c.url.RawQuery}
		b = append(b, u.RequestURI()...)
	} else {
		b = append(b, q.Target...)
	}
	b = append(b, " HTTP/1.1\r\n"...)
	var xff [][]byte
	for i := range q.Fields {
		f := &q.Fields[i]
		switch {
		case h1.IsHopByHop(f.Name), c.dropped(f.Name):
			continue
		case len(f.Name) == 2 && h1.EqualFold(f.Name, "te"), len(f.Name) == 7 && h1.EqualFold(f.Name, "trailer"):
			continue
		case len(f.Name) == 14 && h1.EqualFold(f.Name, "content-length"):
			// Written below from the length the body was read by.
			continue
		case len(f.Name) == 6 && h1.EqualFold(f.Name, "expect") && bodyPending:
			// The sidecar answers 100 Continue itself once the request
			// is admitted, and then streams the body.
			continue
		case len(f.Name) == 15 && h1.EqualFold(f.Name, "x-forwarded-for"):
			xff = append(xff, f.Value)
			continue
		case len(f.Name) == 16 && h1.EqualFold(f.Name, "x-forwarded-host"),
			len(f.Name) == 17 && h1.EqualFold(f.Name, "x-forwarded-proto"),
			len(f.Name) == 9 && h1.EqualFold(f.Name, "forwarded"):
			continue
		}
		b = append(b, f.Name...)
		b = append(b, ": "...)
		b = append(b, f.Value...)
		b = append(b, "\r\n"...)
	}
	if q.TETrailers {
		b = append(b, "Te: trailers\r\n"...)
	}
	if q.Chunked {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	} else if q.ContentLength >= 0 {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, q.ContentLength, 10)
		b = append(b, "\r\n"...)
	}
	b = append(b, "X-Forwarded-For: "...)
	for _, v := range xff {
		b = append(b, v...)
		b = append(b, ", "...)
	}
	b = append(b, c.peer...)
	b = append(b, "\r\nX-Forwarded-Host: "...)
	b = append(b, q.Host...)
	b = append(b, "\r\nX-Forwarded-Proto: http\r\n\r\n"...)
	_ = d
	return b
}

// dropped reports whether a field is one the application does not get:
// one the Connection field names, or, unless allowed, one with an
// underscore in its name (proxy/forwarded.go).
func (c *conn) dropped(name []byte) bool {
	if len(name) == 10 && h1.EqualFold(name, "connection") {
		return false // read by the checks of its options
	}
	return c.connOption(name) || !c.s.o.AllowUnderscoreHeaders && proxy.UnderscoreName(name)
}

func (c *conn) connOption(name []byte) bool {
	for _, o := range c.req.ConnOptions {
		if len(o) == len(name) && equalFoldBytes(o, name) {
			return true
		}
	}
	return false
}

func equalFoldBytes(a, b []byte) bool {
	for i := range a {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// streamBody sends the rest of the request body: rest Content-Length
// bytes, copied socket to socket, or the rest of a chunked body, checked
// chunk by chunk on the way. With a body timeout, the body must arrive at
// the server's pace: each window within its time.
func (c *conn) streamBody(up *upConn, rest int64) error {
	c.noDeadline()
	pace := c.s.pace
	renew := func() {
		if pace.Time > 0 {
			_ = c.nc.SetReadDeadline(time.Now().Add(pace.Time))
		}
	}
	defer c.noDeadline()
	for rest > 0 {
		renew()
		window := rest
		if pace.Time > 0 {
			window = min(rest, pace.Window)
		}
		n, err := io.CopyN(up.nc, c.nc, window)
		rest -= n
		if err != nil {
			// Only reads from the client have a deadline.
			if n < window && (isReadSide(err, c.nc) || isTimeout(err)) {
				return clientErr{err}
			}
			return err
		}
	}
	if c.req.ContentLength >= 0 && !c.req.Chunked {
		return nil
	}
	// Chunked: whatever follows in buf was scanned already; read on.
	c.r, c.w = 0, 0
	renew()
	got := 0
	for !c.chunk.Done() {
		m, err := c.nc.Read(c.buf)
		if m > 0 {
			k, serr := c.chunk.Scan(c.buf[:m])
			if serr != nil {
				return clientErr{serr}
			}
			if _, err := up.nc.Write(c.buf[:k]); err != nil {
				return err
			}
			c.r, c.w = k, m
			if got += m; pace.Time > 0 && int64(got) >= pace.Window {
				got = 0
				renew()
			}
		}
		if err != nil && !c.chunk.Done() {
			return clientErr{err}
		}
	}
	return nil
}

// isReadSide guesses whether a copy error came from reading src.
func isReadSide(err error, src net.Conn) bool {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Op == "read" || oe.Op == "splice" && oe.Source != nil && oe.Source.String() == src.RemoteAddr().String()
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// readResponseHead reads the application's answer head into up.resp,
// passing interim (1xx) answers other than 100 on to the client.
func (c *conn) readResponseHead(up *upConn, _ bool) error {
	for {
		if up.r < up.w {
			n, err := h1.ParseResponse(up.buf[up.r:up.w], &up.resp, maxRespHead)
			if err != nil {
				return err
			}
			if n > 0 {
				if up.resp.Status >= 200 {
					up.headLen = n
					return nil
				}
				if up.resp.Status == http.StatusSwitchingProtocols {
					return errUpstreamHead
				}
				if up.resp.Status != http.StatusContinue {
					if _, err := c.nc.Write(up.buf[up.r : up.r+n]); err != nil {
						return clientErr{err}
					}
				}
				up.r += n
				continue
			}
		} else {
			up.r, up.w = 0, 0
		}
		if up.r > 0 {
			up.w = copy(up.buf, up.buf[up.r:up.w])
			up.r = 0
		}
		if up.w == len(up.buf) {
			if len(up.buf) >= maxRespHead {
				return errUpstreamHead
			}
			nb := make([]byte, 2*len(up.buf))
			copy(nb, up.buf[:up.w])
			up.buf = nb
		}
		m, err := up.nc.Read(up.buf[up.w:])
		up.w += m
		if err != nil {
			if m > 0 {
				continue
			}
			if errors.Is(err, io.EOF) && up.w > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
}

// relay writes the answer whose head is at up.buf[up.r:] to the client:
// the head less its hop-by-hop fields, plus the rate-limit fields, with
// the body bytes already read in the same write, then the rest of the
// body, spliced when its length is known. It reports whether the client
// connection stays open.
func (c *conn) relay(up *upConn, d *proxy.Decision, head bool) bool {
	rs := &up.resp
	bodyStart := up.r + up.headLen
	avail := up.w - bodyStart
	closing := c.req.Close || c.s.closing.Load()
	var inBuf int
	var rest int64
	chunked, toEOF := false, false
	switch {
	case rs.BodyLess(head):
	case rs.Chunked:
		chunked = true
		up.chunk.Reset()
		m, err := up.chunk.Scan(up.buf[bodyStart:up.w])
		if err != nil {
			return c.upstreamFailed(c.s.o.Proxy(), up, err)
		}
		inBuf = m
	case rs.ContentLength >= 0:
		inBuf = int(min(rs.ContentLength, int64(avail)))
		rest = rs.ContentLength - int64(inBuf)
	default:
		// Delimited by the application closing the connection: so is
		// the answer to the client.
		toEOF, closing = true, true
		inBuf = avail
	}

	b := append(c.scratch(), "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(rs.Status), 10)
	b = append(b, ' ')
	b = append(b, rs.Reason...)
	b = append(b, "\r\n"...)
	for i := range rs.Fields {
		f := &rs.Fields[i]
		if h1.IsHopByHop(f.Name) || respOption(rs, f.Name) {
			continue
		}
		if chunked && len(f.Name) == 14 && h1.EqualFold(f.Name, "content-length") {
			// Chunked wins over a Content-Length, which must not reach
			// the client beside it.
			continue
		}
		b = append(b, f.Name...)
		b = append(b, ": "...)
		b = append(b, f.Value...)
		b = append(b, "\r\n"...)
	}
	if chunked {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	b = proxy.AppendFields(b, d)
	if closing {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	body := up.buf[bodyStart : bodyStart+inBuf]
	up.r = bodyStart + inBuf
	var err error
	if len(body) <= smallBody {
		b = append(b, body...)
		_, err = c.nc.Write(b)
	} else {
		err = writeHead(c.nc, b, body)
	}
	c.out = b
	if err != nil {
		c.dropUp(up)
		return false
	}
	switch {
	case rest > 0:
		if _, err := io.CopyN(c.nc, up.nc, rest); err != nil {
			c.dropUp(up)
			return false
		}
	case chunked && !up.chunk.Done():
		up.r, up.w = 0, 0
		for !up.chunk.Done() {
			m, rerr := up.nc.Read(up.buf)
			if m > 0 {
				k, serr := up.chunk.Scan(up.buf[:m])
				if _, werr := c.nc.Write(up.buf[:k]); werr != nil || serr != nil {
					c.dropUp(up)
					return false
				}
				up.r, up.w = k, m
			}
			if rerr != nil && !up.chunk.Done() {
				c.dropUp(up)
				return false
			}
		}
	case toEOF:
		_, _ = io.Copy(c.nc, up.nc)
		c.dropUp(up)
		return false
	}
	if rs.Close || up.r != up.w {
		c.dropUp(up)
	}
	return !closing
}

func respOption(rs *h1.Response, name []byte) bool {
	for _, o := range rs.ConnOptions {
		if len(o) == len(name) && equalFoldBytes(o, name) {
			return true
		}
	}
	return false
}
