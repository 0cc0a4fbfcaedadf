package redisstore

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// The Lua scripts, one per algorithm. Each one's header lists its KEYS,
// ARGV and reply; all share one calling convention (see limitArgs) and one
// reply shape (see parseReply).
var (
	//go:embed lua/tokenbucket.lua
	tokenBucketLua string
	//go:embed lua/gcra.lua
	gcraLua string
	//go:embed lua/fixedwindow.lua
	fixedWindowLua string
	//go:embed lua/slidingwindow.lua
	slidingWindowLua string
	//go:embed lua/slidinglog.lua
	slidingLogLua string
)

// script is a Lua script and its SHA1, the EVALSHA handle. The any
// fields are the same strings boxed once, for command arguments.
type script struct {
	name, src, sha string
	srcArg, shaArg any
}

func newScript(name, src string) *script {
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	return &script{name: name, src: src, sha: sha, srcArg: src, shaArg: sha}
}

// scripts are indexed by limiter.Algorithm.
var scripts = [...]*script{
	limiter.TokenBucket:   newScript("TokenBucket", tokenBucketLua),
	limiter.GCRA:          newScript("GCRA", gcraLua),
	limiter.FixedWindow:   newScript("FixedWindow", fixedWindowLua),
	limiter.SlidingWindow: newScript("SlidingWindow", slidingWindowLua),
	limiter.SlidingLog:    newScript("SlidingLog", slidingLogLua),
}

// Script returns the Lua source and SHA1 of an algorithm's script, for
// tools that load or benchmark it outside the store. ok is false for an
// unknown algorithm.
func Script(alg limiter.Algorithm) (src, sha string, ok bool) {
	if int(alg) >= len(scripts) || scripts[alg] == nil {
		return "", "", false
	}
	return scripts[alg].src, scripts[alg].sha, true
}

// numArgs is the length of every script's ARGV.
const numArgs = 10

// limitArgs is a limit's validated parameters, its script, and the
// constant part of its ARGV (C, P, q, U, K, CU, FT, PW), boxed once.
type limitArgs struct {
	p    *limiter.Params
	sc   *script
	tail []any
}

func newLimitArgs(p *limiter.Params) *limitArgs {
	return &limitArgs{
		p:  p,
		sc: scripts[p.Limit.Algorithm],
		tail: []any{p.Capacity, p.PeriodMicros, p.TickMicros, p.TickUnits,
			p.TokenUnits, p.CapacityUnits, p.FullTicks, p.WindowTicks},
	}
}

// command returns the whole EVALSHA command of one decision: EVALSHA sha 1
// key, then ARGV: now (µs, or "" for Redis TIME), n, C, P, q, U, K, CU, FT,
// PW. Every script takes the same ten ARGV; each reads what its algorithm
// needs.
func (la *limitArgs) command(key string, nowUs int64, haveNow bool, n int64) []any {
	var now any = ""
	if haveNow {
		now = nowUs
	}
	a := make([]any, 0, 4+numArgs)
	a = append(a, "evalsha", la.sc.shaArg, 1, key, now, n)
	return append(a, la.tail...)
}

// evalCommand turns an EVALSHA command into the EVAL of the same script.
func evalCommand(evalsha []any, sc *script) []any {
	a := make([]any, len(evalsha))
	copy(a, evalsha)
	a[0], a[1] = "eval", sc.srcArg
	return a
}

// ScriptArgs returns the ARGV a script takes for a request of cost n at
// nowUs under p, as strings, for tools such as redis-benchmark. A negative
// nowUs leaves "now" empty, so the script reads Redis TIME.
func ScriptArgs(p *limiter.Params, nowUs, n int64) []string {
	cmd := newLimitArgs(p).command("", nowUs, nowUs >= 0, n)
	out := make([]string, 0, numArgs)
	for _, a := range cmd[4:] {
		out = append(out, fmt.Sprint(a))
	}
	return out
}

// parseReply checks a script's reply, {allowed, remaining, reset_us,
// retry_us}, and turns it into a Decision.
func parseReply(res any, p *limiter.Params) (limiter.Decision, error) {
	arr, ok := res.([]any)
	if !ok {
		return limiter.Decision{}, fmt.Errorf("reply is %T, want an array of 4 integers", res)
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
	allowed, remaining, reset, retry := v[0], v[1], v[2], v[3]
	switch {
	case allowed != 0 && allowed != 1:
		return limiter.Decision{}, fmt.Errorf("reply allowed = %d, want 0 or 1", allowed)
	case remaining < 0 || remaining > p.Capacity:
		return limiter.Decision{}, fmt.Errorf("reply remaining = %d, want 0 to %d", remaining, p.Capacity)
	case reset < 0:
		return limiter.Decision{}, fmt.Errorf("reply reset after = %dµs, want >= 0", reset)
	case allowed == 1 && retry != 0:
		return limiter.Decision{}, fmt.Errorf("reply retry after = %dµs on an allow, want 0", retry)
	case allowed == 0 && retry < 1:
		return limiter.Decision{}, fmt.Errorf("reply retry after = %dµs on a deny, want >= 1µs", retry)
	}
	return limiter.Decision{
		Allowed:    allowed == 1,
		Limit:      p.Capacity,
		Remaining:  remaining,
		ResetAfter: time.Duration(reset) * time.Microsecond,
		RetryAfter: time.Duration(retry) * time.Microsecond,
	}, nil
}
