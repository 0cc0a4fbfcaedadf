package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
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
	// MaxJitter caps it.
	c := NewClient(Options{Rand: func() float64 { return 0.99 }, MaxJitter: 200 * time.Millisecond})
	resp, err := get(t, c, context.Background(), rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = body(t, resp)
	if g := rec.gap(1); g < 1190*time.Millisecond || g > 1500*time.Millisecond {
		t.Errorf("retried after %v, want 1s plus 0.99 x 200ms", g)
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
	for _, tc := range []struct {
		name string
		o    Options
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"beyond the context deadline", Options{}, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 2*time.Second)
		}},
		{"beyond MaxWait", Options{MaxWait: 2 * time.Second}, func() (context.Context, context.CancelFunc) {
			return context.Background(), func() {}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t, limited(100, "5"))
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			resp, err := get(t, NewClient(tc.o), ctx, rec.srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			_ = body(t, resp)
			if got, want := resp.StatusCode, http.StatusTooManyRequests; got != want {
				t.Errorf("status %d, want %d", got, want)
			}
			if e := time.Since(start); e > time.Second {
				t.Errorf("returned after %v, want at once: a 5s wait cannot fit", e)
			}
			if got, want := rec.count(), 1; got != want {
				t.Errorf("the server saw %d requests, want %d", got, want)
			}
		})
	}
}

func TestCancelDuringTheWait(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, limited(100, "2"))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err := get(t, NewClient(Options{}), ctx, rec.srv.URL)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v, want context.Canceled", err)
	}
	if e := time.Since(start); e > time.Second {
		t.Errorf("returned %v after the start, want soon after the cancellation", e)
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
	// Full jitter: up to 100ms, then up to 200ms.
	// The upper bounds leave room for a busy machine; a backoff that
	// did not grow would fail the lower one.
	if g := rec.gap(1); g < 99*time.Millisecond || g > 190*time.Millisecond {
		t.Errorf("first retry after %v, want 0.99 x 100ms", g)
	}
	if g := rec.gap(2); g < 198*time.Millisecond || g > 300*time.Millisecond {
		t.Errorf("second retry after %v, want 0.99 x 200ms", g)
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
	rec := newRecorder(t, func(i int, w http.ResponseWriter) {
		w.Header().Set("RateLimit-Policy", `"shop.per-key";q=5;w=10`)
		if i == 0 {
			w.Header().Set("RateLimit", `"shop.per-key";r=0;t=1`)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("RateLimit", `"shop.per-key";r=4;t=1`)
	})
	c := NewClient(Options{Pace: true, MaxRetries: -1, Rand: noJitter})
	resp, err := get(t, c, context.Background(), rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = body(t, resp)
	// Another request of the same caller, with retries off, still waits
	// out the hold the 429 set.
	resp, err = get(t, c, context.Background(), rec.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = body(t, resp)
	if g := rec.gap(1); g < time.Second {
		t.Errorf("the next request went %v after the 429, want at least its Retry-After of 1s", g)
	}
	// A request whose slot lies beyond its deadline is not sent.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = get(t, c, ctx, rec.srv.URL)
	var pe *PacedError
	if !errors.As(err, &pe) || !errors.Is(err, ErrNoSlot) || pe.Wait < time.Second {
		t.Errorf("error %v, want a *PacedError with the wait until the slot (spacing 2s)", err)
	}
	if e := time.Since(start); e > time.Second {
		t.Errorf("a request with a 100ms deadline took %v to be refused, want at once rather than after its 2s slot", e)
	}
	if got, want := rec.count(), 2; got != want {
		t.Errorf("the server saw %d requests, want %d: the refused one is not sent", got, want)
	}
}
