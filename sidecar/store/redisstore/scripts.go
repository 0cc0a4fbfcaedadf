package redisstore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/resp"
)

// script is one entry point of the counter functions' library.
type script = redislayout.Script

// libraryLoad is FUNCTION LOAD of the library, in RESP: what a call
// answered "Function not found" sends first.
var libraryLoad = func() []byte {
	_, src := redislayout.Library()
	return resp.Command("FUNCTION", "LOAD", src)
}()

// limitArgs is a limit's validated parameters, its script, and the
// constant part of its ARGV, formatted once: as decimal strings, and as
// RESP for the pipelined connections, which also get the command's head
// (FCALL, the function, the key count) ready.
type limitArgs struct {
	p        *limiter.Params
	sc       *script
	tail     []string
	head     []byte // *<n>, FCALL, function, 1
	tailRESP []byte
}

func newLimitArgs(p *limiter.Params) *limitArgs {
	return buildLimitArgs(p, redislayout.Takes[p.Limit.Algorithm], 0)
}

// buildLimitArgs is newLimitArgs for script sc, whose ARGV has extra
// arguments after the limit's constants (an op's lease arguments).
func buildLimitArgs(p *limiter.Params, sc *script, extra int) *limitArgs {
	var tail []int64
	switch p.Limit.Algorithm {
	case limiter.TokenBucket, limiter.GCRA:
		tail = []int64{p.Capacity, p.PeriodMicros, p.TickMicros, p.TickUnits, p.TokenUnits, p.CapacityUnits, p.FullTicks}
		if p.MaxDelayMicros > 0 {
			// A delaying take: no lease arguments (m = n, nothing given
			// back), then MD and MR (lua/gcra.lua).
			tail = append(tail, 0, 0, 0, p.MaxDelayMicros, p.MaxReserve)
		}
	case limiter.SlidingWindow:
		tail = []int64{p.Capacity, p.PeriodMicros, p.TickMicros, p.WindowTicks}
	default: // FixedWindow, SlidingLog
		tail = []int64{p.Capacity, p.PeriodMicros}
	}
	la := &limitArgs{p: p, sc: sc, tail: make([]string, len(tail))}
	for i, v := range tail {
		la.tail[i] = strconv.FormatInt(v, 10)
		la.tailRESP = resp.AppendBulk(la.tailRESP, la.tail[i])
	}
	la.head = fcallHead(sc, len(tail)+extra)
	return la
}

// fcallHead is the RESP head of a call of sc's function with args ARGV
// after now and n: FCALL function 1; the key, now, n and the args follow.
func fcallHead(sc *script, args int) []byte {
	return resp.AppendBulk(resp.AppendBulk(resp.AppendBulk(resp.AppendArray(nil, 6+args), "FCALL"), sc.Function()), "1")
}

// ScriptArgs returns the ARGV a script takes for a request of cost n at
// nowUs under p, as strings, for tools such as redis-benchmark: now (µs,
// or "" for Redis TIME), n, then the limit's constants (each script's
// header lists them). A negative nowUs leaves "now" empty, so the script
// reads Redis TIME.
func ScriptArgs(p *limiter.Params, nowUs, n int64) []string {
	la := newLimitArgs(p)
	now := ""
	if nowUs >= 0 {
		now = strconv.FormatInt(nowUs, 10)
	}
	return append([]string{now, strconv.FormatInt(n, 10)}, la.tail...)
}

// ParseReply checks a script's reply, {allowed, remaining, reset_us,
// retry_us}, as a RESP2 client gives it ([]any of int64), and turns it into
// a Decision under p, for tools that run the scripts outside the store.
// Every element is type-checked and every value bounded.
func ParseReply(res any, p *limiter.Params) (limiter.Decision, error) {
	arr, ok := res.([]any)
	if !ok {
		if re, isErr := res.(resp.Error); isErr {
			return limiter.Decision{}, fmt.Errorf("reply is an error, %q, want an array of 4 integers", string(re))
		}
		return limiter.Decision{}, fmt.Errorf("reply is %T (%v), want an array of 4 integers", res, res)
	}
	if len(arr) != 4 {
		return limiter.Decision{}, fmt.Errorf("reply has %d elements, want 4", len(arr))
	}
	var v [4]int64
	for i, e := range arr {
		n, ok := e.(int64)
		if !ok {
			return limiter.Decision{}, fmt.Errorf("reply element %d is %T (%v), want an integer", i, e, e)
		}
		v[i] = n
	}
	return checkReply(v, p)
}

// checkReply checks a script's answer, {allowed, remaining, reset_us,
// retry_us}, and turns it into a Decision.
func checkReply(v [4]int64, p *limiter.Params) (limiter.Decision, error) {
	allowed, remaining, reset, retry := v[0], v[1], v[2], v[3]
	switch {
	case allowed != 0 && allowed != 1:
		return limiter.Decision{}, fmt.Errorf("reply allowed = %d, want 0 or 1", allowed)
	case remaining < 0 || remaining > p.Capacity:
		return limiter.Decision{}, fmt.Errorf("reply remaining = %d, want 0 to %d", remaining, p.Capacity)
	case reset < 0:
		return limiter.Decision{}, fmt.Errorf("reply reset after = %dµs, want >= 0", reset)
	case allowed == 1 && p.MaxDelayMicros > 0 && (retry < 0 || retry > p.MaxDelayMicros):
		return limiter.Decision{}, fmt.Errorf("reply wait = %dµs, want 0 to %dµs", retry, p.MaxDelayMicros)
	case allowed == 1 && p.MaxDelayMicros == 0 && retry != 0:
		return limiter.Decision{}, fmt.Errorf("reply retry after = %dµs on an allow, want 0", retry)
	case allowed == 0 && retry < 1:
		return limiter.Decision{}, fmt.Errorf("reply retry after = %dµs on a deny, want >= 1µs", retry)
	}
	d := limiter.Decision{
		Allowed:    allowed == 1,
		Limit:      p.Capacity,
		Remaining:  remaining,
		ResetAfter: time.Duration(reset) * time.Microsecond,
	}
	if d.Allowed {
		d.Wait = time.Duration(retry) * time.Microsecond
	} else {
		d.RetryAfter = time.Duration(retry) * time.Microsecond
	}
	return d, nil
}

// libraryName is the counter functions' library's name.
func libraryName() string {
	name, _ := redislayout.Library()
	return name
}
