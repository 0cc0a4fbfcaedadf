package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxRetries = 4
	DefaultMaxWait    = 30 * time.Second
	DefaultBaseDelay  = 100 * time.Millisecond
	DefaultMaxDelay   = 10 * time.Second
	DefaultMaxJitter  = 5 * time.Second
)

// Options configure a Transport. The zero value is usable: retries on,
// pacing off.
type Options struct {
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// MaxRetries bounds the retries of one request; 0 means
	// DefaultMaxRetries, a negative value disables retries.
	MaxRetries int
	// MaxWait bounds the time one request spends waiting between its
	// attempts and for its pacing slot; 0 means DefaultMaxWait. The
	// request's context deadline bounds it too.
	MaxWait time.Duration
	// BaseDelay and MaxDelay shape the exponential backoff with full
	// jitter used for a 429 without Retry-After: the n-th retry waits a
	// random duration between 0 and min(MaxDelay, BaseDelay * 2^n).
	// Defaults DefaultBaseDelay and DefaultMaxDelay.
	BaseDelay, MaxDelay time.Duration
	// MaxJitter caps the random extra added to a Retry-After, which is
	// otherwise up to twice the Retry-After; 0 means DefaultMaxJitter.
	MaxJitter time.Duration
	// RetryNonIdempotent allows retrying POST, PATCH and CONNECT requests
	// that carry no Idempotency-Key. Behind floodgate a 429 means the
	// application never saw the request, so retrying it is safe there;
	// other services may make no such promise.
	RetryNonIdempotent bool
	// Pace spaces the requests from the answers' rate-limit fields, so
	// that the callers sharing a limit stay under it (see Pacer).
	Pace bool
	// Rand returns a uniform random number in [0, 1); nil uses
	// math/rand/v2.
	Rand func() float64
}

// Transport is an http.RoundTripper that retries rate-limited requests
// within a budget and optionally paces them. See the package
// documentation. It is safe for concurrent use.
type Transport struct {
	o      Options
	mu     sync.Mutex
	pacers map[string]*Pacer // by host
}

// NewTransport returns a Transport with o's settings.
func NewTransport(o Options) *Transport {
	if o.Base == nil {
		o.Base = http.DefaultTransport
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultMaxWait
	}
	if o.BaseDelay <= 0 {
		o.BaseDelay = DefaultBaseDelay
	}
	if o.MaxDelay <= 0 {
		o.MaxDelay = DefaultMaxDelay
	}
	if o.MaxJitter <= 0 {
		o.MaxJitter = DefaultMaxJitter
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	return &Transport{o: o, pacers: map[string]*Pacer{}}
}

// NewClient returns an http.Client whose Transport is NewTransport(o).
func NewClient(o Options) *http.Client {
	return &http.Client{Transport: NewTransport(o)}
}

// Pacer returns the pacer of a host (as in URL.Host), creating it.
func (t *Transport) Pacer(host string) *Pacer {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.pacers[host]
	if p == nil {
		p = &Pacer{}
		t.pacers[host] = p
	}
	return p
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	start := time.Now()
	budget := start.Add(t.o.MaxWait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(budget) {
		budget = dl
	}
	var pacer *Pacer
	if t.o.Pace {
		pacer = t.Pacer(req.URL.Host)
	}
	retryable := t.replayable(req)
	for attempt := 0; ; attempt++ {
		if pacer != nil {
			now := time.Now()
			wait := pacer.Wait(now)
			if now.Add(wait).After(budget) {
				// Sending now would only be denied, and sending again at
				// once would hammer the service: the request is not sent.
				closeBody(req)
				return nil, &PacedError{Wait: wait}
			}
			if wait = pacer.Reserve(now); wait > 0 {
				if err := sleep(ctx, wait); err != nil {
					closeBody(req)
					return nil, err
				}
			}
		}
		r := req
		if attempt > 0 {
			var err error
			if r, err = rewind(req); err != nil {
				return nil, err
			}
		}
		resp, err := t.o.Base.RoundTrip(r)
		if err != nil {
			return nil, err
		}
		now := time.Now()
		f := ParseFields(resp.Header, now)
		if pacer != nil {
			pacer.Observe(now, resp.StatusCode, f)
		}
		delay, ok := t.retryDelay(now, resp.StatusCode, f, attempt, retryable, pacer)
		if !ok || now.Add(delay).After(budget) {
			// Final, or the wait does not fit the budget or the deadline:
			// the caller gets this answer now rather than an error later.
			return resp, nil
		}
		drain(resp.Body)
		if err := sleep(ctx, delay); err != nil {
			return nil, err
		}
	}
}

// retryDelay says whether an answer is retried and after how long. With a
// pacer, the pacer has turned a Retry-After into its hold (jitter
// included), which the retry waits for.
func (t *Transport) retryDelay(now time.Time, status int, f Fields, attempt int, retryable bool, pacer *Pacer) (time.Duration, bool) {
	if !retryable || attempt >= t.o.MaxRetries {
		return 0, false
	}
	switch {
	case (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) && f.HasRetryAfter:
		if pacer != nil {
			return pacer.Wait(now), true
		}
		return f.RetryAfter + time.Duration(t.o.Rand()*float64(min(2*f.RetryAfter, t.o.MaxJitter))), true
	case status == http.StatusTooManyRequests:
		d := FullJitter(t.o.BaseDelay, t.o.MaxDelay, attempt, t.o.Rand)
		if pacer != nil {
			d = max(d, pacer.Wait(now))
		}
		return d, true
	}
	return 0, false
}

// ErrNoSlot is what a PacedError wraps.
var ErrNoSlot = errors.New("no request slot within the wait budget")

// PacedError is returned, without sending the request, when pacing puts
// the caller's next request slot beyond the request's budget (its context
// deadline, or MaxWait): the service would deny it. Wait is how long until
// the slot; a caller that retries should wait that long first.
type PacedError struct {
	Wait time.Duration
}

// Error implements error.
func (e *PacedError) Error() string {
	return fmt.Sprintf("floodgate client: the next request slot is in %v, beyond the wait budget: the request was not sent", e.Wait.Round(time.Millisecond))
}

// Unwrap returns ErrNoSlot.
func (e *PacedError) Unwrap() error { return ErrNoSlot }

// FullJitter returns the wait before retry number attempt (from 0) of an
// exponential backoff with full jitter: a uniform random duration between
// 0 and min(maxDelay, base * 2^attempt). rnd returns a uniform number in
// [0, 1).
func FullJitter(base, maxDelay time.Duration, attempt int, rnd func() float64) time.Duration {
	ceiling := maxDelay
	if attempt < 62 && base < maxDelay>>attempt {
		ceiling = base << attempt
	}
	return time.Duration(rnd() * float64(ceiling))
}

// replayable reports whether req may be sent again: an idempotent method
// (or the caller's say-so), and a body that can be produced again.
func (t *Transport) replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	if _, ok := req.Header["Idempotency-Key"]; ok {
		return true
	}
	if _, ok := req.Header["X-Idempotency-Key"]; ok {
		return true
	}
	return t.o.RetryNonIdempotent
}

// rewind returns a copy of req with a fresh body.
func rewind(req *http.Request) (*http.Request, error) {
	r := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		b, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("replaying the request body for a retry: %w", err)
		}
		r.Body = b
	}
	return r, nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain reads a little of a discarded answer's body, so that its
// connection can be reused, and closes it.
func drain(body io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, body, 64<<10)
	_ = body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
