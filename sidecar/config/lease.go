package config

import (
	"fmt"
	"strings"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// Limit.Lease values.
const (
	// LeaseAuto lets sidecars lease the tokens of hot keys (the default).
	LeaseAuto = "Auto"
	// LeaseOff decides every request on the shared count.
	LeaseOff = "Off"
)

// Leases reports whether the limit lets sidecars take leases: Lease is
// not Off and the algorithm can lease.
func (l Limit) Leases(alg limiter.Algorithm) bool {
	return l.Lease != LeaseOff && alg.Leasable()
}

// Parts returns how many sub-counters each counter of the limit is split
// into: Split, or 1.
func (l Limit) Parts() int {
	return max(1, int(l.Split))
}

// PartCapacity is the most one request may cost under the limit: the
// capacity lim gives, divided among the sub-counters of a split (a
// request is decided on one of them).
func (l Limit) PartCapacity(lim limiter.Limit) int64 {
	return lim.Capacity() / int64(l.Parts())
}

// CheckSpread reports problems with the limit's lease and split, each as
// a *FieldError whose Path is "lease" or "split", for the valid limit lim
// that Check returned.
func (l Limit) CheckSpread(lim limiter.Limit) []*FieldError {
	var out []*FieldError
	switch l.Lease {
	case "", LeaseAuto, LeaseOff:
	case "false", "true":
		// YAML 1.1, which Kubernetes tooling reads, takes a bare Off
		// (and On) for a boolean.
		out = append(out, &FieldError{Path: "lease", Msg: fmt.Sprintf(`must be %s or %s, got %q: YAML reads a bare Off as the boolean false, so quote it (lease: "Off")`, LeaseAuto, LeaseOff, l.Lease)})
	default:
		out = append(out, &FieldError{Path: "lease", Msg: fmt.Sprintf("must be %s or %s, got %q", LeaseAuto, LeaseOff, l.Lease)})
	}
	if l.Split < 0 {
		out = append(out, &FieldError{Path: "split", Msg: fmt.Sprintf("must be between 1 and %d, got %d", limiter.MaxSplit, l.Split)})
	} else if err := lim.ValidateSplit(l.Parts()); err != nil {
		msg := err.Error()
		if rest, ok := strings.CutPrefix(msg, "split: "); ok {
			msg = rest
		}
		out = append(out, &FieldError{Path: "split", Msg: msg})
	}
	return out
}

// splitNote explains a capacity that a split divides, for cost errors.
func (l Limit) splitNote() string {
	if l.Parts() <= 1 {
		return ""
	}
	return fmt.Sprintf(" (limit.split divides the capacity among %d sub-counters, and a request is decided on one)", l.Parts())
}
