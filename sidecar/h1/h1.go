// Package h1 parses HTTP/1.1 message heads without allocating: request and
// response heads are read in place, their fields left as slices of the
// caller's buffer, and the framing a proxy needs (Content-Length,
// Transfer-Encoding: chunked, Connection, Expect, Upgrade, Host) is
// decided while parsing. It also scans chunked bodies, so that a proxy can
// pass them through and know where each one ends.
//
// The parser is strict where a lenient one lets requests be smuggled past
// a proxy (RFC 9112 §6.3, §11.2): Content-Length together with
// Transfer-Encoding, two different Content-Lengths, obs-fold continuation
// lines, whitespace between a field name and its colon, control characters
// in a field value and a bare CR are all rejected with 400, and a head
// longer than the caller's bound is rejected with 431. A Transfer-Encoding
// other than chunked is 501.
package h1

import (
	"bytes"
	"errors"
)

// Field is one header field. Name and Value alias the parsed buffer; the
// value has its surrounding whitespace removed.
type Field struct {
	Name, Value []byte
}

// Error is a malformed or unacceptable message head: Status is the answer
// a server gives it (400, 431, 501 or 505).
type Error struct {
	Status int
	Reason string
}

// Error implements error.
func (e *Error) Error() string { return e.Reason }

func bad(reason string) *Error { return &Error{Status: 400, Reason: reason} }

// The errors ParseRequest returns for well-known problems; a caller
// compares Status rather than identity.
var (
	errTooLarge     = &Error{Status: 431, Reason: "request header fields too large"}
	errVersion      = &Error{Status: 505, Reason: "HTTP version not supported"}
	errTE           = &Error{Status: 501, Reason: "unsupported transfer encoding"}
	errRequestLine  = bad("malformed request line")
	errMethod       = bad("malformed method")
	errTarget       = bad("malformed request target")
	errFragment     = bad("a fragment (#) in the request target")
	errFieldName    = bad("malformed header field name")
	errFieldValue   = bad("malformed header field value")
	errObsFold      = bad("obsolete line folding in a header field")
	errBareCR       = bad("bare CR in the message head")
	errCLTE         = bad("both Content-Length and Transfer-Encoding")
	errCL           = bad("malformed Content-Length")
	errCLDup        = bad("conflicting Content-Length fields")
	errHost         = bad("missing or malformed Host")
	errHostDup      = bad("more than one Host field")
	errStatusLine   = bad("malformed status line")
	errResponseHead = bad("response head too large")
)

// ErrIncomplete is not returned: a head still arriving is reported as n ==
// 0 with a nil error, so that the hot path compares no errors.

// Request is a parsed request head. Every slice aliases the buffer given
// to ParseRequest and is valid until that buffer is reused.
type Request struct {
	Method []byte
	// Target is the request-target as sent; Path and Query are its parts
	// before and after the first '?'.
	Target, Path, Query []byte
	// Minor is the HTTP/1.x minor version: 0 or 1. PRI is true for the
	// HTTP/2 connection preface "PRI * HTTP/2.0".
	Minor int
	PRI   bool
	// Fields are the header fields in order.
	Fields []Field
	// Host is the Host field's value.
	Host []byte
	// ContentLength is the body's length, -1 when there is no
	// Content-Length field; Chunked is Transfer-Encoding: chunked.
	ContentLength int64
	Chunked       bool
	// Close is Connection: close (or HTTP/1.0 without keep-alive).
	Close bool
	// Upgrade is an Upgrade field or a Connection: upgrade option.
	Upgrade bool
	// Expect100 is Expect: 100-continue; OtherExpect any other Expect.
	Expect100, OtherExpect bool
	// TETrailers is TE: trailers, which a proxy forwards.
	TETrailers bool
	// ConnOptions are the Connection field's other options: the names of
	// further hop-by-hop fields.
	ConnOptions [][]byte
}

// HasBody reports whether a body follows the head.
func (r *Request) HasBody() bool { return r.Chunked || r.ContentLength > 0 }

func (r *Request) reset() {
	fields, opts := r.Fields[:0], r.ConnOptions[:0]
	*r = Request{Fields: fields, ConnOptions: opts, ContentLength: -1}
}

// ParseRequest parses the request head at the start of b, at most max
// bytes long (counted from the request line to the blank line that ends
// the head, both included; empty lines before the request line are
// skipped and not counted). It returns the head's length in b, or 0 with
// a nil error when b holds only part of a head that may still fit. An
// error is an *Error.
func ParseRequest(b []byte, r *Request, max int) (int, error) {
	r.reset()
	start := 0
	for start < len(b) && (b[start] == '\r' || b[start] == '\n') {
		if b[start] == '\r' && (start+1 >= len(b) || b[start+1] != '\n') {
			if start+1 >= len(b) {
				return 0, nil
			}
			return 0, errBareCR
		}
		start++
	}
	end := headEnd(b[start:])
	if end < 0 {
		if len(b)-start > max {
			return 0, errTooLarge
		}
		return 0, nil
	}
	if end > max {
		return 0, errTooLarge
	}
	head := b[start : start+end]
	line, rest := nextLine(head)
	if err := r.requestLine(line); err != nil {
		return 0, err
	}
	if err := parseFields(rest, &r.Fields); err != nil {
		return 0, err
	}
	if err := r.framing(); err != nil {
		return 0, err
	}
	return start + end, nil
}

