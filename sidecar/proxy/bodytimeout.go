package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// BodyWindow is how much of a request body must arrive within each body
// timeout: an idle body, or one slower than BodyWindow per timeout, is cut
// off. Both fronts count it the same way.
const BodyWindow = 64 << 10

// ErrBodyTimeout is the error a timed body's Read returns once the body is
// cut off; the net/http front answers it 408.
var ErrBodyTimeout = errors.New("request body not received in time")

type bodyTimeoutError struct{ err error }

func (e bodyTimeoutError) Error() string   { return ErrBodyTimeout.Error() + ": " + e.err.Error() }
func (e bodyTimeoutError) Unwrap() []error { return []error{ErrBodyTimeout, e.err} }

// timedBody is a request body on the net/http front that must arrive
// BodyWindow bytes per timeout: the connection's read deadline is moved
// on at the start and after every BodyWindow bytes, and lifted once the
// body is whole, so that a slow answer from the application is not cut
// off by a deadline meant for the body.
type timedBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	left    int64 // bytes still to come when the length is known, else -1
	window  int64 // bytes still to come before the deadline moves on
	done    bool
	// timedOut is set once the body was cut off for its timeout.
	timedOut bool
}

// timedBodyKey holds a request's *timedBody in its context.
type timedBodyKey struct{}

// bodyTimedOut reports whether r's body, as timeBody wrapped it, was cut
// off for its timeout: the request's context is cancelled then too, so
// the upstream error alone does not tell.
func bodyTimedOut(r *http.Request) bool {
	tb, ok := r.Context().Value(timedBodyKey{}).(*timedBody)
	return ok && tb.timedOut
}

// timeBody returns r with its body timed, for the net/http front; a
// body-less request, or a timeout of 0, is returned as it is.
func timeBody(w http.ResponseWriter, r *http.Request, timeout time.Duration) *http.Request {
	if timeout <= 0 || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return r
	}
	tb := &timedBody{ReadCloser: r.Body, rc: http.NewResponseController(w), timeout: timeout, left: r.ContentLength}
	tb.renew()
	r = r.WithContext(context.WithValue(r.Context(), timedBodyKey{}, tb))
	r.Body = tb
	return r
}

func (b *timedBody) renew() {
	b.window = BodyWindow
	// ErrNotSupported (a front that cannot) leaves the body untimed.
	_ = b.rc.SetReadDeadline(time.Now().Add(b.timeout))
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.done {
		return n, err
	}
	b.window -= int64(n)
	if b.left > 0 {
		b.left -= int64(n)
	}
	switch {
	case errors.Is(err, io.EOF) || err == nil && b.left == 0:
		// Whole: the application may take its time to answer.
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case err != nil:
		// Cut off: net/http would otherwise wait for the rest of the
		// body before answering, with no deadline.
		b.done = true
		_ = b.rc.SetReadDeadline(aLongTimeAgo)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			b.timedOut = true
			err = bodyTimeoutError{err}
		}
	case b.window <= 0:
		b.renew()
	}
	return n, err
}

var aLongTimeAgo = time.Unix(1, 0)
