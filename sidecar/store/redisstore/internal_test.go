package redisstore

import (
	"bufio"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/resp"
)

func TestKeyTag(t *testing.T) {
	t.Parallel()
	plain := []string{
		"3f2a6c1e-8d1b-4c55-9a51-1b7e2f0c9d4e:per-user:9c2f1a7b3e4d5f60",
		"a", "uid:rule:" + strings.Repeat("f", MaxKeyTag-9),
	}
	for _, k := range plain {
		if got := keyTag(k); got != k {
			t.Errorf("keyTag(%q) = %q, want it verbatim", k, got)
		}
	}
	hashed := []string{
		"", "a{b}c", "{", "}", "{}", "#abc", "a b", "a\tb", "a\x00b", "\xff\xfe",
		"naïve", strings.Repeat("x", MaxKeyTag+1), strings.Repeat("k", 64<<10),
	}
	seen := map[string]string{}
	for _, k := range hashed {
		got := keyTag(k)
		if len(got) != 33 || got[0] != '#' || strings.ContainsAny(got, "{}") {
			t.Errorf("keyTag(%q) = %q, want # and 32 hex digits", k, got)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("keyTag(%q) = keyTag(%q) = %q", k, prev, got)
		}
		seen[got] = k
	}
	if got, want := len(CounterKey(strings.Repeat("k", 1<<20), limiter.GCRA)), len("fg:{")+33+len("}:gcra:2"); got != want {
		t.Errorf("key of a 1 MiB Request.Key is %d bytes, want %d", got, want)
	}
	longest := Keys{Space: strings.Repeat("n", MaxKeySpace)}
	if got := len(longest.Counter(plain[2], limiter.GCRA)); got != MaxRedisKeyLen {
		t.Errorf("longest verbatim key is %d bytes, MaxRedisKeyLen = %d", got, MaxRedisKeyLen)
	}
}

// TestKeySpaces: a key space goes first in every key's hash tag, verbatim
// whatever the Request.Key (a hashed tag too), so that the space's ACL
// pattern covers all of its keys and none of another space's, however the
// spaces' names overlap.
func TestKeySpaces(t *testing.T) {
	t.Parallel()
	keys := []string{"pol:rule:abc", strings.Repeat("k", 1<<12), "{brace}", "#hash", "tenant-b/x", "*", ""}
	spaces := []string{"team", "team-a", "team-b", "a"}
	for _, sp := range spaces {
		k := Keys{Space: sp}
		pat := strings.TrimPrefix(k.Pattern(), "~")
		for _, key := range keys {
			names := []string{k.Counter(key, limiter.GCRA), k.Counter(key, limiter.SlidingLog), k.Slots(key)}
			for _, name := range names {
				if !globMatch(pat, name) {
					t.Errorf("space %q: %s is not covered by its pattern %s", sp, name, pat)
				}
				for _, other := range spaces {
					if other != sp && globMatch(strings.TrimPrefix(Keys{Space: other}.Pattern(), "~"), name) {
						t.Errorf("space %q's key %s is covered by space %q's pattern", sp, name, other)
					}
				}
				// The slot is the hash tag's, which holds the space.
				tag := name[strings.IndexByte(name, '{')+1 : strings.IndexByte(name, '}')]
				if !strings.HasPrefix(tag, sp+"/") || k.Slot(key) != int(crc16(tag)%16384) {
					t.Errorf("space %q: %s has tag %q, slot %d", sp, name, tag, k.Slot(key))
				}
			}
		}
	}
	for _, bad := range []string{"A", "-a", "a-", "a/b", "a*", "a{", strings.Repeat("a", MaxKeySpace+1)} {
		if err := ValidKeySpace(bad); err == nil {
			t.Errorf("ValidKeySpace(%q) = nil", bad)
		}
		if _, err := New(Options{Addrs: []string{"127.0.0.1:1"}, KeySpace: bad}); err == nil || !strings.Contains(err.Error(), "keySpace") {
			t.Errorf("New with key space %q: %v, want a keySpace error", bad, err)
		}
	}
}

// globMatch is Redis's glob for ACL key patterns, for the patterns Keys
// makes: a literal prefix and a final '*'.
func globMatch(pat, s string) bool {
	prefix, ok := strings.CutSuffix(pat, "*")
	if !ok || strings.ContainsAny(prefix, "*?[\\") {
		panic("unexpected pattern " + pat)
	}
	return strings.HasPrefix(s, prefix)
}

func TestCRC16(t *testing.T) {
	t.Parallel()
	// The check value of CRC-16/XMODEM, and the example of the Redis
	// Cluster specification.
	if got, want := crc16("123456789"), uint16(0x31C3); got != want {
		t.Errorf("crc16(123456789) = %#x, want %#x", got, want)
	}
}

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
}

func TestScriptsEmbedded(t *testing.T) {
	t.Parallel()
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow, limiter.SlidingLog} {
		src, sha, fn, ok := Script(alg)
		if !ok || len(sha) != 40 || !strings.Contains(src, "KEYS[1]") || !strings.Contains(src, "-- Reply:") {
			t.Errorf("%v: script missing or without its header (ok=%v, sha=%q)", alg, ok, sha)
		}
		_, lib := Library()
		if !strings.Contains(lib, "redis.register_function('"+fn+"', ") || !strings.Contains(lib, scripts[alg].body) {
			t.Errorf("%v: function %q or its body is not in the library", alg, fn)
		}
		// A leasable algorithm's take and lease share one body, defined
		// once in the library.
		if l := leaseScripts[alg]; l != nil {
			if l.body != scripts[alg].body || strings.Count(lib, "local function "+l.bodyID+"(") != 1 {
				t.Errorf("%v: the take and the lease do not share one body", alg)
			}
			if !strings.Contains(src, "v[5] = nil") {
				t.Errorf("%v: the take's own script does not cut the lease's reply", alg)
			}
		}
	}
	if _, _, _, ok := Script(0); ok {
		t.Error("Script(0) ok")
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
	fn := la.sc.function()
	_, lib := Library()
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