// headEnd returns the length of the head at the start of b, through the
// blank line that ends it, or -1.
func headEnd(b []byte) int {
	i := 0
	for {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		i += j + 1
		// The line just ended at i-1; a blank line follows when the next
		// bytes are "\n" or "\r\n".
		if i < len(b) && b[i] == '\n' {
			return i + 1
		}
		if i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n' {
			return i + 2
		}
		if i >= len(b) || (i+1 >= len(b) && b[i] == '\r') {
			return -1
		}
	}
}

// nextLine splits off the first line of b, without its line ending.
func nextLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return b, nil
	}
	line, rest = b[:i], b[i+1:]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, rest
}

func (r *Request) requestLine(line []byte) error {
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return errRequestLine
	}
	r.Method = line[:sp]
	for _, c := range r.Method {
		if !isTchar(c) {
			return errMethod
		}
	}
	line = line[sp+1:]
	sp = bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return errRequestLine
	}
	r.Target = line[:sp]
	for _, c := range r.Target {
		if c <= ' ' || c == 0x7f {
			return errTarget
		}
		if c == '#' {
			// A request-target has no fragment (RFC 9112 §3.2): servers
			// that cut it off route "/admin#x" as "/admin".
			return errFragment
		}
	}
	r.Path, r.Query = r.Target, nil
	if q := bytes.IndexByte(r.Target, '?'); q >= 0 {
		r.Path, r.Query = r.Target[:q], r.Target[q+1:]
	}
	v := line[sp+1:]
	switch {
	case string(v) == "HTTP/1.1":
		r.Minor = 1
	case string(v) == "HTTP/1.0":
		r.Minor = 0
		r.Close = true
	case string(v) == "HTTP/2.0" && string(r.Method) == "PRI" && string(r.Target) == "*":
		r.PRI = true
	case len(v) == 8 && string(v[:5]) == "HTTP/" && isDigit(v[5]) && v[6] == '.' && isDigit(v[7]):
		return errVersion
	default:
		return errRequestLine
	}
	return nil
}

// parseFields parses header field lines (and the blank line after them)
// into fields.
func parseFields(b []byte, fields *[]Field) error {
	for len(b) > 0 {
		var line []byte
		line, b = nextLine(b)
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return errObsFold
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return errFieldName
		}
		name := line[:colon]
		for _, c := range name {
			if !isTchar(c) {
				return errFieldName
			}
		}
		v := line[colon+1:]
		for _, c := range v {
			if c < ' ' && c != '\t' || c == 0x7f {
				if c == '\r' {
					return errBareCR
				}
				return errFieldValue
			}
		}
		*fields = append(*fields, Field{Name: name, Value: trimOWS(v)})
	}
	return nil
}

// framing reads the fields that decide how the request is framed and
// forwarded.
func (r *Request) framing() error {
	hosts, te := 0, 0
	for i := range r.Fields {
		f := &r.Fields[i]
		switch len(f.Name) {
		case 4:
			if equalFold(f.Name, "host") {
				hosts++
				r.Host = f.Value
			}
		case 2:
			if equalFold(f.Name, "te") && hasToken(f.Value, "trailers") {
				r.TETrailers = true
			}
		case 6:
			if equalFold(f.Name, "expect") {
				if equalFold(f.Value, "100-continue") {
					r.Expect100 = true
				} else {
					r.OtherExpect = true
				}
			}
		case 7:
			if equalFold(f.Name, "upgrade") {
				r.Upgrade = true
			}
		case 10:
			if equalFold(f.Name, "connection") {
				r.connection(f.Value)
			}
		case 14:
			if equalFold(f.Name, "content-length") {
				n, ok := parseLength(f.Value)
				if !ok {
					return errCL
				}
				if r.ContentLength >= 0 && r.ContentLength != n {
					return errCLDup
				}
				r.ContentLength = n
			}
		case 17:
			if equalFold(f.Name, "transfer-encoding") {
				te++
				if te > 1 || !equalFold(f.Value, "chunked") {
					return errTE
				}
				r.Chunked = true
			}
		}
	}
	if r.Chunked && r.ContentLength >= 0 {
		return errCLTE
	}
	if hosts > 1 {
		return errHostDup
	}
	if r.PRI {
		return nil
	}
	if hosts == 0 && r.Minor == 1 {
		return errHost
	}
	for _, c := range r.Host {
		if !isHostChar(c) {
			return errHost
		}
	}
	return nil
}

func (r *Request) connection(v []byte) {
	for len(v) > 0 {
		var tok []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = trimOWS(v[:i]), v[i+1:]
		} else {
			tok, v = trimOWS(v), nil
		}
		switch {
		case len(tok) == 0:
		case equalFold(tok, "close"):
			r.Close = true
		case equalFold(tok, "keep-alive"):
			if r.Minor == 0 {
				r.Close = false
			}
		case equalFold(tok, "upgrade"):
			r.Upgrade = true
		default:
			r.ConnOptions = append(r.ConnOptions, tok)
		}
	}
}

