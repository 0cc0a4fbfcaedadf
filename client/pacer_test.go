package client

import (
	"net/http"
	"testing"
	"time"
)

// step is one call on a Pacer at an instant: an answer observed, or a slot
// reserved with the wait it must return.
type step struct {
	at      time.Duration // from the start
	observe *Fields
	status  int
	// For a reservation: the wait it returns.
	wait time.Duration
	// interval, when set, is the spacing the pacer must keep afterwards.
	interval time.Duration
}

func answer(r int64) *Fields {
	return &Fields{Name: "p.r", Quota: 50, Window: time.Second, Capacity: 50, Remaining: r}
}

func runSteps(t *testing.T, p *Pacer, steps []step) {
	t.Helper()
	start := time.Unix(1_700_000_000, 0)
	for i, s := range steps {
		now := start.Add(s.at)
		if s.observe != nil {
			status := s.status
			if status == 0 {
				status = http.StatusOK
			}
			p.Observe(now, status, *s.observe)
		} else if got := p.Reserve(now); got != s.wait {
			t.Errorf("step %d: Reserve(%v) = %v, want %v", i, s.at, got, s.wait)
		}
		if s.interval != 0 {
			if got := p.Interval(); got != s.interval {
				t.Errorf("step %d: Interval() = %v, want %v", i, got, s.interval)
			}
		}
	}
}

func TestPacerUnpacedUntilItKnows(t *testing.T) {
	t.Parallel()
	p := &Pacer{Rand: func() float64 { return 0.5 }}
	runSteps(t, p, []step{
		{at: 0, wait: 0},
		{at: 0, wait: 0},
		// An answer without fields teaches nothing.
		{at: time.Millisecond, observe: &Fields{Remaining: -1}},
		{at: time.Millisecond, wait: 0},
		// The first answer with fields starts a measurement.
		{at: 2 * time.Millisecond, observe: answer(40)},
		{at: 2 * time.Millisecond, wait: 0},
		// Too short a window (under 4 units of refill) is not used.
		{at: 50 * time.Millisecond, observe: answer(38)},
		{at: 50 * time.Millisecond, wait: 0},
	})
}

func TestPacerMeasuresItsShare(t *testing.T) {
	t.Parallel()
	p := &Pacer{Rand: func() float64 { return 0.5 }}
	runSteps(t, p, []step{
		{at: 0, observe: answer(40)},
		// One second later: 40 + 50 refilled - 40 = 50 spent, 1 of them
		// ours; the limit is 80% full, so the aim is 1.3 x 50/s:
		// own rate 1/s x (65/50)^0.7 = 1.2016/s.
		{at: time.Second, observe: answer(40), interval: 832_222_883},
		// Slots are spaced by the interval (times 0.75 + 0.5 x Rand).
		{at: time.Second, wait: 0},
		{at: time.Second, wait: 832_222_883},
		// Two seconds later, 10 remain: 40 + 100 - 10 = 130 spent, 1
		// ours; aim 0.7 x 50/s, below the 65/s spent: the whole
		// correction, own rate 0.5/s x 35/65 = 0.2692/s.
		{at: 3 * time.Second, observe: answer(10), interval: 3_714_285_714},
		// A second answer at the same instant measures nothing.
		{at: 3 * time.Second, observe: answer(9), interval: 3_714_285_714},
	})
}

func TestPacerFasterPullsTheReservedSlotIn(t *testing.T) {
	t.Parallel()
	p := &Pacer{Rand: func() float64 { return 0.5 }}
	denied := answer(0)
	denied.RetryAfter, denied.HasRetryAfter = time.Second, true
	runSteps(t, p, []step{
		// Held 1s plus half of twice 1s, then spaced by 1.5 x 2s.
		{at: 0, observe: denied, status: http.StatusTooManyRequests, interval: 3 * time.Second},
		{at: 0, wait: 2 * time.Second},
		// Alone, the caller finds the limit full again (49 after its
		// own request): it speeds up to about 1.48 x 50/s, and the slot
		// reserved at 5s at the old spacing comes in.
		{at: 2100 * time.Millisecond, observe: answer(49)},
		{at: 2200 * time.Millisecond, observe: answer(49)},
		{at: 2200 * time.Millisecond, wait: 0},
	})
	if got := p.Interval(); got < 20*time.Millisecond || got > 30*time.Millisecond {
		t.Errorf("Interval() = %v after finding the limit full, want about 25ms", got)
	}
}

func TestPacerHoldsOnDenials(t *testing.T) {
	t.Parallel()
	p := &Pacer{Rand: func() float64 { return 0.5 }}
	denied := func(ra time.Duration) *Fields {
		f := answer(0)
		f.RetryAfter, f.HasRetryAfter = ra, true
		return f
	}
	runSteps(t, p, []step{
		// Retry-After 2s plus half of twice 2s: held 4s, spaced 6s.
		{at: 0, observe: denied(2 * time.Second), status: http.StatusTooManyRequests, interval: 6 * time.Second},
		{at: 0, wait: 4 * time.Second},
		{at: time.Second, wait: 3*time.Second + 6*time.Second},
		// Another deny at least doubles the spacing.
		{at: 4 * time.Second, observe: denied(time.Second), status: http.StatusTooManyRequests, interval: 12 * time.Second},
		// A 503 with Retry-After holds (4s plus half of the 5s cap) without
		// touching the spacing.
		{at: 20 * time.Second, observe: &Fields{Remaining: -1, RetryAfter: 4 * time.Second, HasRetryAfter: true}, status: http.StatusServiceUnavailable, interval: 12 * time.Second},
		{at: 20 * time.Second, wait: 6500 * time.Millisecond},
	})
	// MaxJitter caps the extra.
	q := &Pacer{Rand: func() float64 { return 0.999 }, MaxJitter: 100 * time.Millisecond}
	runSteps(t, q, []step{
		{at: 0, observe: denied(10 * time.Second), status: http.StatusTooManyRequests},
		{at: 0, wait: 10*time.Second + 99_900_000},
	})
	// Without Retry-After, a deny holds for one unit of the limit.
	r := &Pacer{}
	runSteps(t, r, []step{
		{at: 0, observe: answer(0), status: http.StatusTooManyRequests},
		{at: 0, wait: 20 * time.Millisecond},
	})
}

func TestPacerForgetsWhenAnotherLimitBinds(t *testing.T) {
	t.Parallel()
	p := &Pacer{Rand: func() float64 { return 0.5 }}
	other := answer(0)
	other.Name = "p.other"
	runSteps(t, p, []step{
		{at: 0, observe: answer(40)},
		// The window of p.r is not used to measure p.other: no interval.
		{at: time.Second, observe: other, interval: 0},
	})
	if got := p.Interval(); got != 0 {
		t.Errorf("Interval() = %v, want 0: the first answer of another limit only starts a measurement", got)
	}
}
