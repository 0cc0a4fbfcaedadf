package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The pure part of the bench: joining what the load generator saw with what
// the applications saw, bucketing arrivals per second and checking the rate
// bar, and the delay distribution. No timing here: the unit tests cover it.

// arrival is one request as an application saw it: the request number the
// load generator put in X-Req, when it arrived (wall clock, the same
// machine's), and the marker the limiter put on the forwarded request
// (nginx's $limit_req_status, or the sidecar's delay header), "" for none.
type arrival struct {
	ID   int64
	At   time.Time
	Mark string
}

// parseArrivals reads an application's /__arrivals dump: one
// "<id> <unix nanoseconds> <mark>" line per request, the mark optional.
func parseArrivals(s string) ([]arrival, error) {
	var out []arrival
	for n, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		f := strings.SplitN(line, " ", 3)
		if len(f) < 2 {
			return nil, fmt.Errorf("arrivals line %d: %q", n+1, line)
		}
		id, err1 := strconv.ParseInt(f[0], 10, 64)
		ns, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("arrivals line %d: %q", n+1, line)
		}
		a := arrival{ID: id, At: time.Unix(0, ns)}
		if len(f) == 3 {
			a.Mark = f[2]
		}
		out = append(out, a)
	}
	return out, nil
}

// perSecond counts the times in each whole second since t0: counts[k] is
// the number in [t0+k s, t0+(k+1) s). Times before t0 count in second 0
// (an arrival cannot precede its request's send; a clock step could put it
// there).
func perSecond(t0 time.Time, ts []time.Time) []int {
	var counts []int
	for _, t := range ts {
		k := max(int(t.Sub(t0)/time.Second), 0)
		for len(counts) <= k {
			counts = append(counts, 0)
		}
		counts[k]++
	}
	return counts
}

// RateBar is the check that an application received want per second, ±tol
// (a fraction), in every second From..To (indexes into the per-second
// counts, both included).
type RateBar struct {
	Want float64 `json:"wantPerSec"`
	Tol  float64 `json:"tolerance"`
	From int     `json:"fromSecond"`
	To   int     `json:"toSecond"`
	// Min and Max are the least and most arrivals in a second of the
	// range; Outside lists the seconds outside the band.
	Min     int   `json:"min"`
	Max     int   `json:"max"`
	Outside []int `json:"secondsOutside"`
	Pass    bool  `json:"pass"`
}

// checkRate applies the bar to seconds from..to of counts; a second past
// the counts counts 0.
func checkRate(counts []int, from, to int, want, tol float64) RateBar {
	b := RateBar{Want: want, Tol: tol, From: from, To: to, Min: math.MaxInt, Outside: []int{}}
	lo, hi := want*(1-tol), want*(1+tol)
	for k := from; k <= to; k++ {
		c := 0
		if k < len(counts) {
			c = counts[k]
		}
		b.Min, b.Max = min(b.Min, c), max(b.Max, c)
		// A small epsilon: 100 ± 2% is 98..102 inclusive.
		if float64(c) < lo-1e-9 || float64(c) > hi+1e-9 {
			b.Outside = append(b.Outside, k)
		}
	}
	if from > to {
		b.Min = 0
	}
	b.Pass = from <= to && len(b.Outside) == 0
	return b
}

// Dist is a distribution in milliseconds.
type Dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50Ms"`
	P90 float64 `json:"p90Ms"`
	P99 float64 `json:"p99Ms"`
	Max float64 `json:"maxMs"`
}

// dist summarises ds (nearest-rank percentiles, as the harness's).
func dist(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(p*float64(len(s))+0.5) - 1
		return ms(s[min(max(i, 0), len(s)-1)])
	}
	return Dist{N: len(s), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: ms(s[len(s)-1])}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// outcome is one request joined with its arrival.
type outcome struct {
	Due, Sent, Done time.Time
	Status          int
	Arrived         bool
	At              time.Time
	Mark            string
}

// Counts classify the requests of a run.
type Counts struct {
	Sent int64 `json:"sent"`
	// OK were answered 2xx; Delayed of them were held by the limiter,
	// Immediate not.
	OK        int64 `json:"ok"`
	Delayed   int64 `json:"delayed"`
	Immediate int64 `json:"immediate"`
	// Refused were answered 429; Errors anything else or no answer.
	Refused int64 `json:"refused"`
	Errors  int64 `json:"errors"`
	// Unmatched are 2xx answers whose arrival no application recorded,
	// and Arrivals all the applications' arrivals.
	Unmatched int64 `json:"unmatched"`
	Arrivals  int64 `json:"arrivals"`
}

// classify joins the load generator's records (index = request number)
// with the applications' arrivals and counts the outcomes. delayed tells
// whether a 2xx request was held, from its marker and its arrival less
// its actual send (less its scheduled send when that is unknown). It returns the counts, the delays of the delayed
// requests (from the scheduled send, and from the actual send: the time
// the limiter held it, and the proxying), the latencies (answer less
// scheduled send) of all the 2xx and the arrival times.
func classify(recs []outcome, arrivals []arrival, delayed func(mark string, delay time.Duration) bool) (Counts, []time.Duration, []time.Duration, []time.Duration, []time.Time) {
	var c Counts
	at := make(map[int64]arrival, len(arrivals))
	times := make([]time.Time, 0, len(arrivals))
	for _, a := range arrivals {
		at[a.ID] = a
		times = append(times, a.At)
	}
	c.Arrivals = int64(len(arrivals))
	var delays, held, lats []time.Duration
	for i, r := range recs {
		if r.Due.IsZero() {
			continue
		}
		c.Sent++
		switch {
		case r.Status/100 == 2:
			c.OK++
			lats = append(lats, r.Done.Sub(r.Due))
			a, ok := at[int64(i)]
			if !ok {
				c.Unmatched++
				continue
			}
			d := a.At.Sub(r.Due)
			// Told by the time from the actual send where there is one:
			// a late generator does not make a request delayed.
			since := d
			if !r.Sent.IsZero() {
				since = a.At.Sub(r.Sent)
			}
			if delayed(a.Mark, since) {
				c.Delayed++
				delays = append(delays, d)
				if !r.Sent.IsZero() {
					held = append(held, a.At.Sub(r.Sent))
				}
			} else {
				c.Immediate++
			}
		case r.Status == 429:
			c.Refused++
		default:
			c.Errors++
		}
	}
	return c, delays, held, lats, times
}
