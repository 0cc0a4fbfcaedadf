package pki

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestKeepRunsAtTheNextStage: a stage due sooner than the interval runs
// then, not at the interval; a failure is reported with the first backoff;
// the end of ctx ends Keep.
func TestKeepRunsAtTheNextStage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	calls := 0
	start := time.Now()
	err := Keep(ctx, time.Hour, time.Now, func(context.Context) (time.Time, error) {
		calls++
		if calls == 3 {
			cancel()
		}
		return time.Now().Add(20 * time.Millisecond), nil
	}, func(err error, _ time.Duration) { t.Errorf("failed(%v) without a failure", err) })
	if err != nil || calls != 3 {
		t.Fatalf("Keep = %v after %d syncs, want nil after 3", err, calls)
	}
	if took := time.Since(start); took < 40*time.Millisecond || took > 30*time.Minute {
		t.Errorf("three syncs 20ms apart took %v", took)
	}

	ctx2, cancel2 := context.WithCancel(t.Context())
	defer cancel2()
	var retry time.Duration
	boom := errors.New("boom")
	err = Keep(ctx2, time.Hour, time.Now, func(context.Context) (time.Time, error) { return time.Time{}, boom },
		func(err error, retryIn time.Duration) {
			if !errors.Is(err, boom) {
				t.Errorf("failed(%v), want boom", err)
			}
			retry = retryIn
			cancel2()
		})
	if err != nil || retry != time.Second {
		t.Errorf("Keep after a failure = %v, retry in %v; want nil, 1s", err, retry)
	}
}
