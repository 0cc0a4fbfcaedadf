package redisstore

import (
	"bufio"
	"errors"
	"fmt"
	"strconv"
)

// The pipelined connections speak RESP2 themselves: the commands are
// appended to a reused buffer, and the replies the scripts give (an array
// of four integers) are read without allocating. Other replies are read
// whole, so that the stream stays in step, and reported by type.

// replyError is an error reply from the server, such as "NOSCRIPT No
// matching script" or "MOVED 3999 127.0.0.1:6381".
type replyError string

func (e replyError) Error() string { return string(e) }

// arrayHeader starts a RESP array of n elements.
func arrayHeader(n int) []byte {
	b := strconv.AppendInt([]byte{'*'}, int64(n), 10)
	return append(b, '\r', '\n')
}

func appendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

func appendBulkInt(b []byte, v int64) []byte {
	var tmp [20]byte
	d := strconv.AppendInt(tmp[:0], v, 10)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(d)), 10)
	b = append(b, '\r', '\n')
	b = append(b, d...)
	return append(b, '\r', '\n')
}

// maxBulkReply bounds a bulk string or array the reader accepts; the
// store's commands never get anything near it.
const maxBulkReply = 1 << 20

// errProtocol marks a reply that is not RESP2.
var errProtocol = errors.New("redis protocol error")

// readLine returns the next line without its CRLF. The slice is valid until
// the next read.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: line longer than %d bytes", errProtocol, r.Size())
		}
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: malformed line %q", errProtocol, line)
	}
	return line[:len(line)-2], nil
}

// parseInt parses a RESP integer without allocating.
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) == 0 {
			return 0, false
		}
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// readScriptReply reads one reply. A script's answer, an array of four
// integers, comes back in vals with res nil; an error reply is a
// replyError in err; anything else is read whole and returned in res (as
// readValue would give it) for the caller to reject. A transport or
// protocol error is returned as err, not wrapped as a replyError.
func readScriptReply(r *bufio.Reader) (vals [4]int64, res any, err error) {
	line, err := readLine(r)
	if err != nil {
		return vals, nil, err
	}
	if line[0] == '*' {
		if n, ok := parseInt(line[1:]); ok && n == 4 {
			// The fast path; an element that is not an integer is read
			// on as a generic value.
			for i := range vals {
				el, err := readLine(r)
				if err != nil {
					return vals, nil, err
				}
				if el[0] == ':' {
					if v, ok := parseInt(el[1:]); ok {
						vals[i] = v
						continue
					}
				}
				// Rebuild the array read so far plus the rest.
				arr := make([]any, 4)
				for j := range i {
					arr[j] = vals[j]
				}
				v, err := valueOf(r, el)
				if err != nil {
					return vals, nil, err
				}
				arr[i] = v
				for j := i + 1; j < 4; j++ {
					if arr[j], err = readValue(r); err != nil {
						return vals, nil, err
					}
				}
				return vals, arr, nil
			}
			return vals, nil, nil
		}
	}
	v, err := valueOf(r, line)
	if err != nil {
		return vals, nil, err
	}
	if re, ok := v.(replyError); ok {
		return vals, nil, re
	}
	if v == nil {
		// A nil reply is a value the caller rejects, not "no value".
		return vals, nilReply{}, nil
	}
	return vals, v, nil
}

// nilReply stands for a RESP nil where a value is expected.
type nilReply struct{}

func (nilReply) String() string { return "nil" }

// readValue reads one whole reply: int64, string, []any, nil, or
// replyError (errors nested in arrays are values too).
func readValue(r *bufio.Reader) (any, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	return valueOf(r, line)
}

func valueOf(r *bufio.Reader, line []byte) (any, error) {
	switch line[0] {
	case '+':
		return string(line[1:]), nil
	case '-':
		return replyError(line[1:]), nil
	case ':':
		v, ok := parseInt(line[1:])
		if !ok {
			return nil, fmt.Errorf("%w: bad integer %q", errProtocol, line)
		}
		return v, nil
	case '$':
		n, ok := parseInt(line[1:])
		if !ok || n < -1 || n > maxBulkReply {
			return nil, fmt.Errorf("%w: bad bulk length %q", errProtocol, line)
		}
		if n == -1 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := readFull(r, buf); err != nil {
			return nil, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return nil, fmt.Errorf("%w: bulk string without CRLF", errProtocol)
		}
		return string(buf[:n]), nil
	case '*':
		n, ok := parseInt(line[1:])
		if !ok || n < -1 || n > maxBulkReply {
			return nil, fmt.Errorf("%w: bad array length %q", errProtocol, line)
		}
		if n == -1 {
			return nil, nil
		}
		arr := make([]any, n)
		for i := range arr {
			v, err := readValue(r)
			if err != nil {
				return nil, err
			}
			arr[i] = v
		}
		return arr, nil
	}
	return nil, fmt.Errorf("%w: unexpected reply %q", errProtocol, line)
}

func readFull(r *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
