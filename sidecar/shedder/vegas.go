package shedder

import (
	"math"
	"time"
)

// Window is what the shedder saw of the application over one sampling
// window: the requests answered in it, their latency, and the requests in
// flight when each of them was sent.
type Window struct {
	// End is when the window closed.
	End time.Time
	// Samples is the number of requests answered in the window.
	Samples int
	// MeanLatency is their mean latency, from admission to the response
	// head.
	MeanLatency time.Duration
	// MeanInFlight is the mean number of requests in flight to the
	// application when each of them was admitted (itself included).
	MeanInFlight float64
	// MaxInFlight is the most requests in flight at once in the window.
	MaxInFlight int64
}

// VegasConfig tunes the adaptive limit. The zero value of each field means
// its default.
type VegasConfig struct {
	// MinLimit and MaxLimit bound the limit (defaults 4 and 1000);
	// InitialLimit is where it starts (20, within the bounds).
	MinLimit, MaxLimit, InitialLimit float64
	// BaselineHorizon is how long a latency can stay the baseline: the
	// baseline is the lowest window latency of that horizon (default
	// 60s), kept in BaselineBuckets buckets (default 6).
	BaselineHorizon time.Duration
	BaselineBuckets int
	// ProbeEvery is how often the limit drains the application's queue
	// for ProbeWindows windows (defaults 20s and 2), cut to ProbeFactor of
	// itself (default 0.5), so that the baseline sees latencies without
	// queueing even under a lasting overload. Jitter spreads the probes of
	// a fleet: each interval is ProbeEvery times a factor in [0.9, 1.1)
	// that Jitter returns (default 1).
	ProbeEvery   time.Duration
	ProbeWindows int
	ProbeFactor  float64
	Jitter       func() float64
}

func (c VegasConfig) withDefaults() VegasConfig {
	if c.MinLimit <= 0 {
		c.MinLimit = 4
	}
	if c.MaxLimit <= 0 {
		c.MaxLimit = 1000
	}
	c.MaxLimit = math.Max(c.MaxLimit, c.MinLimit)
	if c.InitialLimit <= 0 {
		c.InitialLimit = 20
	}
	c.InitialLimit = math.Min(math.Max(c.InitialLimit, c.MinLimit), c.MaxLimit)
	if c.BaselineHorizon <= 0 {
		c.BaselineHorizon = time.Minute
	}
	if c.BaselineBuckets <= 0 {
		c.BaselineBuckets = 6
	}
	if c.ProbeEvery <= 0 {
		c.ProbeEvery = 20 * time.Second
	}
	if c.ProbeWindows <= 0 {
		c.ProbeWindows = 2
	}
	if c.ProbeFactor <= 0 || c.ProbeFactor >= 1 {
		c.ProbeFactor = 0.5
	}
	if c.Jitter == nil {
		c.Jitter = func() float64 { return 1 }
	}
	return c
}

// Vegas is the adaptive limit on requests in flight, after TCP Vegas and
// Netflix's VegasLimit: it estimates the requests queued in the
// application, by Little's law, as inflight × (1 − baseline/latency), and
// moves the limit to keep that queue between alpha = 2·log10(limit) and
// beta = 4·log10(limit) requests: up by beta while nothing queues (unless
// the application is not using half the limit, when more room would tell
// nothing), up by log10(limit) below alpha, down by the queue's excess over
// beta (by log10(limit) at least, by half the limit at most) above beta.
// The application then runs with a short queue that keeps it busy, and its
// latency stays near the baseline. (With 3 and 6, Netflix's defaults, the
// shedbench's application, 16 workers of 25ms, queued about 8 requests and
// its critical p99 was 1.9-2.1 times its idle p99; with 2 and 4 it is
// 1.6-1.7 times, at the same goodput, 0.97 C.)
//
// The baseline is the lowest window latency of the last BaselineHorizon.
// Under an overload that lasts, every window has the small queue Vegas
// keeps, so the baseline would creep up with each horizon; a periodic
// drain probe cuts the limit to ProbeFactor of itself for ProbeWindows
// windows, which empties the queue and shows the baseline again (a probe
// falls due only in a window where requests queue; otherwise that window
// shows the baseline itself and the probe waits for the next). The
// limit Vegas keeps is about the application's concurrency plus a queue
// of a few, so the probe's half of it still keeps most of the application
// busy; a shallower cut (three quarters) left a queue in the probe
// windows, and a baseline that high let the limit climb. The probe's
// windows feed the baseline and move nothing else.
//
// Vegas is a pure state machine: time is what the windows say. It is not
// safe for concurrent use.
type Vegas struct {
	c       VegasConfig
	limit   float64
	buckets []baselineBucket
	latest  time.Duration // the last window's mean latency
	// probing counts the probe windows left; nextProbe is when the next
	// probe starts.
	probing   int
	nextProbe time.Time
}

