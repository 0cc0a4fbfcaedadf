package proxy

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"time"
)

// BodyWindow is how much of a request body must arrive within each body
// timeout: an idle body, or one slower than BodyWindow per timeout, is cut
// off. Both fronts count it the same way.
const BodyWindow = 64 << 10

// BodyPace is how a request body must arrive, on both fronts: each Window
// bytes of it, and its last part, within Time of the window's start. A
// body that falls behind is cut off with 408.
type BodyPace struct {
	Window int64
	Time   time.Duration
}

// NewBodyPace returns the pace of a body timeout (BodyWindow bytes per
// timeout) and a minimum rate in bytes per second (0 for none). With a
// rate, a window is a second's worth of bytes at the rate, or BodyWindow
// when that is more, and it must arrive at the rate: a body slower than
// the rate over a window is cut off. The timeout still holds when it is
// the stricter of the two (MinUsefulRate).
func NewBodyPace(timeout time.Duration, minRate int64) BodyPace {
	p := BodyPace{Window: BodyWindow, Time: timeout}
	if minRate > 0 {
		w := max(BodyWindow, minRate)
		if t := time.Duration(float64(w) / float64(minRate) * float64(time.Second)); t < timeout {
			p = BodyPace{Window: w, Time: t}
		}
	}
	return p
}

// MinUsefulRate is the lowest minimum body rate, in bytes per second,
// that is stricter than the body timeout alone: BodyWindow per timeout,
// rounded up.
func MinUsefulRate(timeout time.Duration) int64 {
	if timeout <= 0 {
		return 0
	}
	return int64(math.Ceil(BodyWindow / timeout.Seconds()))
}

// ErrBodyTimeout is the error a timed body's Read returns once the body is
// cut off; the net/http front answers it 408.
var ErrBodyTimeout = errors.New("request body not received in time")

type bodyTimeoutError struct{ err error }

func (e bodyTimeoutError) Error() string   { return ErrBodyTimeout.Error() + ": " + e.err.Error() }
func (e bodyTimeoutError) Unwrap() []error { return []error{ErrBodyTimeout, e.err} }

// timedBody is a request body on the net/http front that must arrive at
// its pace: the connection's read deadline is moved on at the start and
// after every window, and lifted once the body is whole, so that a slow
// answer from the application is not cut off by a deadline meant for the
// body.
type timedBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	pace   BodyPace
	left   int64 // bytes still to come when the length is known, else -1
	window int64 // bytes still to come before the deadline moves on
	done   bool
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
// body-less request, or a pace without a time, is returned as it is.
func timeBody(w http.ResponseWriter, r *http.Request, pace BodyPace) *http.Request {
	if pace.Time <= 0 || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return r
	}
	tb := &timedBody{ReadCloser: r.Body, rc: http.NewResponseController(w), pace: pace, left: r.ContentLength}
	tb.renew()
	r = r.WithContext(context.WithValue(r.Context(), timedBodyKey{}, tb))
	r.Body = tb
	return r
}

func (b *timedBody) renew() {
	b.window = b.pace.Window
	// ErrNotSupported (a front that cannot) leaves the body untimed.
	_ = b.rc.SetReadDeadline(time.Now().Add(b.pace.Time))
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
