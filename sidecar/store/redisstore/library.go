package redisstore

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore/internal/resp"
)

// The counter scripts run as Redis 7 Functions, one library of them all,
// called with FCALL. A store user then needs FCALL alone, never EVAL,
// EVALSHA, SCRIPT or FUNCTION: it can run these functions and no code of
// its own, so no credential a tenant holds can run a script that loops or
// touches keys the functions would not.
//
// Each script (lua/*.lua, whose header lists its KEYS, ARGV and reply)
// becomes one local Lua function of the library, its body unchanged, with
// KEYS and ARGV as its parameters. Its entry points are registered under
// fg_<version>_<id>: for an algorithm that can lease, its take
// (fg_<version>_gcra, say: the body's lease of m = n tokens giving back
// none, answering the reply's first four values) and its lease
// (fg_<version>_lease_gcra), one body; otherwise the body itself. The
// library is floodgate_<version>, the version being the first 48 bits of
// the SHA-1 of every script's id and source: an edit to any script makes a
// new library whose functions have new names, so that sidecars of two
// releases, during a rolling upgrade, each call their own. An older
// library stays loaded, unused, until an operator deletes it (FUNCTION
// DELETE).
//
// Who loads it: the manager, on every master of a managed store, before it
// gives the sidecars their credentials (and again on each reconcile, for
// new masters); replicas get it by replication. A store user allowed to
// (an external store's, say) loads it itself: a call answered "Function not
// found" is sent once more after FUNCTION LOAD, whose own answer is
// ignored (another sidecar may have loaded it first). A user without
// FUNCTION LOAD gets the call failed as unavailable, so its rule's failure
// mode decides until the library is there.

// libraryScripts are the library's functions, in a fixed order.
var libraryScripts = []*script{
	scripts[1], scripts[2], scripts[3], scripts[4], scripts[5],
	leaseScripts[1], leaseScripts[2], leaseScripts[3], leaseScripts[4],
	acquireScript, releaseScript,
}

// library is the assembled library: its name, source, and FUNCTION LOAD
// in RESP.
var library = buildLibrary(libraryScripts)

type lib struct {
	version, name, src string
	load               []byte
}

// function returns the name of sc's function in the library.
func (sc *script) function() string { return "fg_" + library.version + "_" + sc.id }

// buildLibrary returns the library that registers the functions of scs.
func buildLibrary(scs []*script) lib {
	h := sha1.New()
	for _, sc := range scs {
		h.Write([]byte(sc.id))
		h.Write([]byte{0})
		h.Write([]byte(sc.src))
		h.Write([]byte{0})
	}
	version := hex.EncodeToString(h.Sum(nil))[:12]
	var b strings.Builder
	b.WriteString("#!lua name=floodgate_" + version + "\n")
	defined := map[string]bool{}
	for _, sc := range scs {
		if !defined[sc.bodyID] {
			defined[sc.bodyID] = true
			b.WriteString("\nlocal function " + sc.bodyID + "(KEYS, ARGV)\n")
			b.WriteString(sc.body)
			if !strings.HasSuffix(sc.body, "\n") {
				b.WriteString("\n")
			}
			b.WriteString("end\n")
		}
		fn := "fg_" + version + "_" + sc.id
		switch sc.entry {
		case take:
			b.WriteString("redis.register_function('" + fn + "', function(KEYS, ARGV)\n" + fmt.Sprintf(takeCall, sc.bodyID) + "end)\n")
		default:
			b.WriteString("redis.register_function('" + fn + "', " + sc.bodyID + ")\n")
		}
	}
	l := lib{version: version, name: "floodgate_" + version, src: b.String()}
	l.load = resp.AppendBulk(resp.AppendBulk(resp.AppendBulk(resp.AppendArray(nil, 3), "FUNCTION"), "LOAD"), l.src)
	return l
}

// Library returns the name and source of the counter functions' library:
// what the manager loads (FUNCTION LOAD) on a managed store's masters.
func Library() (name, src string) { return library.name, library.src }
