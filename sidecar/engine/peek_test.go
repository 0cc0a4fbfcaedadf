package engine

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// TestPeekIsDecidedAsCostOne: a hit of cost 0 asks whether a unit is left.
// It is allowed on a key with room and denied on an exhausted one, by the
// deny cache as by the store, and it spends nothing: the key's next
// requests get what they would have got without it.
func TestPeekIsDecidedAsCostOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	r := f.rule(t, "r", perMinute(limiter.TokenBucket, 60), 1, false, false) // 1 token/s
	peek := Hit{Rule: r, Key: "k", Cost: 0}
	for range 3 {
		v := f.decide(peek)
		if v.Outcome != Allow || v.Results[0].Source != FromStore || v.Results[0].Taken || v.Results[0].Remaining != 60 {
			t.Fatalf("peek on a new key: %v %+v, want allowed by the store with 60 remaining, nothing taken", v.Outcome, v.Results[0])
		}
	}
	for i := range 60 {
		if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome != Allow {
			t.Fatalf("request %d after the peeks denied: a peek spent", i)
		}
	}
	// The last take left the key empty, and the deny cache holds it: the
	// peek is denied there, as a cost of 1 is, without a store call.
	calls := f.store.calls.Load()
	v := f.decide(peek)
	if v.Outcome != Deny || v.Results[0].Source != FromDenyCache {
		t.Fatalf("peek on the empty key: %v from %v, want a local deny", v.Outcome, v.Results[0].Source)
	}
	if got := f.store.calls.Load(); got != calls {
		t.Errorf("a peek on a held key called the store %d times", got-calls)
	}
	if v.RetryAfter <= 0 || v.RetryAfter > time.Second+time.Microsecond {
		t.Errorf("peek RetryAfter = %v, want (0, 1s] plus at most one tick", v.RetryAfter)
	}
	// At the refill instant the peek goes to the store (it gates the key
	// as a cost of 1 does) and is allowed; the token is still there for
	// the request that follows, and then the key is empty again.
	f.clock.Add(v.RetryAfter)
	if v := f.decide(peek); v.Outcome != Allow || v.Results[0].Source != FromStore || v.Results[0].Remaining != 1 {
		t.Fatalf("peek at the refill instant: %v %+v, want allowed by the store with 1 remaining", v.Outcome, v.Results[0])
	}
	if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome != Allow {
		t.Fatalf("the request after an allowed peek: %v, want allowed", v.Outcome)
	}
	if v := f.decide(peek); v.Outcome != Deny {
		t.Fatalf("peek after the token was spent: %v, want deny", v.Outcome)
	}

	// A key the store denies a peek (no cache entry yet) is held: the
	// next peek and the next request are denied locally.
	f2 := newFixture(t, false)
	r2 := f2.rule(t, "r", perMinute(limiter.SlidingWindow, 2), 1, false, false)
	for range 2 {
		f2.decide(Hit{Rule: r2, Key: "k", Cost: 1})
	}
	calls = f2.store.calls.Load()
	v = f2.decide(Hit{Rule: r2, Key: "k", Cost: 0})
	if v.Outcome != Deny || v.Results[0].Source != FromStore || v.RetryAfter <= 0 {
		t.Fatalf("peek on a spent SlidingWindow key: %v %+v, want denied by the store with a wait", v.Outcome, v.Results[0])
	}
	for _, cost := range []int64{0, 1} {
		if v := f2.decide(Hit{Rule: r2, Key: "k", Cost: cost}); v.Outcome != Deny || v.Results[0].Source != FromDenyCache {
			t.Errorf("cost %d after a denied peek: %v from %v, want a local deny", cost, v.Outcome, v.Results[0].Source)
		}
	}
	if got := f2.store.calls.Load() - calls; got != 1 {
		t.Errorf("%d store calls, want the peek's alone", got)
	}
}

