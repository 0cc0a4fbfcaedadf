package redisstore

import (
	"bufio"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/resp"
)

func TestParseReply(t *testing.T) {
	t.Parallel()
	p, err := limiter.NewParams(limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseReply([]any{int64(1), int64(9), int64(100000), int64(0)}, p)
	if err != nil {
		t.Fatal(err)
	}
	want := limiter.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: 100 * time.Millisecond}
	if d != want {
		t.Errorf("ParseReply = %v, want %v", d, want)
	}
	bad := []struct {
		name string
		res  any
		want string
	}{
		{"not an array", "OK", "want an array"},
		{"short", []any{int64(1), int64(2)}, "2 elements"},
		{"string element", []any{int64(1), "9", int64(0), int64(0)}, "element 1 is string"},
		{"nil element", []any{int64(1), int64(9), nil, int64(0)}, "element 2 is <nil>"},
		{"allowed 2", []any{int64(2), int64(9), int64(0), int64(0)}, "allowed = 2"},
		{"remaining above capacity", []any{int64(1), int64(11), int64(0), int64(0)}, "remaining = 11"},
		{"negative remaining", []any{int64(1), int64(-1), int64(0), int64(0)}, "remaining = -1"},
		{"negative reset", []any{int64(1), int64(1), int64(-5), int64(0)}, "reset after"},
		{"retry on allow", []any{int64(1), int64(1), int64(5), int64(3)}, "on an allow"},
		{"deny without retry", []any{int64(0), int64(0), int64(5), int64(0)}, "on a deny"},
	}
	for _, tc := range bad {
		if _, err := ParseReply(tc.res, p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ParseReply error = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// fakeClock is a settable clock for the breaker's cooldown.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestBreaker(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	var changes []BreakerState
	b := newBreaker(3, time.Second, clk.now, func(s BreakerState) { changes = append(changes, s) })
	b.jitter = func(d time.Duration) time.Duration { return d } // exact cooldowns; TestBreakerJitter covers the jitter

	mustAllow := func(step string, wantOK, wantProbe bool) {
		t.Helper()
		ok, probe := b.allow()
		if ok != wantOK || probe != wantProbe {
			t.Fatalf("%s: allow() = %v, %v; want %v, %v", step, ok, probe, wantOK, wantProbe)
		}
	}
	mustState := func(step string, want BreakerState) {
		t.Helper()
		if got := b.State(); got != want {
			t.Fatalf("%s: state %v, want %v", step, got, want)
		}
	}

	mustAllow("closed", true, false)
	b.failure(false, 2)
	b.success(false) // a success resets the consecutive count
	b.failure(false, 2)
	mustState("two failures after a success", BreakerClosed)
	b.failure(false, 1)
	mustState("third consecutive failure", BreakerOpen)
	mustAllow("open", false, false)

	clk.t = clk.t.Add(999 * time.Millisecond)
	mustAllow("open, cooldown not over", false, false)
	b.success(false) // a late answer to an old call does not close it
	mustState("late success", BreakerOpen)

	clk.t = clk.t.Add(time.Millisecond)
	mustAllow("cooldown over: the probe", true, true)
	mustState("probing", BreakerHalfOpen)
	mustAllow("second caller while probing", false, false)
	b.failure(true, 1)
	mustState("probe failed", BreakerOpen)
	mustAllow("open again", false, false)

	clk.t = clk.t.Add(time.Second)
	mustAllow("next probe", true, true)
	b.release(true) // the probe's caller gave up before sending
	mustState("released probe", BreakerOpen)
	mustAllow("probe again at once", true, true)
	b.success(true)
	mustState("probe succeeded", BreakerClosed)
	mustAllow("closed again", true, false)

	// A timeout opens it at once, without a cooldown: the next call is
	// the probe, the others fail fast while it is out.
	b.timedOut(false)
	mustState("a call timed out", BreakerOpen)
	mustAllow("right after the timeout: the probe", true, true)
	mustAllow("second caller while probing", false, false)
	b.timedOut(false) // another call sent before: changes nothing
	mustState("an older call timed out", BreakerHalfOpen)
	b.success(true)
	mustState("the probe answered", BreakerClosed)
	b.failure(false, 2)
	b.timedOut(false)
	mustAllow("a timeout after two failures: the probe", true, true)
	b.timedOut(true)
	mustState("the probe timed out too", BreakerOpen)
	clk.t = clk.t.Add(999 * time.Millisecond)
	mustAllow("the probe timed out: a cooldown", false, false)
	clk.t = clk.t.Add(time.Millisecond)
	mustAllow("after the cooldown", true, true)
	b.success(true)
	mustState("closed after the timeouts", BreakerClosed)
	b.failure(false, 2)
	mustState("the count starts again after a timeout's probe", BreakerClosed)

	want := []BreakerState{BreakerOpen, BreakerHalfOpen, BreakerOpen, BreakerHalfOpen, BreakerOpen, BreakerHalfOpen, BreakerClosed,
		BreakerOpen, BreakerHalfOpen, BreakerClosed, BreakerOpen, BreakerHalfOpen, BreakerOpen, BreakerHalfOpen, BreakerClosed}
	if len(changes) != len(want) {
		t.Fatalf("state changes %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("state changes %v, want %v", changes, want)
		}
	}
}

// TestBreakerJitter opens 1000 breakers at one instant, as a fleet of
// sidecars does when a shard dies, and checks that their probes spread
// over the cooldown instead of all coming at its end: each waits between
// half and one and a half cooldowns, and every tenth of that window gets
// some of them.
func TestBreakerJitter(t *testing.T) {
	t.Parallel()
	const cooldown = 500 * time.Millisecond
	clk := &fakeClock{t: time.Unix(1000, 0)}
	opened := clk.t
	var buckets [10]int
	for range 1000 {
		b := newBreaker(1, cooldown, clk.now, nil)
		clk.t = opened
		b.failure(false, 1)
		// Step a millisecond at a time to the first allowed probe.
		for {
			if ok, probe := b.allow(); ok {
				if !probe {
					t.Fatal("an open breaker let a call through that is not the probe")
				}
				break
			}
			clk.t = clk.t.Add(time.Millisecond)
		}
		wait := clk.t.Sub(opened)
		if wait < cooldown/2 || wait > cooldown*3/2 {
			t.Fatalf("probe after %v, want within [%v, %v]", wait, cooldown/2, cooldown*3/2)
		}
		buckets[min(9, int((wait-cooldown/2)*10/cooldown))]++
	}
	for i, n := range buckets {
		// 100 expected per bucket; 40 is over 6 standard deviations away.
		if n < 40 {
			t.Errorf("only %d of 1000 probes in tenth %d of the cooldown window %v: %v", n, i, cooldown, buckets)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	o := Options{
		Single:          true,
		Addrs:           []string{"a:1", "nohost"},
		Timeout:         -1,
		BatchWindow:     time.Second,
		MaxBatch:        -1,
		BreakerFailures: -1,
		BreakerCooldown: -1,
		DialTimeout:     -1,
		ClientName:      "has a space",
	}
	err := o.Validate()
	if err == nil {
		t.Fatal("Validate accepted bad options")
	}
	for _, want := range []string{"single mode", "addrs[1]", "timeout", "batchWindow", "maxBatch", "breakerFailures", "breakerCooldown", "dialTimeout", "clientName"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if err := (Options{}).Validate(); err == nil || !strings.Contains(err.Error(), "addrs") {
		t.Errorf("empty options: %v, want an addrs error", err)
	}
	d, err := Options{Addrs: []string{"127.0.0.1:1"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if d.Timeout != DefaultTimeout || d.BatchWindow != 0 || d.MaxBatch != DefaultMaxBatch ||
		d.BreakerFailures != DefaultBreakerFailures || d.BreakerCooldown != DefaultBreakerCooldown {
		t.Errorf("defaults = %+v", d)
	}
	if d, _ := (Options{Addrs: []string{"127.0.0.1:1"}, BatchWindow: DefaultBatchWindow}).withDefaults(); d.BatchWindow != DefaultBatchWindow {
		t.Errorf("BatchWindow %v became %v", DefaultBatchWindow, d.BatchWindow)
	}
	for _, name := range []string{"tab\there", "naïve", strings.Repeat("n", 257)} {
		if err := (Options{Addrs: []string{"127.0.0.1:1"}, ClientName: name}).Validate(); err == nil || !strings.Contains(err.Error(), "clientName") {
			t.Errorf("client name %q: %v, want a clientName error", name, err)
		}
	}
	if d.ClientName != DefaultClientName() || !strings.HasPrefix(d.ClientName, "floodgate-sidecar") {
		t.Errorf("default client name %q, want DefaultClientName() = %q", d.ClientName, DefaultClientName())
	}
	if err := (Options{Addrs: []string{"127.0.0.1:1"}, BatchWindow: -time.Microsecond}).Validate(); err == nil || !strings.Contains(err.Error(), "batchWindow") {
		t.Errorf("negative batch window: %v, want a batchWindow error", err)
	}
	for _, bad := range []string{"A", "a/b", "a*", "a{"} {
		if _, err := New(Options{Addrs: []string{"127.0.0.1:1"}, KeySpace: bad}); err == nil || !strings.Contains(err.Error(), "keySpace") {
			t.Errorf("New with key space %q: %v, want a keySpace error", bad, err)
		}
	}
}

// TestAppendCommand writes FCALL; FUNCTION LOAD then FCALL after
// "Function not found"; and FUNCTION LOAD, ASKING, FCALL after an ASK
// too, as commands that a RESP reader reads back as the intended
// arguments, with Prelude counting what goes before the FCALL.
func TestAppendCommand(t *testing.T) {
	t.Parallel()
	p, err := limiter.NewParams(limiter.Limit{Algorithm: limiter.GCRA, Requests: 10, Period: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	la := newLimitArgs(p)
	o := &op{la: la, key: "fg:{k}:gcra:2", now: "", n: 3}
	b := o.AppendCommand(nil)
	if o.Prelude() != 0 {
		t.Errorf("Prelude() = %d, want 0", o.Prelude())
	}
	o.load, o.now = true, "1700000000000000"
	b = o.AppendCommand(b)
	if o.Prelude() != 1 {
		t.Errorf("Prelude() after Function not found = %d, want 1", o.Prelude())
	}
	o.asking = true
	b = o.AppendCommand(b)
	if o.Prelude() != 2 {
		t.Errorf("Prelude() after an ASK too = %d, want 2", o.Prelude())
	}
	fn := la.sc.Function()
	_, lib := redislayout.Library()
	r := bufio.NewReader(strings.NewReader(string(b)))
	want := [][]any{
		append([]any{"FCALL", fn, "1", "fg:{k}:gcra:2", "", "3"}, toAny(la.tail)...),
		{"FUNCTION", "LOAD", lib},
		append([]any{"FCALL", fn, "1", "fg:{k}:gcra:2", "1700000000000000", "3"}, toAny(la.tail)...),
		{"FUNCTION", "LOAD", lib},
		{"ASKING"},
		append([]any{"FCALL", fn, "1", "fg:{k}:gcra:2", "1700000000000000", "3"}, toAny(la.tail)...),
	}
	for i, w := range want {
		v, err := resp.ReadValue(r)
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		if !reflect.DeepEqual(v, w) {
			t.Errorf("command %d = %q, want %q", i, v, w)
		}
	}
	if r.Buffered() != 0 {
		t.Errorf("%d bytes left over", r.Buffered())
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
