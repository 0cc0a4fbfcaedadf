package redislayout

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// The Lua scripts, one per algorithm and two for concurrency slots. Each
// one's header lists its KEYS, ARGV and reply; all share one calling
// convention (the key, now, an integer, then constants) and one reply
// shape. The four algorithms that can lease hold their take and their
// lease in one body (the take is the lease of m = n tokens giving back
// none), so that each algorithm's arithmetic is written once.
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
	//go:embed lua/concurrency_acquire.lua
	concurrencyAcquireLua string
	//go:embed lua/concurrency_release.lua
	concurrencyReleaseLua string
)

// Script is one entry point of a Lua body: a function of the library
// (Library), and, for tools that run it with EVALSHA, its source and SHA1.
type Script struct {
	// ID names its function in the library (Function), Name it in
	// messages.
	ID, Name string
	// Body is the Lua file, a local function of the library named BodyID;
	// Take says that this entry point runs the body's lease as a take.
	Body, BodyID string
	Take         bool
	// Src and SHA are the entry point as a script of its own.
	Src, SHA string
}

// takeCall runs a leasable body as a take: the reply's elements from the
// fifth on are cut (Redis ends a reply array at the first nil), and an
// error reply passes through.
const takeCall = "local v = %s(KEYS, ARGV)\nv[5] = nil\nreturn v\n"

func newScript(id, name, body, bodyID string, take bool) *Script {
	src := body
	if take {
		src = "local function " + bodyID + "(KEYS, ARGV)\n" + body + "end\n" + fmt.Sprintf(takeCall, bodyID)
	}
	sum := sha1.Sum([]byte(src))
	return &Script{ID: id, Name: name, Body: body, BodyID: bodyID, Take: take, Src: src, SHA: hex.EncodeToString(sum[:])}
}

// Function returns the name of the entry point's function in the library.
func (sc *Script) Function() string { return "fg_" + library.version + "_" + sc.ID }

// Takes are the algorithms' take entry points, indexed by
// limiter.Algorithm: ARGV now, n, then the limit's constants.
var Takes = [...]*Script{
	limiter.TokenBucket:   newScript("tokenbucket", "TokenBucket", tokenBucketLua, "tokenbucket", true),
	limiter.GCRA:          newScript("gcra", "GCRA", gcraLua, "gcra", true),
	limiter.FixedWindow:   newScript("fixedwindow", "FixedWindow", fixedWindowLua, "fixedwindow", true),
	limiter.SlidingWindow: newScript("slidingwindow", "SlidingWindow", slidingWindowLua, "slidingwindow", true),
	limiter.SlidingLog:    newScript("slidinglog", "SlidingLog", slidingLogLua, "slidinglog", false),
}

// Leases are the lease entry points, one per algorithm that can lease
// (limiter.Algorithm.Leasable), indexed by limiter.Algorithm: the
// algorithm's body itself, with the limit's constants and then want,
// return and window as ARGV (its header lists them).
var Leases = [...]*Script{
	limiter.TokenBucket:   newScript("lease_tokenbucket", "TokenBucket lease", tokenBucketLua, "tokenbucket", false),
	limiter.GCRA:          newScript("lease_gcra", "GCRA lease", gcraLua, "gcra", false),
	limiter.FixedWindow:   newScript("lease_fixedwindow", "FixedWindow lease", fixedWindowLua, "fixedwindow", false),
	limiter.SlidingWindow: newScript("lease_slidingwindow", "SlidingWindow lease", slidingWindowLua, "slidingwindow", false),
	limiter.SlidingLog:    nil,
}

// Acquire and Release are the concurrency slots' entry points, with the
// lease id as the integer after now.
var (
	Acquire = newScript("concurrency_acquire", "ConcurrencyAcquire", concurrencyAcquireLua, "concurrency_acquire", false)
	Release = newScript("concurrency_release", "ConcurrencyRelease", concurrencyReleaseLua, "concurrency_release", false)
)

// TakeScript returns the Lua source and SHA1 of an algorithm's take as a
// script of its own, and the name of its function in Library, for tools
// that run it outside the store (with EVALSHA, or FCALL). ok is false for
// an unknown algorithm.
func TakeScript(alg limiter.Algorithm) (src, sha, function string, ok bool) {
	if int(alg) >= len(Takes) || Takes[alg] == nil {
		return "", "", "", false
	}
	return Takes[alg].Src, Takes[alg].SHA, Takes[alg].Function(), true
}

// The counter scripts run as Redis 7 Functions, one library of them all,
// called with FCALL. A store user then needs FCALL alone, never EVAL,
// EVALSHA, SCRIPT or FUNCTION: it can run these functions and no code of
// its own, so no credential a tenant holds can run a script that loops or
// touches keys the functions would not.
//
// Each body (lua/*.lua) becomes one local Lua function of the library,
// unchanged, with KEYS and ARGV as its parameters. Its entry points are
// registered under fg_<version>_<id>: for an algorithm that can lease, its
// take (fg_<version>_gcra, say) and its lease (fg_<version>_lease_gcra),
// one body; otherwise the body itself. The library is floodgate_<version>,
// the version being the first 48 bits of the SHA-1 of every entry point's
// id and source: an edit to any script makes a new library whose functions
// have new names, so that sidecars of two releases, during a rolling
// upgrade, each call their own. An older library stays loaded, unused,
// until an operator deletes it (FUNCTION DELETE).
//
// Who loads it: the manager, on every master of a managed store, before it
// gives the sidecars their credentials (and again on each reconcile, for
// new masters); replicas get it by replication. A store user allowed to
// (an external store's, say) loads it itself after "Function not found"
// (package redisstore).

// libraryScripts are the library's entry points, in a fixed order.
var libraryScripts = []*Script{
	Takes[1], Takes[2], Takes[3], Takes[4], Takes[5],
	Leases[1], Leases[2], Leases[3], Leases[4],
	Acquire, Release,
}

// library is the assembled library.
var library = buildLibrary(libraryScripts)

type lib struct{ version, name, src string }

// buildLibrary returns the library that registers the entry points scs.
func buildLibrary(scs []*Script) lib {
	h := sha1.New()
	for _, sc := range scs {
		h.Write([]byte(sc.ID))
		h.Write([]byte{0})
		h.Write([]byte(sc.Src))
		h.Write([]byte{0})
	}
	version := hex.EncodeToString(h.Sum(nil))[:12]
	var b strings.Builder
	b.WriteString("#!lua name=floodgate_" + version + "\n")
	defined := map[string]bool{}
	for _, sc := range scs {
		if !defined[sc.BodyID] {
			defined[sc.BodyID] = true
			b.WriteString("\nlocal function " + sc.BodyID + "(KEYS, ARGV)\n")
			b.WriteString(sc.Body)
			if !strings.HasSuffix(sc.Body, "\n") {
				b.WriteString("\n")
			}
			b.WriteString("end\n")
		}
		fn := "fg_" + version + "_" + sc.ID
		if sc.Take {
			b.WriteString("redis.register_function('" + fn + "', function(KEYS, ARGV)\n" + fmt.Sprintf(takeCall, sc.BodyID) + "end)\n")
		} else {
			b.WriteString("redis.register_function('" + fn + "', " + sc.BodyID + ")\n")
		}
	}
	return lib{version: version, name: "floodgate_" + version, src: b.String()}
}

// Library returns the name and source of the counter functions' library:
// what the manager loads (FUNCTION LOAD) on a managed store's masters.
func Library() (name, src string) { return library.name, library.src }