type baselineBucket struct {
	start time.Time
	min   time.Duration
}

// NewVegas returns a Vegas at its initial limit.
func NewVegas(c VegasConfig) *Vegas {
	c = c.withDefaults()
	return &Vegas{c: c, limit: c.InitialLimit}
}

// Limit returns the limit in force: during a probe, the cut limit.
func (v *Vegas) Limit() float64 {
	if v.probing > 0 {
		return math.Max(v.c.MinLimit, v.limit*v.c.ProbeFactor)
	}
	return v.limit
}

// Estimate returns the learned limit, probe or not.
func (v *Vegas) Estimate() float64 { return v.limit }

// Baseline returns the baseline latency, or 0 before the first window.
func (v *Vegas) Baseline() time.Duration {
	var b time.Duration
	for _, k := range v.buckets {
		if b == 0 || k.min < b {
			b = k.min
		}
	}
	return b
}

// Latest returns the last window's mean latency.
func (v *Vegas) Latest() time.Duration { return v.latest }

// Probing reports whether a drain probe is under way.
func (v *Vegas) Probing() bool { return v.probing > 0 }

// SetBounds changes the limit's bounds, keeping what was learned.
func (v *Vegas) SetBounds(lo, hi float64) {
	c := v.c
	c.MinLimit, c.MaxLimit = lo, hi
	c = c.withDefaults()
	v.c.MinLimit, v.c.MaxLimit = c.MinLimit, c.MaxLimit
	v.limit = math.Min(math.Max(v.limit, v.c.MinLimit), v.c.MaxLimit)
}

// observe adds a window latency to the baseline's buckets, dropping the
// buckets older than the horizon.
func (v *Vegas) observe(end time.Time, lat time.Duration) {
	span := v.c.BaselineHorizon / time.Duration(v.c.BaselineBuckets)
	keep := v.buckets[:0]
	for _, b := range v.buckets {
		if end.Sub(b.start) < v.c.BaselineHorizon {
			keep = append(keep, b)
		}
	}
	v.buckets = keep
	if n := len(v.buckets); n > 0 && end.Sub(v.buckets[n-1].start) < span {
		if lat < v.buckets[n-1].min {
			v.buckets[n-1].min = lat
		}
		return
	}
	v.buckets = append(v.buckets, baselineBucket{start: end, min: lat})
}

// Update takes one window into account and returns the limit in force
// after it. A window without samples changes nothing.
func (v *Vegas) Update(w Window) float64 {
	if w.Samples == 0 || w.MeanLatency <= 0 {
		return v.Limit()
	}
	v.latest = w.MeanLatency
	v.observe(w.End, w.MeanLatency)
	if v.nextProbe.IsZero() {
		v.scheduleProbe(w.End)
	}
	if v.probing > 0 {
		v.probing--
		if v.probing == 0 {
			v.scheduleProbe(w.End)
		}
		return v.Limit()
	}
	base := v.Baseline()
	queue := w.MeanInFlight * (1 - float64(base)/float64(w.MeanLatency))
	lg := math.Max(1, math.Log10(v.limit))
	if !w.End.Before(v.nextProbe) {
		if queue > lg {
			v.probing = v.c.ProbeWindows
			return v.Limit()
		}
		// Nothing queues: this window shows the baseline as a probe
		// would, and cutting the limit could only shed.
		v.scheduleProbe(w.End)
	}
	alpha, beta := 2*lg, 4*lg
	appLimited := float64(w.MaxInFlight) < v.limit/2
	switch {
	case queue <= lg:
		if !appLimited {
			v.limit += beta
		}
	case queue < alpha:
		if !appLimited {
			v.limit += lg
		}
	case queue > beta:
		v.limit -= math.Min(math.Max(lg, queue-beta), v.limit/2)
	}
	v.limit = math.Min(math.Max(v.limit, v.c.MinLimit), v.c.MaxLimit)
	return v.Limit()
}

func (v *Vegas) scheduleProbe(now time.Time) {
	f := v.c.Jitter()
	v.nextProbe = now.Add(time.Duration(float64(v.c.ProbeEvery) * f))
}
