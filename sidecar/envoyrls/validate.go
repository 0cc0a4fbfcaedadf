package envoyrls

import (
	"errors"
	"fmt"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// Bounds on a call. Anything beyond them is INVALID_ARGUMENT: no rule can
// match it (config entries are shorter), and it bounds the work of a call.
const (
	MaxDomainLength       = 1024
	MaxDescriptors        = 64
	MaxEntries            = 32
	MaxKeyLength          = 1024
	MaxValueLength        = 16 << 10
	MaxCost         int64 = limiter.MaxRequests
	// MaxRequestValueLength bounds an entry value of a request
	// descriptor, which carries a request's path and headers: the
	// largest header block Envoy accepts (96 KiB), so that no request a
	// gateway passes on is refused here, which Envoy would admit.
	MaxRequestValueLength = 96 << 10
)

// Validate reports why a call is malformed, or nil.
func Validate(req *rlsv3.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return errors.New("domain must not be empty")
	}
	if len(req.Domain) > MaxDomainLength {
		return fmt.Errorf("domain: at most %d bytes, got %d", MaxDomainLength, len(req.Domain))
	}
	if len(req.Descriptors) == 0 {
		return errors.New("descriptors must not be empty")
	}
	if len(req.Descriptors) > MaxDescriptors {
		return fmt.Errorf("descriptors: at most %d, got %d", MaxDescriptors, len(req.Descriptors))
	}
	if int64(req.HitsAddend) > MaxCost {
		return fmt.Errorf("hits_addend: at most %d, got %d", MaxCost, req.HitsAddend)
	}
	for i, d := range req.Descriptors {
		if d == nil || len(d.Entries) == 0 {
			return fmt.Errorf("descriptors[%d]: entries must not be empty", i)
		}
		if len(d.Entries) > MaxEntries {
			return fmt.Errorf("descriptors[%d]: at most %d entries, got %d", i, MaxEntries, len(d.Entries))
		}
		maxValue := MaxValueLength
		if isRequest(d) {
			maxValue = MaxRequestValueLength
		}
		for j, e := range d.Entries {
			switch {
			case e == nil || e.Key == "":
				return fmt.Errorf("descriptors[%d].entries[%d]: key must not be empty", i, j)
			case len(e.Key) > MaxKeyLength:
				return fmt.Errorf("descriptors[%d].entries[%d]: key: at most %d bytes, got %d", i, j, MaxKeyLength, len(e.Key))
			case len(e.Value) > maxValue:
				return fmt.Errorf("descriptors[%d].entries[%d]: value: at most %d bytes, got %d", i, j, maxValue, len(e.Value))
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.Value > uint64(MaxCost) {
			return fmt.Errorf("descriptors[%d].hits_addend: at most %d, got %d", i, MaxCost, h.Value)
		}
		if d.IsNegativeHits {
			return fmt.Errorf("descriptors[%d].is_negative_hits: refunds are not supported", i)
		}
		if d.Limit != nil {
			return fmt.Errorf("descriptors[%d].limit: limit overrides are not supported; set the limit in the policy", i)
		}
	}
	return nil
}

// costOf returns descriptor d's cost in call req. A descriptor's
// hits_addend of 0 gives cost 0, a check: the engine decides it as a cost
// of 1 and charges nothing.
func costOf(req *rlsv3.RateLimitRequest, d *rlcommonv3.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(h.Value)
	}
	return max(1, int64(req.HitsAddend))
}