// TestPeekOnSeveralRules: a call that peeks several rules is denied when
// one of them is exhausted, and charges none of them.
func TestPeekOnSeveralRules(t *testing.T) {
	t.Parallel()
	for _, parallel := range []bool{false, true} {
		f := newFixture(t, parallel)
		wide := f.rule(t, "wide", perMinute(limiter.FixedWindow, 10), 1, false, false)
		tight := f.rule(t, "tight", perMinute(limiter.FixedWindow, 2), 1, false, false)
		peeks := []Hit{{Rule: wide, Key: "w", Cost: 0}, {Rule: tight, Key: "t", Cost: 0}}
		if v := f.decide(peeks...); v.Outcome != Allow {
			t.Fatalf("parallel=%v: peeks on fresh keys: %v, want allow", parallel, v.Outcome)
		}
		for range 2 {
			if v := f.decide(Hit{Rule: tight, Key: "t", Cost: 1}); v.Outcome != Allow {
				t.Fatalf("parallel=%v: the tight rule's requests denied after peeks", parallel)
			}
		}
		v := f.decide(peeks...)
		if v.Outcome != Deny || v.Binding != 1 || v.RetryAfter <= 0 {
			t.Fatalf("parallel=%v: peeks with the tight rule spent: %v binding %d retry %v, want deny by the tight rule", parallel, v.Outcome, v.Binding, v.RetryAfter)
		}
		d, _, err := f.store.Take(context.Background(), limiter.Request{Key: "w", Limit: wide.Limit, Cost: 0})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := d.Remaining, int64(10); got != want {
			t.Errorf("parallel=%v: wide remaining = %d, want %d: peeks charge nothing", parallel, got, want)
		}
	}
}

// TestPeeksAndLeases: a peek is answered from a live lease that holds a
// token, takes nothing from it, never takes a lease of its own, and is
// denied once the key and its lease are spent.
func TestPeeksAndLeases(t *testing.T) {
	t.Parallel()
	clk := newClock()
	f := newLeaseFixture(t, newSharedStore(t, clk), clk)
	lim := hourWindow(2000)
	r := f.rule(t, "r", lim, true, 1, false)

	// Peeks alone at 5000/s make no key hot.
	for range 1000 {
		clk.Add(200 * time.Microsecond)
		if v := f.decide(Hit{Rule: r, Key: "p", Cost: 0}); v.Outcome != Allow || v.Results[0].Source != FromStore {
			t.Fatalf("a peek on a key with room: %v from %v, want allowed by the store", v.Outcome, v.Results[0].Source)
		}
	}
	if got := f.store.leases.Load(); got != 0 {
		t.Fatalf("peeks took %d leases", got)
	}

	// Requests make key k hot; the peeks in between are answered from
	// its lease.
	admitted, fromLease := 0, 0
	for i := range 1000 {
		clk.Add(200 * time.Microsecond)
		if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome == Allow {
			admitted++
		}
		if i < 500 {
			continue
		}
		calls, held := f.store.calls(), f.remaining(t, "k", lim)
		v := f.decide(Hit{Rule: r, Key: "k", Cost: 0})
		if v.Outcome != Allow {
			t.Fatalf("peek %d on a key with room: %v", i, v.Outcome)
		}
		if v.Results[0].Source == FromLease {
			fromLease++
			if f.store.calls() != calls || f.remaining(t, "k", lim) != held {
				t.Fatalf("peek %d from the lease called the store or moved its count", i)
			}
		}
	}
	if fromLease < 400 {
		t.Errorf("%d of 500 peeks were answered from the lease, want most", fromLease)
	}
	// Spend the rest, then peek: denied, and no lease is asked for.
	for range 2000 {
		clk.Add(200 * time.Microsecond)
		if v := f.decide(Hit{Rule: r, Key: "k", Cost: 1}); v.Outcome == Allow {
			admitted++
		} else {
			break
		}
	}
	if admitted != 2000 {
		t.Fatalf("admitted %d, want the whole limit of 2000", admitted)
	}
	leases := f.store.leases.Load()
	for range 3 {
		if v := f.decide(Hit{Rule: r, Key: "k", Cost: 0}); v.Outcome != Deny || v.RetryAfter <= 0 {
			t.Fatalf("peek on the spent key: %v retry %v, want a deny with a wait", v.Outcome, v.RetryAfter)
		}
	}
	if got := f.store.leases.Load(); got != leases {
		t.Errorf("peeks on the spent key made %d lease calls", got-leases)
	}
	if err := f.e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.remaining(t, "k", lim); got != 0 {
		t.Errorf("the store has %d left after the limit was admitted, want 0", got)
	}
}
