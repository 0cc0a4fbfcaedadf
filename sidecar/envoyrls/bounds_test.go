package envoyrls_test

import (
	"testing"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/envoyrls"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// A call beyond the bounds is INVALID_ARGUMENT on the grounds that no rule
// could match it: each bound must be at least the config's for the same
// thing, or a valid rule would be unreachable.
func TestCallBoundsCoverTheConfigBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		call, conf int64
	}{
		{"domain length", envoyrls.MaxDomainLength, config.MaxDomainLength},
		{"entries", envoyrls.MaxEntries, config.MaxDescriptorEntries},
		{"entry key length", envoyrls.MaxKeyLength, config.MaxDescriptorKeyLength},
		{"entry value length", envoyrls.MaxValueLength, config.MaxDescriptorValueLength},
		{"cost", envoyrls.MaxCost, limiter.MaxRequests},
	} {
		if tc.call < tc.conf {
			t.Errorf("%s: a call may have %d, a rule %d", tc.name, tc.call, tc.conf)
		}
	}
}
