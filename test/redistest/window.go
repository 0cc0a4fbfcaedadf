package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Clock is what reads Redis's clock: a server's or a cluster's client.
type Clock interface {
	Time(context.Context) *redis.TimeCmd
}

// Time reads Redis's clock, which places the windows it counts in.
func Time(t testing.TB, c Clock) time.Time {
	t.Helper()
	at, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// InOneWindow runs run, then the check it returns, for a run that began
// and ended in one epoch-aligned window of period on Redis's clock, as
// FixedWindow and SlidingWindow count: requests that a window boundary
// splits count in two windows, however fast the machine ran them. A run
// that straddles a boundary is run again, with the next attempt number
// (for a key of its own); two in a row fail the test.
func InOneWindow(t testing.TB, c Clock, period time.Duration, run func(attempt int) (check func())) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		from := Time(t, c)
		check := run(attempt)
		to := Time(t, c)
		if from.UnixNano()/int64(period) == to.UnixNano()/int64(period) {
			check()
			return
		}
		if attempt > 0 {
			t.Fatalf("two runs in a row straddled a window boundary of %v (Redis time %v to %v)", period, from, to)
		}
		t.Logf("the run straddled a window boundary of %v (Redis time %v to %v): run again", period, from, to)
	}
}
