// Package resp is the subset of RESP2, the Redis protocol, that the counter
// store speaks: commands are appended to a reused buffer, the replies the
// scripts give (an array of four integers) are read without allocating,
// and any other reply is read whole, so that the stream stays in step, and
// reported by type. Classify tells what an error reply means for the
// command that got it.
//
// The package does no I/O of its own: it reads from a bufio.Reader and
// appends to byte slices. Its functions are safe for concurrent use on
// distinct readers and buffers.
package resp

import (
	"bufio"
	"errors"
	"fmt"
	"strconv"
)

// Error is an error reply from the server, such as "NOSCRIPT No matching
// script." or "MOVED 3999 127.0.0.1:6381".
type Error string

func (e Error) Error() string { return string(e) }

// Nil stands for a RESP nil where a value is expected: ReadScriptReply
// returns it so that "no value" and "a nil value" differ.
type Nil struct{}

func (Nil) String() string { return "nil" }

// ErrProtocol marks a reply that is not RESP2.
var ErrProtocol = errors.New("redis protocol error")

// MaxBulk bounds a bulk string or array the reader accepts; the store's
// commands never get anything near it.
const MaxBulk = 1 << 20

// AppendArray appends the header of an array of n elements: a command of
// n arguments starts with it.
func AppendArray(b []byte, n int) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// AppendBulk appends s as a bulk string.
func AppendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

// AppendBulkInt appends v in decimal as a bulk string, without allocating.
func AppendBulkInt(b []byte, v int64) []byte {
	var tmp [20]byte
	d := strconv.AppendInt(tmp[:0], v, 10)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(d)), 10)
	b = append(b, '\r', '\n')
	b = append(b, d...)
	return append(b, '\r', '\n')
}

// Command returns a whole command of the given arguments.
func Command(args ...string) []byte {
	b := AppendArray(nil, len(args))
	for _, a := range args {
		b = AppendBulk(b, a)
	}
	return b
}

// readLine returns the next line without its CRLF. The slice is valid until
// the next read.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrProtocol, r.Size())
		}
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: malformed line %q", ErrProtocol, line)
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

// ReadScriptReply reads one reply. A script's answer, an array of four
// integers, comes back in vals with res nil; an error reply is an Error in
// err; anything else is read whole and returned in res (as ReadValue would
// give it, with Nil for a nil) for the caller to reject. A transport or
// protocol error is returned as err, never as an Error.
func ReadScriptReply(r *bufio.Reader) (vals [4]int64, res any, err error) {
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
				arr, err := readRest(r, vals, i, el)
				if err != nil {
					return vals, nil, err
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
	if re, ok := v.(Error); ok {
		return vals, nil, re
	}
	if v == nil {
		// A nil reply is a value the caller rejects, not "no value".
		return vals, Nil{}, nil
	}
	return vals, v, nil
}

// readRest reads the rest of a four-element array whose element i, el, is
// not an integer, and returns the array whole: vals holds the elements
// before i.
func readRest(r *bufio.Reader, vals [4]int64, i int, el []byte) ([]any, error) {
	arr := make([]any, 4)
	for j := range i {
		arr[j] = vals[j]
	}
	v, err := valueOf(r, el)
	if err != nil {
		return nil, err
	}
	arr[i] = v
	for j := i + 1; j < 4; j++ {
		if arr[j], err = ReadValue(r); err != nil {
			return nil, err
		}
	}
	return arr, nil
}

// ReadValue reads one whole reply: int64, string, []any, nil, or Error
// (errors nested in arrays are values too).
func ReadValue(r *bufio.Reader) (any, error) {
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
		return Error(line[1:]), nil
	case ':':
		v, ok := parseInt(line[1:])
		if !ok {
			return nil, fmt.Errorf("%w: bad integer %q", ErrProtocol, line)
		}
		return v, nil
	case '$':
		n, ok := parseInt(line[1:])
		if !ok || n < -1 || n > MaxBulk {
			return nil, fmt.Errorf("%w: bad bulk length %q", ErrProtocol, line)
		}
		if n == -1 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := readFull(r, buf); err != nil {
			return nil, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return nil, fmt.Errorf("%w: bulk string without CRLF", ErrProtocol)
		}
		return string(buf[:n]), nil
	case '*':
		n, ok := parseInt(line[1:])
		if !ok || n < -1 || n > MaxBulk {
			return nil, fmt.Errorf("%w: bad array length %q", ErrProtocol, line)
		}
		if n == -1 {
			return nil, nil
		}
		arr := make([]any, n)
		for i := range arr {
			v, err := ReadValue(r)
			if err != nil {
				return nil, err
			}
			arr[i] = v
		}
		return arr, nil
	}
	return nil, fmt.Errorf("%w: unexpected reply %q", ErrProtocol, line)
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