// Response is a parsed response head; its slices alias the parsed buffer.
type Response struct {
	Status int
	Minor  int
	// Reason is the status line's reason phrase.
	Reason []byte
	Fields []Field
	// ContentLength is -1 without a Content-Length field.
	ContentLength int64
	Chunked       bool
	// Close is Connection: close, or HTTP/1.0 without keep-alive: the
	// server ends the connection after this response.
	Close bool
	// ConnOptions name further hop-by-hop fields.
	ConnOptions [][]byte
}

// ParseResponse parses the response head at the start of b, at most max
// bytes long. It returns the head's length, or 0 with a nil error when the
// head is still arriving.
func ParseResponse(b []byte, r *Response, max int) (int, error) {
	fields, opts := r.Fields[:0], r.ConnOptions[:0]
	*r = Response{Fields: fields, ConnOptions: opts, ContentLength: -1}
	end := headEnd(b)
	if end < 0 {
		if len(b) > max {
			return 0, errResponseHead
		}
		return 0, nil
	}
	line, rest := nextLine(b[:end])
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || (line[7] != '0' && line[7] != '1') || line[8] != ' ' ||
		!isDigit(line[9]) || !isDigit(line[10]) || !isDigit(line[11]) || (len(line) > 12 && line[12] != ' ') {
		return 0, errStatusLine
	}
	r.Minor = int(line[7] - '0')
	r.Status = int(line[9]-'0')*100 + int(line[10]-'0')*10 + int(line[11]-'0')
	if len(line) > 13 {
		r.Reason = line[13:]
	}
	r.Close = r.Minor == 0
	if err := parseFields(rest, &r.Fields); err != nil {
		return 0, err
	}
	for i := range r.Fields {
		f := &r.Fields[i]
		switch {
		case equalFold(f.Name, "content-length"):
			n, ok := parseLength(f.Value)
			if !ok || (r.ContentLength >= 0 && r.ContentLength != n) {
				return 0, errCL
			}
			r.ContentLength = n
		case equalFold(f.Name, "transfer-encoding"):
			// A response's last coding decides; anything ending in
			// chunked is chunked, anything else runs to the close.
			r.Chunked = hasLastToken(f.Value, "chunked")
			if !r.Chunked {
				r.Close = true
			}
		case equalFold(f.Name, "connection"):
			var q Request
			q.Minor = r.Minor
			q.Close = r.Close
			q.ConnOptions = r.ConnOptions
			q.connection(f.Value)
			r.Close, r.ConnOptions = q.Close, q.ConnOptions
		}
	}
	if r.Chunked {
		r.ContentLength = -1
	}
	return end, nil
}

// BodyLess reports whether a response to a request with this method
// carries no body whatever its fields say: 1xx, 204, 304 and any answer
// to HEAD.
func (r *Response) BodyLess(head bool) bool {
	return head || r.Status < 200 || r.Status == 204 || r.Status == 304
}

// IsHopByHop reports whether a field named name is hop-by-hop (RFC 9110
// §7.6.1) and never forwarded. TE and Trailer are left to the caller.
func IsHopByHop(name []byte) bool {
	switch len(name) {
	case 7:
		return equalFold(name, "upgrade")
	case 10:
		return equalFold(name, "connection") || equalFold(name, "keep-alive")
	case 16:
		return equalFold(name, "proxy-connection")
	case 17:
		return equalFold(name, "transfer-encoding")
	case 18:
		return equalFold(name, "proxy-authenticate")
	case 19:
		return equalFold(name, "proxy-authorization")
	}
	return false
}

// EqualFold reports whether b equals the lower-case ASCII s, ignoring
// case.
func EqualFold(b []byte, lower string) bool { return equalFold(b, lower) }

func equalFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

func hasToken(v []byte, lower string) bool {
	for len(v) > 0 {
		var tok []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			tok, v = v, nil
		}
		if equalFold(trimOWS(tok), lower) {
			return true
		}
	}
	return false
}

func hasLastToken(v []byte, lower string) bool {
	if i := bytes.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	return equalFold(trimOWS(v), lower)
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// parseLength reads a Content-Length: digits only, at most 18 of them.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// tchar is RFC 9110's token character set.
var tchar = [256]bool{}

// hostChar is what a Host value may hold: reg-name, IP literals and port.
var hostChar = [256]bool{}

func init() {
	for c := '0'; c <= '9'; c++ {
		tchar[c], hostChar[c] = true, true
	}
	for c := 'a'; c <= 'z'; c++ {
		tchar[c], hostChar[c] = true, true
		tchar[c-32], hostChar[c-32] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		tchar[c] = true
	}
	for _, c := range "-._~!$&'()*+,;=:[]%@" {
		hostChar[c] = true
	}
}

func isTchar(c byte) bool    { return tchar[c] }
func isHostChar(c byte) bool { return hostChar[c] }

// ErrChunked is a malformed chunked body.
var ErrChunked = errors.New("malformed chunked body")
