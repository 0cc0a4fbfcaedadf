package harness

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Client is the load generator's HTTP/1.1 client: keep-alive connections
// over real sockets, a prebuilt request line and headers appended into a
// reused buffer, and a response parser that reads the status, the framing
// headers and the body without allocating. net/http's client costs several
// times the CPU of the server it measures and allocates kilobytes per
// request; on a machine where the generator shares a core with the
// backend, that cost and its garbage collections showed up in the
// percentiles of both paths.
//
// A Client is safe for concurrent use. Each request takes an idle
// connection to its host (the most recently used first) or dials one.
type Client struct {
	mu    sync.Mutex
	idle  map[string][]*conn
	conns int
	// Timeout bounds each request: dial, write and the whole response.
	Timeout time.Duration
}

// NewClient returns a client whose requests time out after 10s.
func NewClient() *Client {
	return &Client{idle: map[string][]*conn{}, Timeout: 10 * time.Second}
}

// Conns is the number of connections the client has dialled.
func (c *Client) Conns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conns
}

// CloseIdle closes the idle connections.
func (c *Client) CloseIdle() {
	c.mu.Lock()
	idle := c.idle
	c.idle = map[string][]*conn{}
	c.mu.Unlock()
	for _, cs := range idle {
		for _, cn := range cs {
			_ = cn.nc.Close()
		}
	}
}

type conn struct {
	nc  net.Conn
	br  *bufio.Reader
	buf []byte // request being written
}

func (c *Client) get(addr string) (*conn, error) {
	c.mu.Lock()
	if cs := c.idle[addr]; len(cs) > 0 {
		cn := cs[len(cs)-1]
		c.idle[addr] = cs[:len(cs)-1]
		c.mu.Unlock()
		return cn, nil
	}
	c.conns++
	c.mu.Unlock()
	nc, err := net.DialTimeout("tcp", addr, c.Timeout)
	if err != nil {
		return nil, err
	}
	return &conn{nc: nc, br: bufio.NewReaderSize(nc, 8<<10), buf: make([]byte, 0, 512)}, nil
}

func (c *Client) put(addr string, cn *conn) {
	c.mu.Lock()
	c.idle[addr] = append(c.idle[addr], cn)
	c.mu.Unlock()
}

// endpoint is a parsed target URL: the address to dial and the request
// line and Host header to send.
type endpoint struct {
	addr string
	head []byte // "GET <path> HTTP/1.1\r\nHost: <host>\r\n"
}

func parseEndpoint(raw string) (endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return endpoint{}, err
	}
	if u.Scheme != "http" || u.Host == "" {
		return endpoint{}, fmt.Errorf("target %q: want http://host:port/path", raw)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	path := u.RequestURI()
	return endpoint{addr: addr, head: fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\n", path, u.Host)}, nil
}

// do sends one GET to ep with the extra header lines hdr (each ending in
// CRLF) and returns the response status.
func (c *Client) do(ep endpoint, hdr func(dst []byte) []byte) (int, error) {
	cn, err := c.get(ep.addr)
	if err != nil {
		return 0, err
	}
	status, keep, err := cn.roundTrip(ep, hdr, c.Timeout)
	if err != nil || !keep {
		_ = cn.nc.Close()
		return status, err
	}
	c.put(ep.addr, cn)
	return status, nil
}

func (cn *conn) roundTrip(ep endpoint, hdr func([]byte) []byte, timeout time.Duration) (status int, keep bool, err error) {
	if err := cn.nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return 0, false, err
	}
	b := append(cn.buf[:0], ep.head...)
	if hdr != nil {
		b = hdr(b)
	}
	b = append(b, "\r\n"...)
	cn.buf = b
	if _, err := cn.nc.Write(b); err != nil {
		return 0, false, err
	}
	return readResponse(cn.br)
}

var errMalformed = errors.New("malformed HTTP response")

// readResponse reads one HTTP/1.1 response from br and discards its body.
// keep is false when the server will close the connection.
func readResponse(br *bufio.Reader) (status int, keep bool, err error) {
	line, err := readLine(br)
	if err != nil {
		return 0, false, err
	}
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformed, line)
	}
	length, chunked := int64(-1), false
	keep = line[7] == '1'
	for {
		line, err := readLine(br)
		if err != nil {
			return status, false, err
		}
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return status, false, fmt.Errorf("%w: header %q", errMalformed, line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 {
				return status, false, fmt.Errorf("%w: Content-Length %q", errMalformed, value)
			}
			length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			if bytes.EqualFold(value, []byte("close")) {
				keep = false
			}
		}
	}
	switch {
	case status/100 == 1 || status == 204 || status == 304:
		// No body.
	case chunked:
		if err := discardChunked(br); err != nil {
			return status, false, err
		}
	case length >= 0:
		if _, err := br.Discard(int(length)); err != nil {
			return status, false, err
		}
	default:
		// Delimited by the end of the connection.
		_, err := io.Copy(io.Discard, br)
		return status, false, err
	}
	return status, keep, nil
}

func discardChunked(br *bufio.Reader) error {
	for {
		line, err := readLine(br)
		if err != nil {
			return err
		}
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i]
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%w: chunk size %q", errMalformed, line)
		}
		if n == 0 {
			// Trailers, then the final blank line.
			for {
				line, err := readLine(br)
				if err != nil {
					return err
				}
				if len(line) == 0 {
					return nil
				}
			}
		}
		if _, err := br.Discard(int(n)); err != nil {
			return err
		}
		if line, err := readLine(br); err != nil || len(line) != 0 {
			return fmt.Errorf("%w: chunk not followed by CRLF", errMalformed)
		}
	}
}

// readLine returns the next line without its CRLF; the slice is valid until
// the next read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: line longer than %d bytes", errMalformed, br.Size())
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}
