package pki

import (
	"context"
	"time"
)

// Keep runs sync until ctx ends: every interval, or sooner when sync says
// its next stage (a renewal, a rotation step) is due, and after a failure
// with a backoff from a second up to interval, which failed reports with
// the wait before the next try. now is the clock the stage times are on.
// It returns nil when ctx ends.
func Keep(ctx context.Context, interval time.Duration, now func() time.Time,
	sync func(context.Context) (time.Time, error), failed func(err error, retryIn time.Duration)) error {
	backoff := time.Second
	for {
		wait := interval
		next, err := sync(ctx)
		switch {
		case err != nil:
			failed(err, backoff)
			wait, backoff = backoff, min(2*backoff, interval)
		default:
			backoff = time.Second
			if !next.IsZero() {
				wait = min(wait, max(next.Sub(now()), 10*time.Millisecond))
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
