package harness

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
)

// The floors are the least a Go program can spend per request on this
// machine, measured in the same run as the sidecar and nginx: a server
// that answers every request with a fixed 429, with a goroutine per
// connection on Go's poller (as the sidecar's lean core) or with one raw
// epoll loop (as nginx), and a proxy that passes each request head to the
// backend over a kept connection and relays the answer, with nothing else.
// None of them parses more than it must to find where a message ends.

// floorAnswer is the fixed answer of the answer floors: about the size of
// the sidecar's 429.
var floorAnswer = func() []byte {
	body := `{"type":"https://floodgate.dev/problems/rate-limited","title":"Too Many Requests","status":429,"detail":"rate limit of policy bench, rule hot-denied exceeded","retryAfter":3600}` + "\n"
	return []byte("HTTP/1.1 429 Too Many Requests\r\nCache-Control: no-store\r\nContent-Type: application/problem+json\r\n" +
		"Retry-After: 3600\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

var crlf2 = []byte("\r\n\r\n")

// ServeFloorAnswer answers every request on addr with a fixed 429 until
// ctx ends: from a goroutine per connection, or from one epoll loop when
// epoll is set (Linux only).
func ServeFloorAnswer(ctx context.Context, addr string, epoll bool) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); _ = ln.Close() }()
	if epoll {
		return serveEpollAnswer(ln, ctx.Done())
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return ignoreClosed(err)
		}
		go func() {
			defer func() { _ = c.Close() }()
			buf := make([]byte, 4096)
			n := 0
			for {
				m, err := c.Read(buf[n:])
				if err != nil {
					return
				}
				n += m
				for {
					i := bytes.Index(buf[:n], crlf2)
					if i < 0 {
						break
					}
					if _, err := c.Write(floorAnswer); err != nil {
						return
					}
					n = copy(buf, buf[i+4:n])
				}
				if n == len(buf) {
					return
				}
				runtime.Gosched()
			}
		}()
	}
}

// ServeFloorProxy proxies every request on addr to upstream until ctx
// ends: a goroutine per client connection with its own upstream
// connection, the head passed on in one write and the answer (framed by
// Content-Length) relayed in one write. Requests must have no body.
func ServeFloorProxy(ctx context.Context, addr, upstream string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); _ = ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			return ignoreClosed(err)
		}
		go func() {
			defer func() { _ = c.Close() }()
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				return
			}
			defer func() { _ = up.Close() }()
			in, out := make([]byte, 8192), make([]byte, 8192)
			n, un := 0, 0
			for {
				i := bytes.Index(in[:n], crlf2)
				if i < 0 {
					if n == len(in) {
						return
					}
					m, err := c.Read(in[n:])
					if err != nil {
						return
					}
					n += m
					continue
				}
				if _, err := up.Write(in[:i+4]); err != nil {
					return
				}
				n = copy(in, in[i+4:n])
				// The answer: head, then Content-Length bytes.
				for {
					j := bytes.Index(out[:un], crlf2)
					if j >= 0 {
						end := j + 4 + contentLength(out[:j])
						if end > len(out) {
							return
						}
						if un >= end {
							if _, err := c.Write(out[:end]); err != nil {
								return
							}
							un = copy(out, out[end:un])
							break
						}
					}
					m, err := up.Read(out[un:])
					if err != nil {
						return
					}
					un += m
				}
				runtime.Gosched()
			}
		}()
	}
}

// contentLength finds the Content-Length of a response head, 0 without.
func contentLength(head []byte) int {
	for _, line := range bytes.Split(head, []byte("\r\n")) {
		name, v, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(name, []byte("Content-Length")) {
			n, _ := strconv.Atoi(string(bytes.TrimSpace(v)))
			return n
		}
	}
	return 0
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
