package redislayout

import (
	"strconv"
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

func TestScriptsEmbedded(t *testing.T) {
	t.Parallel()
	for _, alg := range []limiter.Algorithm{limiter.TokenBucket, limiter.GCRA, limiter.FixedWindow, limiter.SlidingWindow, limiter.SlidingLog} {
		src, sha, fn, ok := TakeScript(alg)
		if !ok || len(sha) != 40 || !strings.Contains(src, "KEYS[1]") || !strings.Contains(src, "-- Reply:") {
			t.Errorf("%v: script missing or without its header (ok=%v, sha=%q)", alg, ok, sha)
		}
		_, lib := Library()
		if !strings.Contains(lib, "redis.register_function('"+fn+"', ") || !strings.Contains(lib, Takes[alg].Body) {
			t.Errorf("%v: function %q or its body is not in the library", alg, fn)
		}
		// A leasable algorithm's take and lease share one body, defined
		// once in the library.
		if l := Leases[alg]; l != nil {
			if l.Body != Takes[alg].Body || strings.Count(lib, "local function "+l.BodyID+"(") != 1 {
				t.Errorf("%v: the take and the lease do not share one body", alg)
			}
			if !strings.Contains(src, "v[5] = nil") {
				t.Errorf("%v: the take's own script does not cut the lease's reply", alg)
			}
		}
	}
	if _, _, _, ok := TakeScript(0); ok {
		t.Error("TakeScript(0) ok")
	}
}

// TestSlidingLogBound: the one function that loops over its cost refuses a
// capacity above limiter.MaxLogRequests itself, whatever ARGV a store user
// sends, so no call can add more entries than a valid limit could.
func TestSlidingLogBound(t *testing.T) {
	t.Parallel()
	body := Takes[limiter.SlidingLog].Body
	if want := "C > " + strconv.Itoa(limiter.MaxLogRequests); !strings.Contains(body, want) {
		t.Errorf("slidinglog.lua does not refuse a capacity above limiter.MaxLogRequests (%q)", want)
	}
}
