package limiter_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// A replica's share, step by step: 3 per minute on 10 replicas is one
// token every 20s, and replica 0 owns tokens 0, 10, 20, ...: one token
// every 200s. A new key starts empty.
func TestShareSteps(t *testing.T) {
	t.Parallel()
	base := time.Unix(1_800_000_000, 0) // token 90_000_000: owned by replica 0
	lim, err := limiter.New(limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Period: time.Minute, Share: limiter.Share{Of: 10, Index: 0}})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range []struct {
		at      time.Duration
		cost    int64
		allowed bool
		retry   time.Duration
	}{
		{0, 1, false, 200 * time.Second},           // new key: empty, even though token 90e6 just arrived
		{199 * time.Second, 1, false, time.Second}, // token 90e6+10 arrives at 200s
		{200 * time.Second, 1, true, 0},
		{201 * time.Second, 1, false, 199 * time.Second},
		// A peek is decided as a cost of 1.
		{201 * time.Second, 0, false, 199 * time.Second},
		{400 * time.Second, 2, false, time.Minute}, // two tokens are 200s apart, never both among the newest 3
		{400 * time.Second, 1, true, 0},
		// Idle: the token of 600s is usable until the 3 newer tokens
		// have arrived (at 660s), then gone.
		{661 * time.Second, 1, false, 139 * time.Second},
		{800 * time.Second, 0, true, 0},
		{800 * time.Second, 1, true, 0}, // the peek spent nothing
	} {
		d, err := lim.AllowN(base.Add(s.at), s.cost)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Allowed != s.allowed || d.RetryAfter != s.retry {
			t.Errorf("step %d: AllowN(+%v, %d) = %v, want allowed %v retry %v", i, s.at, s.cost, d, s.allowed, s.retry)
		}
		if d.Limit != 1 {
			t.Errorf("step %d: Limit = %d, want the share's capacity 1", i, d.Limit)
		}
	}
}

// A key a replica first sees through a peek starts empty at that peek, as
// it would at a request: a gateway that checks each key before it charges
// it gets the key's tokens as they arrive, rather than a key that is new,
// and empty, at every check.
func TestSharePeekSeesTheKey(t *testing.T) {
	t.Parallel()
	base := time.Unix(1_800_000_000, 0) // token 90_000_000: owned by replica 0
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Period: time.Minute, Share: limiter.Share{Of: 10, Index: 0}}
	peeked, err := limiter.New(l)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := peeked.AllowN(base, 0); err != nil || d.Allowed || d.RetryAfter != 200*time.Second {
		t.Fatalf("peek on a new key = %v, %v; want a deny with RetryAfter 200s", d, err)
	}
	for range 3 {
		if d, err := peeked.AllowN(base.Add(200*time.Second), 0); err != nil || !d.Allowed {
			t.Fatalf("peek once token 90e6+10 has arrived = %v, %v; want allowed", d, err)
		}
	}
	if d, err := peeked.AllowN(base.Add(200*time.Second), 1); err != nil || !d.Allowed {
		t.Fatalf("cost 1 after the peeks = %v, %v; want allowed", d, err)
	}
}

// The replicas' shares together never admit more than the whole limit:
// every replica is offered requests without pause, and every window of
// one period, from the first instant on, admits at most the limit's
// Requests, plus its capacity for the period in which the replicas' keys
// were idle long enough to fill, for every L and R, including L < R.
func TestSharesHoldTheAggregate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		requests, burst int64
		per             time.Duration
		replicas        int32
		step            time.Duration
	}{
		{3, 0, time.Minute, 10, 500 * time.Millisecond},
		{1000, 0, time.Second, 3, 100 * time.Microsecond},
		{1, 0, time.Second, 7, time.Millisecond},
		{10, 5, time.Second, 3, time.Millisecond},
		{7, 0, time.Second, 7, time.Millisecond},
		{100, 0, time.Minute, 64, 10 * time.Millisecond},
		{5, 20, time.Second, 2, time.Millisecond},
	} {
		t.Run(fmt.Sprintf("%d per %v burst %d on %d", tc.requests, tc.per, tc.burst, tc.replicas), func(t *testing.T) {
			t.Parallel()
			lims := make([]*limiter.Limiter, tc.replicas)
			for i := range lims {
				var err error
				lims[i], err = limiter.New(limiter.Limit{Algorithm: limiter.TokenBucket, Requests: tc.requests, Burst: tc.burst, Period: tc.per,
					Share: limiter.Share{Of: tc.replicas, Index: int32(i)}})
				if err != nil {
					t.Fatal(err)
				}
			}
			// Start off the period grid, so that windows straddle it.
			base := time.Unix(1_800_000_000, 0).Add(tc.per / 3)
			periods := 6
			var admits []time.Duration
			for at := time.Duration(0); at < time.Duration(periods)*tc.per; at += tc.step {
				for _, l := range lims {
					d, err := l.AllowN(base.Add(at), 1)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						admits = append(admits, at)
					}
				}
			}
			// Every window of one period, sliding over the admissions.
			worst := 0
			for i, start := range admits {
				n := 0
				for _, a := range admits[i:] {
					if a >= start+tc.per {
						break
					}
					n++
				}
				worst = max(worst, n)
			}
			if int64(worst) > tc.requests {
				t.Errorf("a window of one period admitted %d, more than the limit %d", worst, tc.requests)
			}
			total := int64(len(admits))
			if want := tc.requests * int64(periods); total > want || total < want-tc.requests-1 {
				t.Errorf("admitted %d over %d periods, want at most %d and about that much", total, periods, want)
			}
		})
	}
}

// A share's state is an absolute token index, so an edit of the replica
// count keeps what was spent, and an edit of the rate starts afresh.
func TestShareValidation(t *testing.T) {
	t.Parallel()
	for _, s := range []limiter.Share{{Of: -1}, {Of: 3, Index: 3}, {Of: 3, Index: -1}, {Of: limiter.MaxShareReplicas + 1}} {
		l := limiter.Limit{Algorithm: limiter.GCRA, Requests: 10, Period: time.Second, Share: s}
		if err := l.Validate(); err == nil {
			t.Errorf("share %+v: Validate = nil, want an error", s)
		}
	}
	if err := (limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10, Period: time.Second, Share: limiter.Share{Of: 2, Index: 1}}).Validate(); err != nil {
		t.Errorf("a shared SlidingLog: %v", err)
	}
}
