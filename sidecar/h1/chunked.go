package h1

// Chunked finds the end of a chunked body (RFC 9112 §7.1) in the bytes
// that pass through a proxy, without copying them: chunk sizes, chunk
// extensions, the CRLF after each chunk's data and the trailer section are
// checked on the way. Line endings must be CRLF: a bare LF, which some
// servers accept and others do not, is the classic way to smuggle a
// request past a proxy. The zero value is ready for a new body.
type Chunked struct {
	state  uint8
	digits uint8
	size   int64 // data bytes left in the current chunk
	line   int   // bytes of the current size or trailer line
	trail  int   // bytes of the trailer section
	colon  bool  // the current trailer line has its colon
}

const (
	chSize      uint8 = iota // reading chunk-size hex digits
	chExt                    // reading a chunk extension
	chSizeLF                 // saw CR after the size line
	chData                   // reading chunk data
	chDataCR                 // expecting CR after the data
	chDataLF                 // expecting LF after the data
	chTrailer                // at the start of a trailer line or the final CRLF
	chTrailerIn              // inside a trailer line
	chTrailerLF              // saw CR at the end of a trailer line
	chFinalLF                // saw CR of the final CRLF
	chDone
)

// Limits on the parts of a chunked body that are lines.
const (
	maxChunkLine = 4096
	maxTrailers  = 64 << 10
)

// Reset prepares c for a new body.
func (c *Chunked) Reset() { *c = Chunked{} }

// Done reports whether the body has ended.
func (c *Chunked) Done() bool { return c.state == chDone }

// Scan consumes bytes of the body from p and returns how many belong to
// it: all of p while the body goes on, fewer when it ends inside p (the
// rest is the next message). It returns ErrChunked when the body is
// malformed.
func (c *Chunked) Scan(p []byte) (int, error) {
	i := 0
	for i < len(p) && c.state != chDone {
		if c.state == chData {
			n := int64(len(p) - i)
			if n > c.size {
				n = c.size
			}
			c.size -= n
			i += int(n)
			if c.size == 0 {
				c.state = chDataCR
			}
			continue
		}
		b := p[i]
		i++
		if !c.step(b) {
			return i, ErrChunked
		}
	}
	return i, nil
}

// step consumes one byte outside chunk data; false when it is malformed.
func (c *Chunked) step(b byte) bool {
	switch c.state {
	case chSize:
		return c.sizeByte(b)
	case chExt:
		c.line++
		if c.line > maxChunkLine || (b < ' ' && b != '\t' && b != '\r') || b == 0x7f {
			return false
		}
		if b == '\r' {
			c.state = chSizeLF
		}
	case chSizeLF:
		if b != '\n' {
			return false
		}
		c.line, c.digits = 0, 0
		c.state = chData
		if c.size == 0 {
			c.state = chTrailer
		}
	case chDataCR:
		c.state = chDataLF
		return b == '\r'
	case chDataLF:
		c.state = chSize
		return b == '\n'
	case chTrailer:
		c.trail++
		switch {
		case b == '\r':
			c.state = chFinalLF
		case !isTchar(b):
			// obs-fold, an empty name or a bad character.
			return false
		default:
			c.state, c.line, c.colon = chTrailerIn, 1, false
		}
	case chTrailerIn:
		return c.trailerByte(b)
	case chTrailerLF:
		c.state = chTrailer
		return b == '\n'
	case chFinalLF:
		c.state = chDone
		return b == '\n'
	}
	return true
}

func (c *Chunked) sizeByte(b byte) bool {
	c.line++
	switch {
	case isHex(b):
		if c.digits == 15 {
			return false
		}
		c.digits++
		c.size = c.size<<4 | int64(unhex(b))
	case c.digits == 0:
		return false
	case b == ';' || b == ' ' || b == '\t':
		c.state = chExt
	case b == '\r':
		c.state = chSizeLF
	default:
		return false
	}
	return true
}

func (c *Chunked) trailerByte(b byte) bool {
	c.trail++
	if c.trail > maxTrailers {
		return false
	}
	switch {
	case b == '\r':
		if !c.colon {
			return false
		}
		c.state = chTrailerLF
	case b == ':':
		c.colon = true
	case b < ' ' && b != '\t' || b == 0x7f:
		return false
	}
	return true
}

func isHex(b byte) bool {
	return '0' <= b && b <= '9' || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F'
}

func unhex(b byte) byte {
	switch {
	case b <= '9':
		return b - '0'
	case b <= 'F':
		return b - 'A' + 10
	}
	return b - 'a' + 10
}
