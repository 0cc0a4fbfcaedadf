package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is an HTTP server on a real socket that answers from a script
// and records what it received.
type recorder struct {
	srv    *httptest.Server
	mu     sync.Mutex
	times  []time.Time
	bodies []string
}

// newRecorder answers the n-th request (from 0) with answer(n, w).
func newRecorder(t *testing.T, answer func(n int, w http.ResponseWriter)) *recorder {
	t.Helper()
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		n := len(rec.times)
		rec.times = append(rec.times, time.Now())
		rec.bodies = append(rec.bodies, string(b))
		rec.mu.Unlock()
		answer(n, w)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) count() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return len(rec.times)
}

func (rec *recorder) gap(i int) time.Duration {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.times[i].Sub(rec.times[i-1])
}

// limited answers 429 with the given Retry-After to the first n requests,
// then 200.
func limited(n int, retryAfter string) func(int, http.ResponseWriter) {
	return func(i int, w http.ResponseWriter) {
		if i < n {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, "slow down")
			return
		}
		_, _ = io.WriteString(w, "ok")
	}
}

func noJitter() float64 { return 0 }

func get(t *testing.T, c *http.Client, ctx context.Context, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(req)
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRetriesAfterRetryAfter(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, limited(1, "1"))
	c := NewClient(Options{Rand: noJitter})
	resp, err := get(t, c, context.Background(), rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.StatusCode, http.StatusOK; got != want {
		t.Fatalf("status %d, want %d", got, want)
	}
	if got, want := body(t, resp), "ok"; got != want {
		t.Errorf("body %q, want %q", got, want)
	}
	if got, want := rec.count(), 2; got != want {
		t.Fatalf("the server saw %d requests, want %d", got, want)
	}
	if g := rec.gap(1); g < time.Second {
		t.Errorf("retried after %v, want at least the Retry-After of 1s", g)
	}
}

func TestRetryAfterJitter(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, limited(1, "1"))
	// Rand near 1: the extra is almost twice the Retry-After, unless
	// MaxJitter caps it. How long the wait is, exactly, is
	// TestRetryDelay's; here, that the transport waits it out.
	c := NewClient(Options{Rand: func() float64 { return 0.99 }, MaxJitter: 200 * time.Millisecond})
	resp, err := get(t, c, context.Background(), rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = body(t, resp)
	// The retry leaves after the 429 has arrived and its wait has run
	// out: the gap between the two arrivals is at least the wait, however
	// slow the machine.
	if g := rec.gap(1); g < 1198*time.Millisecond {
		t.Errorf("retried after %v, want at least 1s plus 0.99 x 200ms", g)
	}
}

// TestRetryDelay pins the wait before each retry on given answers: the
// transport's retries sleep exactly these (the tests on a socket show
// they are waited out, TestRetryBudget that attempts count from 0).
func TestRetryDelay(t *testing.T) {
	t.Parallel()
	ra := func(d time.Duration) Fields { return Fields{Remaining: -1, RetryAfter: d, HasRetryAfter: true} }
	none := Fields{Remaining: -1}
	for i, tc := range []struct {
		o         Options
		status    int
		f         Fields
		attempt   int
		retryable bool
		want      time.Duration
		wantOK    bool
	}{
		// Retry-After plus Rand x twice the Retry-After...
		{Options{Rand: func() float64 { return 0.5 }}, 429, ra(time.Second), 0, true, 2 * time.Second, true},
		// ...capped by MaxJitter: 1s + 0.99 x 200ms, not 1s + 0.99 x 2s.
		{Options{Rand: func() float64 { return 0.99 }, MaxJitter: 200 * time.Millisecond}, 429, ra(time.Second), 0, true, 1198 * time.Millisecond, true},
		// A 503 with Retry-After is waited out the same way.
		{Options{Rand: noJitter}, 503, ra(3 * time.Second), 2, true, 3 * time.Second, true},
		// A 429 without Retry-After: full jitter, the ceiling doubling
		// from BaseDelay with each attempt (0.99 x 100ms, then 200ms).
		{Options{BaseDelay: 100 * time.Millisecond, Rand: func() float64 { return 0.99 }}, 429, none, 0, true, 99 * time.Millisecond, true},
		{Options{BaseDelay: 100 * time.Millisecond, Rand: func() float64 { return 0.99 }}, 429, none, 1, true, 198 * time.Millisecond, true},
		{Options{BaseDelay: 100 * time.Millisecond, MaxDelay: 150 * time.Millisecond, Rand: func() float64 { return 0.99 }}, 429, none, 1, true, 148_500 * time.Microsecond, true},
		// Not retried: a 503 without Retry-After, a 200, an answer to a
		// request that cannot be replayed, the last allowed attempt.
		{Options{Rand: noJitter}, 503, none, 0, true, 0, false},
		{Options{Rand: noJitter}, 200, ra(time.Second), 0, true, 0, false},
		{Options{Rand: noJitter}, 429, ra(time.Second), 0, false, 0, false},
		{Options{MaxRetries: 2, Rand: noJitter}, 429, ra(time.Second), 2, true, 0, false},
	} {
		tr := NewTransport(tc.o)
		got, ok := tr.retryDelay(time.Unix(1_700_000_000, 0), tc.status, tc.f, tc.attempt, tc.retryable, nil)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("step %d: retryDelay(status %d, attempt %d) = %v, %v, want %v, %v", i, tc.status, tc.attempt, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestRetryBudget(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, limited(100, "0"))
	c := NewClient(Options{MaxRetries: 2, Rand: noJitter})
	resp, err := get(t, c, context.Background(), rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.StatusCode, http.StatusTooManyRequests; got != want {
		t.Errorf("status %d, want the last answer, %d", got, want)
	}
	if got, want := body(t, resp), "slow down"; got != want {
		t.Errorf("body %q, want the last answer's %q", got, want)
	}
	if got, want := rec.count(), 3; got != want {
		t.Errorf("the server saw %d requests, want 1 + MaxRetries = %d", got, want)
	}

	none := newRecorder(t, limited(100, "0"))
	resp, err = get(t, NewClient(Options{MaxRetries: -1}), context.Background(), none.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = body(t, resp)
	if got, want := none.count(), 1; got != want {
		t.Errorf("with retries disabled the server saw %d requests, want %d", got, want)
	}
}

func TestAWaitThatDoesNotFitIsNotWaited(t *testing.T) {
	t.Parallel()
	// The answer asks for a 2-minute wait; the request's budget is 1
	// minute. A transport that waited would take the whole budget (its
	// deadline would end the wait) or the 2 minutes: the answer coming
	// back before the budget has run out shows it did not wait, on any
	// machine.
	const budget = time.Minute
	for _, tc := range []struct {
		name string
		o    Options
		ctx  func() (context.Context, context.CancelFunc)
	}{
		// One retry at most, so that a transport that waited fails after
		// one wait rather than after four.
		{"beyond the context deadline", Options{MaxRetries: 1}, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), budget)
		}},
		{"beyond MaxWait", Options{MaxRetries: 1, MaxWait: budget}, func() (context.Context, context.CancelFunc) {
			return context.Background(), func() {}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t, limited(100, "120"))
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			resp, err := get(t, NewClient(tc.o), ctx, rec.srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			e := time.Since(start)
			_ = body(t, resp)
			if got, want := resp.StatusCode, http.StatusTooManyRequests; got != want {
				t.Errorf("status %d, want %d", got, want)
			}
			if e >= budget {
				t.Errorf("returned after %v, want before the %v budget ran out: a 2m wait cannot fit it", e, budget)
			}
			if got, want := rec.count(), 1; got != want {
				t.Errorf("the server saw %d requests, want %d", got, want)
			}
		})
	}
}

// answered is a RoundTripper that calls then after each answer of base
// arrives, before the Transport above it sees the answer.
type answered struct {
	base http.RoundTripper
	then func(*http.Response)
}

func (a answered) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := a.base.RoundTrip(r)
	if err == nil {
		a.then(resp)
	}
	return resp, err
}

func TestCancelDuringTheWait(t *testing.T) {
	t.Parallel()
	// A 2-minute wait, within the budget; the caller cancels once the 429
	// is in, before or while the transport waits: either way the wait
	// must end with the cancellation, not 2 minutes later.
	const wait = 2 * time.Minute
	rec := newRecorder(t, limited(100, "120"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelled time.Time
	base := answered{base: http.DefaultTransport, then: func(*http.Response) {
		cancelled = time.Now()
		cancel()
	}}
	_, err := get(t, NewClient(Options{Base: base, MaxWait: time.Hour, Rand: noJitter}), ctx, rec.srv.URL)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if e := time.Since(cancelled); e >= wait/2 {
		t.Errorf("returned %v after the cancellation, want at it, not after the %v wait", e, wait)
	}
	if got, want := rec.count(), 1; got != want {
		t.Errorf("the server saw %d requests, want %d: a cancelled request is not retried", got, want)
	}
}

// opaqueBody is a body that net/http cannot replay (no GetBody).
type opaqueBody struct{ io.Reader }

func (opaqueBody) Close() error { return nil }

func TestRetriesOnlyWhatIsSafeToRepeat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		o        Options
		req      func(url string) *http.Request
		requests int
	}{
		{"a POST is not retried", Options{}, func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("order"))
			return r
		}, 1},
		{"a PATCH is not retried", Options{}, func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPatch, url, strings.NewReader("order"))
			return r
		}, 1},
		{"a POST is retried when told to", Options{RetryNonIdempotent: true}, func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("order"))
			return r
		}, 2},
		{"a POST with an Idempotency-Key is retried", Options{}, func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte("order")))
			r.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
			return r
		}, 2},
		{"a PUT is retried with its body", Options{}, func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPut, url, strings.NewReader("order"))
			return r
		}, 2},
		{"a body that cannot be replayed is not retried", Options{RetryNonIdempotent: true}, func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPut, url, opaqueBody{strings.NewReader("order")})
			return r
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t, limited(1, "0"))
			tc.o.Rand = noJitter
			resp, err := NewClient(tc.o).Do(tc.req(rec.srv.URL))
			if err != nil {
				t.Fatal(err)
			}
			_ = body(t, resp)
			if got, want := rec.count(), tc.requests; got != want {
				t.Fatalf("the server saw %d requests, want %d", got, want)
			}
			for i, b := range rec.bodies {
				if b != "order" {
					t.Errorf("request %d had body %q, want %q", i, b, "order")
				}
			}
		})
	}
}

