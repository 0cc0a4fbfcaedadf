package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/limiter"
)

// Limit.OnExceed values.
const (
	// OnExceedDeny answers a request over the limit with 429 (the default).
	OnExceedDeny = "Deny"
	// OnExceedDelay holds a request over the limit until its slot, within
	// Limit.MaxDelay, and answers 429 past it.
	OnExceedDelay = "Delay"
)

// MinMaxDelay bounds Limit.MaxDelay from below: a shorter wait is lost in
// a request's own latency, and the limit would deny nearly as Deny does.
// limiter.MaxMaxDelay bounds it from above.
const MinMaxDelay = time.Millisecond

// Delays reports whether the limit delays a request over it instead of
// denying it (OnExceed is Delay).
func (l Limit) Delays() bool { return l.OnExceed == OnExceedDelay }

// checkDelay reports the problems with the limit's onExceed, maxDelay and
// delayAfter, and with the fields a Delay limit refuses, each as an error
// that starts with the field's name, as limiter.Limit.Validate's do.
// parsed is whether Algorithm parsed, so that an unknown algorithm is
// reported once.
func (l Limit) checkDelay(parsed bool) []error {
	var errs []error
	switch l.OnExceed {
	case "", OnExceedDeny, OnExceedDelay:
	default:
		errs = append(errs, fmt.Errorf("onExceed: must be %s or %s, got %q", OnExceedDeny, OnExceedDelay, l.OnExceed))
	}
	if !l.Delays() {
		if l.MaxDelay.Duration != 0 {
			errs = append(errs, fmt.Errorf("maxDelay: applies only with onExceed: %s", OnExceedDelay))
		}
		if l.DelayAfter != 0 {
			errs = append(errs, fmt.Errorf("delayAfter: applies only with onExceed: %s", OnExceedDelay))
		}
		return errs
	}
	switch d := l.MaxDelay.Duration; {
	case d == 0:
		errs = append(errs, fmt.Errorf("maxDelay: required with onExceed: %s: the longest a request over the limit waits for its slot before it is denied", OnExceedDelay))
	case d < MinMaxDelay || d > limiter.MaxMaxDelay:
		errs = append(errs, fmt.Errorf("maxDelay: must be between %v and %v, got %v", MinMaxDelay, limiter.MaxMaxDelay, d))
	}
	if l.DelayAfter < 0 || l.DelayAfter > limiter.MaxRequests {
		errs = append(errs, fmt.Errorf("delayAfter: must be between 1 and %d, got %d", limiter.MaxRequests, l.DelayAfter))
	}
	if l.Burst != 0 {
		errs = append(errs, errors.New("burst: does not apply with onExceed: Delay: delayAfter sets how many requests of a burst pass at once"))
	}
	switch l.Algorithm {
	case "", limiter.TokenBucket.String(), limiter.GCRA.String():
	default:
		if parsed {
			errs = append(errs, fmt.Errorf("algorithm: must be TokenBucket or GCRA with onExceed: Delay, got %q: a Delay limit is metered with GCRA, which admits what TokenBucket admits", l.Algorithm))
		}
	}
	return errs
}

// delayLimiter returns the limiter's form of a Delay limit: GCRA with
// DelayAfter (1 when 0) as its capacity and MaxDelay. A field checkDelay
// found at fault is replaced with a valid stand-in, so that
// limiter.Limit.Validate reports the other problems and not that one
// again; the caller returns the errors, never the stand-in.
func (l Limit) delayLimiter(faulty []error) limiter.Limit {
	out := limiter.Limit{Algorithm: limiter.GCRA, Requests: l.Requests, Period: l.Per.Duration,
		Burst: max(l.DelayAfter, 1), MaxDelay: l.MaxDelay.Duration}
	for _, err := range faulty {
		switch field, _, _ := cutField(err.Error()); field {
		case "maxDelay":
			out.MaxDelay = MinMaxDelay
		case "delayAfter":
			out.Burst = 1
		}
	}
	return out
}
