package envoyrls

import (
	"testing"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Counter keys never change (see package descriptor): this key was
// computed by the server before its hash moved into package descriptor.
func TestDescriptorKeysAreStable(t *testing.T) {
	t.Parallel()
	es := []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}, {Key: "path", Value: "/örders"}, {Key: "empty", Value: ""}}
	h, _ := entriesHash(es, nil)
	if got, want := h.Key("uid-1:r:"), "uid-1:r:aa13a6180a9abdba2ca56107d079d117"; got != want {
		t.Errorf("key %s, want %s", got, want)
	}
	// The buffer is reused, and the hash is of these entries only.
	h2, _ := entriesHash(es[:1], make([]byte, 0, 8))
	if h2 == h {
		t.Error("a prefix of the entries has the same hash")
	}
}