func TestServiceUnavailable(t *testing.T) {
	t.Parallel()
	answer := func(retryAfter string) func(int, http.ResponseWriter) {
		return func(i int, w http.ResponseWriter) {
			if i == 0 {
				if retryAfter != "" {
					w.Header().Set("Retry-After", retryAfter)
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "ok")
		}
	}
	without := newRecorder(t, answer(""))
	resp, err := get(t, NewClient(Options{}), context.Background(), without.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = body(t, resp)
	if got, want := without.count(), 1; got != want {
		t.Errorf("a 503 without Retry-After: the server saw %d requests, want %d (the application's own failure is not retried)", got, want)
	}
	with := newRecorder(t, answer("0"))
	resp, err = get(t, NewClient(Options{Rand: noJitter}), context.Background(), with.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.StatusCode, http.StatusOK; got != want || with.count() != 2 {
		t.Errorf("a 503 with Retry-After: status %d after %d requests, want %d after 2", got, with.count(), want)
	}
	_ = body(t, resp)
}

func TestBackoffWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, limited(2, ""))
	c := NewClient(Options{BaseDelay: 100 * time.Millisecond, Rand: func() float64 { return 0.99 }})
	resp, err := get(t, c, context.Background(), rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = body(t, resp)
	if got, want := rec.count(), 3; got != want {
		t.Fatalf("the server saw %d requests, want %d", got, want)
	}
	// Full jitter: 0.99 x 100ms, then 0.99 x 200ms (TestRetryDelay pins
	// the values). Each retry leaves only once its wait has run out, so
	// the gaps between arrivals are at least the waits: a backoff that did
	// not grow fails the second.
	if g := rec.gap(1); g < 99*time.Millisecond {
		t.Errorf("first retry after %v, want at least 0.99 x 100ms", g)
	}
	if g := rec.gap(2); g < 198*time.Millisecond {
		t.Errorf("second retry after %v, want at least 0.99 x 200ms", g)
	}
}

func TestFullJitter(t *testing.T) {
	t.Parallel()
	top := func() float64 { return 1 }
	for _, tc := range []struct {
		attempt int
		want    time.Duration
	}{{0, 100 * time.Millisecond}, {1, 200 * time.Millisecond}, {3, 800 * time.Millisecond}, {10, 10 * time.Second}, {200, 10 * time.Second}} {
		if got := FullJitter(100*time.Millisecond, 10*time.Second, tc.attempt, top); got != tc.want {
			t.Errorf("FullJitter ceiling at attempt %d = %v, want %v", tc.attempt, got, tc.want)
		}
	}
	if got := FullJitter(time.Second, time.Minute, 5, func() float64 { return 0 }); got != 0 {
		t.Errorf("FullJitter with Rand 0 = %v, want 0: full jitter starts at zero", got)
	}
}

func TestPacingHoldsTheOtherRequests(t *testing.T) {
	t.Parallel()
	// A limit of 5 per 1000s: a unit every 200s, so the spacing the 429
	// sets puts the third request's slot minutes away, beyond its
	// deadline however slow the machine is.
	rec := newRecorder(t, func(i int, w http.ResponseWriter) {
		w.Header().Set("RateLimit-Policy", `"shop.per-key";q=5;w=1000`)
		if i == 0 {
			w.Header().Set("RateLimit", `"shop.per-key";r=0;t=200`)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("RateLimit", `"shop.per-key";r=4;t=200`)
	})
	c := NewClient(Options{Pace: true, MaxRetries: -1, MaxWait: time.Hour, Rand: noJitter})
	u, err := url.Parse(rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Transport.(*Transport).Pacer(u.Host)
	p.Rand = noJitter // before its first use: a hold of exactly the Retry-After
	resp, err := get(t, c, context.Background(), rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = body(t, resp)
	// Another request of the same caller, with retries off, still waits
	// out the hold the 429 set: it leaves 1s after the 429 arrived, at
	// the earliest.
	resp, err = get(t, c, context.Background(), rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = body(t, resp)
	if g := rec.gap(1); g < time.Second {
		t.Errorf("the next request went %v after the 429, want at least its Retry-After of 1s", g)
	}
	// A request whose slot lies beyond its deadline is not sent: it is
	// refused with the wait until the slot (the pacer's wait at the
	// instant it asked, which lies between before and after) and without
	// waiting for the slot or the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := time.Now()
	_, err = get(t, c, ctx, rec.srv.URL)
	after := time.Now()
	var pe *PacedError
	if !errors.As(err, &pe) || !errors.Is(err, ErrNoSlot) {
		t.Fatalf("error %v, want a *PacedError", err)
	}
	if lo, hi := p.Wait(after), p.Wait(before); pe.Wait < lo || pe.Wait > hi || pe.Wait <= time.Minute {
		t.Errorf("PacedError.Wait = %v, want the wait until the slot, between %v and %v, beyond the 1m deadline", pe.Wait, lo, hi)
	}
	if err := ctx.Err(); err != nil {
		t.Errorf("refused after the deadline (%v): want it refused at once, not after waiting", err)
	}
	if got, want := rec.count(), 2; got != want {
		t.Errorf("the server saw %d requests, want %d: the refused one is not sent", got, want)
	}
}
