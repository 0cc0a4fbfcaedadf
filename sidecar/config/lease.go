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
// not Off, the limit does not delay, and the algorithm can lease. A Delay
// limit never leases: each request reserves its own slot, in order, on
// the shared count, which a batch taken ahead would reorder.
func (l Limit) Leases(alg limiter.Algorithm) bool {
	return l.Lease != LeaseOff && !l.Delays() && alg.Leasable()
}

// Parts returns how many sub-counters each counter of the limit is split
// into: Split, or 1. A Delay limit never splits: its requests queue on
// one counter.
func (l Limit) Parts() int {
	if l.Delays() {
		return 1
	}
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
	if l.Delays() {
		// Lease and split are not used; refuse only what asks for them.
		if l.Lease == LeaseAuto {
			out = append(out, &FieldError{Path: "lease", Msg: fmt.Sprintf("a Delay limit never leases: each request reserves its slot on the shared count, in order; leave lease unset or %s", LeaseOff)})
		}
		if l.Split > 1 {
			out = append(out, &FieldError{Path: "split", Msg: fmt.Sprintf("a Delay limit never splits: its requests queue on one counter; leave split unset or 1, got %d", l.Split)})
		}
		if l.Split < 0 {
			out = append(out, &FieldError{Path: "split", Msg: fmt.Sprintf("must be 1 with onExceed: Delay, got %d", l.Split)})
		}
		return out
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

// splitNote explains a capacity that a split divides, or that delayAfter
// sets, for cost errors.
func (l Limit) splitNote() string {
	if l.Delays() {
		return " (limit.delayAfter, 1 when unset, under onExceed: Delay)"
	}
	if l.Parts() <= 1 {
		return ""
	}
	return fmt.Sprintf(" (limit.split divides the capacity among %d sub-counters, and a request is decided on one)", l.Parts())
}
