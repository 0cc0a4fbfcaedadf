package shedder

import (
	"container/heap"
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/floodgate-dev/floodgate/sidecar/metrics"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

func newShedder(t *testing.T, now func() time.Time, c *Config) (*Shedder, *metrics.Metrics) {
	t.Helper()
	m := metrics.NewMetrics(prometheus.NewPedanticRegistry())
	s := New(m, now)
	s.Configure(c)
	return s, m
}

func TestParsePriority(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Priority{"": Default, "Default": Default, "Critical": Critical, "Sheddable": Sheddable} {
		if got, err := ParsePriority(in); err != nil || got != want {
			t.Errorf("ParsePriority(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParsePriority("critical"); err == nil {
		t.Error(`ParsePriority("critical") succeeded; names are case-sensitive`)
	}
}

func TestOffAdmitsEverything(t *testing.T) {
	t.Parallel()
	s, _ := newShedder(t, nil, nil)
	for range 10_000 {
		if tk, ok := s.Admit(Sheddable); !ok || tk.Held() {
			t.Fatal("an unconfigured shedder shed a request or held a place")
		}
	}
	if !s.Admits(Sheddable) || s.Enabled() {
		t.Error("an unconfigured shedder does not admit, or says it is on")
	}
}

// The shares follow the reserves, and a priority is shed exactly when the
// requests in flight reach its share: at every level of in-flight requests
// a higher priority is admitted whenever a lower one is. Admits says yes to
// Critical always, since a Critical request may wait for a place; Admit,
// which does not wait, refuses it at the limit.
func TestSharesOrderThePriorities(t *testing.T) {
	t.Parallel()
	s, m := newShedder(t, nil, &Config{CriticalReserve: 20, DefaultReserve: 10, MinLimit: 4, MaxLimit: 1000})
	shares, _ := s.Current()
	if shares != [3]int64{Sheddable: 14, Default: 16, Critical: 20} {
		t.Fatalf("shares of the initial limit 20 with reserves 20/10 = %v, want [14 16 20]", shares)
	}
	var held []Ticket
	for level := range 25 {
		var admits [numPriorities]bool
		for p := range numPriorities {
			admits[p] = s.Admits(p)
			if got, want := admits[p], int64(level) < shares[p] || p == Critical; got != want {
				t.Errorf("at %d in flight, Admits(%v) = %v, want %v", level, p, got, want)
			}
		}
		if (admits[Sheddable] && !admits[Default]) || (admits[Default] && !admits[Critical]) {
			t.Errorf("at %d in flight a higher priority is shed while a lower one is admitted: %v", level, admits)
		}
		tk, ok := s.Admit(Critical)
		if ok != (level < 20) {
			t.Fatalf("Admit(Critical) at %d in flight = %v", level, ok)
		}
		if ok {
			held = append(held, tk)
		}
	}
	if got := value(m.ShedTotal.WithLabelValues("Critical", "enforce")); got != 5 {
		t.Errorf("critical shed = %v, want 5", got)
	}
	for i := range held {
		s.Done(&held[i], false)
		s.Done(&held[i], false) // a second Done does nothing
	}
	if _, in := s.Current(); in != 0 {
		t.Errorf("%d in flight after every Done, want 0", in)
	}
}

// Shares and admits, the pure core of the admission rule, keep the
// priorities in order for every limit, reserve and Critical demand: a
// lower priority's bound is never above a higher one's, and at every
// count in flight and of waiting Critical requests a lower priority is
// admitted only when a higher one is too.
func TestSharesNeverShedAHigherPriorityFirst(t *testing.T) {
	t.Parallel()
	for _, limit := range []float64{0.5, 1, 4, 7.5, 20, 27, 100, 1000} {
		for _, pct := range [][2]int{{0, 0}, {20, 10}, {60, 0}, {45, 45}, {0, 90}} {
			for _, demand := range []float64{0, 0.5, 3, 14, 26, 200} {
				shares, reserve := Shares(limit, pct[0], pct[1], demand)
				if shares[Critical] < 1 || shares[Sheddable] < 0 || shares[Sheddable] > shares[Default] || shares[Default] > shares[Critical] {
					t.Fatalf("Shares(%v, %v, %v) = %v, want 0 <= Sheddable <= Default <= Critical, Critical >= 1", limit, pct, demand, shares)
				}
				if reserve < limit*float64(pct[0])/100 || (demand > 0 && reserve < demand) {
					t.Errorf("Shares(%v, %v, %v) reserve %v, want at least the percentage and the demand", limit, pct, demand, reserve)
				}
				for in := range shares[Critical] + 2 {
					for crit, waiting := int64(0), int64(0); crit <= in; crit, waiting = crit+1, (waiting+1)%3 {
						a := [numPriorities]bool{}
						for p := range numPriorities {
							a[p] = admits(p, in, crit, shares[p], waiting)
						}
						if (a[Sheddable] && !a[Default]) || (a[Default] && !a[Critical]) {
							t.Fatalf("Shares(%v, %v, %v) = %v: at %d in flight (%d Critical), %d waiting, admits %v: a higher priority is shed while a lower one is admitted",
								limit, pct, demand, shares, in, crit, waiting, a)
						}
						if waiting > 0 && (a[Default] || a[Sheddable]) {
							t.Fatalf("a lower priority is admitted while %d Critical requests wait", waiting)
						}
					}
				}
			}
		}
	}
}

// The critical reserve follows the Critical requests' concurrency: under
// a small limit a percentage leaves them a few slots; their measured
// demand, with room for bursts, leaves the lower classes only the rest.
func TestSharesFollowTheCriticalDemand(t *testing.T) {
	t.Parallel()
	for i, tc := range []struct {
		limit  float64
		demand float64
		want   [3]int64
	}{
		{limit: 27, demand: 0, want: [3]int64{Sheddable: 18, Default: 21, Critical: 27}},    // the percentages
		{limit: 27, demand: 2, want: [3]int64{Sheddable: 18, Default: 21, Critical: 27}},    // 2+2.8+1 < 5.4
		{limit: 27, demand: 9, want: [3]int64{Sheddable: 8, Default: 11, Critical: 27}},     // 9+6+1 = 16
		{limit: 27, demand: 16, want: [3]int64{Sheddable: 0, Default: 2, Critical: 27}},     // 16+8+1 = 25
		{limit: 27, demand: 30, want: [3]int64{Sheddable: 0, Default: 0, Critical: 27}},     // more than the limit
		{limit: 100, demand: 16, want: [3]int64{Sheddable: 65, Default: 75, Critical: 100}}, // 25 > 20
	} {
		if got, _ := Shares(tc.limit, 20, 10, tc.demand); got != tc.want {
			t.Errorf("step %d: Shares(%v, 20, 10, %v) = %v, want %v", i, tc.limit, tc.demand, got, tc.want)
		}
	}
	for i, tc := range []struct{ demand, mean, want float64 }{
		{0, 5, 5}, {5, 10, 10}, {10, 5, 9}, {10, 0, 8}, {8, 8, 8},
	} {
		if got := nextDemand(tc.demand, tc.mean); got != tc.want {
			t.Errorf("step %d: nextDemand(%v, %v) = %v, want %v", i, tc.demand, tc.mean, got, tc.want)
		}
	}
}

// Critical requests are held to the limit among themselves, whatever the
// lower ones hold. One that finds the Critical requests alone filling it
// waits; while it does no lower priority is admitted, and the next
// Critical request to leave hands it its place. One that nothing hands a
// place to is shed, and counted.
func TestWaitingCriticalTakesTheNextPlace(t *testing.T) {
	t.Parallel()
	s, m := newShedder(t, nil, &Config{CriticalReserve: 20, DefaultReserve: 10, MinLimit: 4, MaxLimit: 1000})
	shares, _ := s.Current()
	var deflt, crit []Ticket
	for range shares[Default] {
		tk, ok := s.Admit(Default)
		if !ok {
			t.Fatal("Default refused under its share")
		}
		deflt = append(deflt, tk)
	}
	// Default fills its share; Critical still has the whole limit.
	for range shares[Critical] {
		tk, ok := s.Admit(Critical)
		if !ok {
			t.Fatalf("Critical refused with %d Critical in flight, under the limit %d", len(crit), shares[Critical])
		}
		crit = append(crit, tk)
	}
	if _, ok := s.Admit(Critical); ok {
		t.Fatal("Critical admitted with Critical requests alone at the limit")
	}
	w := s.Enqueue(Critical)
	select {
	case <-w.Ready():
		t.Fatal("a waiter is ready at the limit")
	default:
	}
	if s.Enqueue(Default) != nil {
		t.Error("a Default request may wait")
	}
	// A Default request leaving frees no Critical place, and Default is
	// refused while the waiter waits.
	s.Done(&deflt[0], true)
	select {
	case <-w.Ready():
		t.Fatal("the waiter got a place while the Critical requests still fill the limit")
	default:
	}
	if s.Admits(Default) || s.Admits(Sheddable) {
		t.Error("a lower priority is admitted while a Critical request waits")
	}
	// A Critical request leaving hands its place over.
	s.Done(&crit[0], true)
	select {
	case <-w.Ready():
	default:
		t.Fatal("the waiter got no place when one freed")
	}
	if tk, ok := s.Cancel(w); !ok || !tk.Held() {
		t.Fatal("Cancel after the hand-off does not return the place")
	} else {
		crit[0] = tk
	}
	// A waiter that nothing hands a place to is shed.
	w2 := s.Enqueue(Critical)
	if _, ok := s.Cancel(w2); ok {
		t.Fatal("a waiter handed nothing is admitted on Cancel")
	}
	if got := value(m.ShedTotal.WithLabelValues("Critical", "enforce")); got != 2 {
		t.Errorf("critical shed = %v, want 2 (the Admit at the limit and the cancelled wait)", got)
	}
	// Once no one waits and the count is under Default's share, Default
	// goes in again.
	for i := range crit {
		if _, in := s.Current(); in < shares[Default] {
			break
		}
		s.Done(&crit[i], true)
	}
	if !s.Admits(Default) {
		t.Error("Default refused with no waiter and a place under its share")
	}
}

// AdmitWait gives up when its context ends.
func TestAdmitWaitEndsWithTheContext(t *testing.T) {
	t.Parallel()
	s, _ := newShedder(t, nil, &Config{CriticalReserve: 20, DefaultReserve: 10, MinLimit: 4, MaxLimit: 4})
	for range 4 {
		if _, ok := s.Admit(Critical); !ok {
			t.Fatal("Critical refused under the limit")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := s.AdmitWait(ctx, Critical); ok {
		t.Error("AdmitWait admitted at the limit with its context ended")
	}
	if _, ok := s.AdmitWait(context.Background(), Default); ok {
		t.Error("AdmitWait admitted Default at the limit")
	}
	if got := s.waiting.Load(); got != 0 {
		t.Errorf("%d waiters left", got)
	}
}

func TestShadowShedsNothingAndCounts(t *testing.T) {
	t.Parallel()
	s, m := newShedder(t, nil, &Config{Shadow: true, CriticalReserve: 20, DefaultReserve: 10, MinLimit: 4, MaxLimit: 1000})
	for i := range 30 {
		if _, ok := s.Admit(Sheddable); !ok {
			t.Fatalf("request %d shed in Shadow mode", i)
		}
	}
	// The sheddable share of 20 is 14: the 16 after it would have gone.
	if got := value(m.ShedTotal.WithLabelValues("Sheddable", "shadow")); got != 16 {
		t.Errorf("shadow-shed = %v, want 16", got)
	}
	if got := value(m.ShedTotal.WithLabelValues("Sheddable", "enforce")); got != 0 {
		t.Errorf("shed = %v in Shadow mode, want 0", got)
	}
}

// simulation drives a Shedder with an open-loop load on a simulated
// application of a fixed capacity: workers that each take service to
// answer, with a FIFO queue in front of them. Time is simulated, so the
// run is exact and fast.
type simulation struct {
	workers  int
	service  time.Duration
	rate     float64 // offered requests per second
	critical float64 // shares of the offered load by priority
	deflt    float64
	duration time.Duration
	warmup   time.Duration
	seed     uint64
	noWait   bool // Critical requests do not wait for a place
}

type simResult struct {
	offered, admitted, done [numPriorities]int
	latencies               [numPriorities][]time.Duration // admitted requests, from arrival to answer
	limits                  []float64
	measured                time.Duration
}

type simReq struct {
	p       Priority
	arrival time.Time
	ticket  Ticket
}

type doneHeap []struct {
	at time.Time
	r  *simReq
}

func (h doneHeap) Len() int           { return len(h) }
func (h doneHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h doneHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *doneHeap) Push(x any) {
	*h = append(*h, x.(struct {
		at time.Time
		r  *simReq
	}))
}

func (h *doneHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (sm simulation) run(t *testing.T, c *Config) simResult {
	t.Helper()
	base := time.Unix(1_700_000_000, 0)
	clk := &fakeClock{t: base}
	var s *Shedder
	if c != nil {
		s, _ = newShedder(t, clk.Now, c)
	}
	rng := rand.New(rand.NewPCG(sm.seed, 1))
	var res simResult
	var queue []*simReq
	var running doneHeap
	nextArrival := base
	end := base.Add(sm.duration)
	measureFrom := base.Add(sm.warmup)
	start := func(now time.Time) {
		for len(running) < sm.workers && len(queue) > 0 {
			r := queue[0]
			queue = queue[1:]
			heap.Push(&running, struct {
				at time.Time
				r  *simReq
			}{now.Add(sm.service), r})
		}
	}
	// Critical requests waiting in the shedder, with their deadline.
	type waiting struct {
		r        *simReq
		w        *Waiter
		deadline time.Time
	}
	var waiters []waiting
	// admitWaiters moves the waiters handed a place to the application,
	// and sheds those whose deadline passed before now.
	admitWaiters := func(now time.Time) {
		keep := waiters[:0]
		for _, wt := range waiters {
			select {
			case <-wt.w.Ready():
			default:
				if wt.deadline.After(now) {
					keep = append(keep, wt)
					continue
				}
			}
			tk, ok := s.Cancel(wt.w)
			if !ok {
				continue
			}
			wt.r.ticket = tk
			if !wt.r.arrival.Before(measureFrom) {
				res.admitted[wt.r.p]++
			}
			queue = append(queue, wt.r)
		}
		waiters = keep
	}
	for {
		// The next event: an arrival or an answer; waiters past their
		// deadline are shed first.
		now := nextArrival
		answer := len(running) > 0 && !running[0].at.After(nextArrival)
		if answer {
			now = running[0].at
		}
		if now.After(end) {
			break
		}
		if s != nil {
			admitWaiters(now)
		}
		clk.Set(now)
		if answer {
			d := heap.Pop(&running).(struct {
				at time.Time
				r  *simReq
			})
			if s != nil {
				s.Done(&d.r.ticket, true)
				admitWaiters(now)
			}
			if !d.r.arrival.Before(measureFrom) {
				res.done[d.r.p]++
				res.latencies[d.r.p] = append(res.latencies[d.r.p], now.Sub(d.r.arrival))
			}
			start(now)
			continue
		}
		// An arrival; the next one is exponentially distributed.
		nextArrival = now.Add(time.Duration(rng.ExpFloat64() / sm.rate * float64(time.Second)))
		p := Sheddable
		switch x := rng.Float64(); {
		case x < sm.critical:
			p = Critical
		case x < sm.critical+sm.deflt:
			p = Default
		}
		r := &simReq{p: p, arrival: now}
		measured := !now.Before(measureFrom)
		if measured {
			res.offered[p]++
		}
		if s != nil {
			tk, ok := s.Admit(p)
			if !ok && p == Critical && !sm.noWait {
				// As AdmitWait: wait for a place, for at most maxWait.
				if w := s.Enqueue(p); w != nil {
					waiters = append(waiters, waiting{r: r, w: w, deadline: now.Add(time.Duration(s.maxWait.Load()))})
					admitWaiters(now)
				}
				continue
			}
			if !ok {
				continue
			}
			r.ticket = tk
			if measured {
				l, _ := s.Limit()
				res.limits = append(res.limits, l)
			}
		}
		if measured {
			res.admitted[p]++
		}
		queue = append(queue, r)
		start(now)
	}
	res.measured = sm.duration - sm.warmup
	return res
}

func p99(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(0.99*float64(len(s))))]
}

// Three times the application's capacity, a fifth of it Critical: the
// shedder finds a limit near the application's workers, keeps every
// Critical request with a latency near the service time, sheds Sheddable
// before Default, and the application stays busy.
func TestSimulatedOverload(t *testing.T) {
	t.Parallel()
	const workers, service = 48, 50 * time.Millisecond
	capacity := float64(workers) / service.Seconds() // 960/s
	sm := simulation{workers: workers, service: service, rate: 3 * capacity, critical: 0.2, deflt: 0.4,
		duration: 40 * time.Second, warmup: 5 * time.Second, seed: 42}
	res := sm.run(t, &Config{CriticalReserve: 20, DefaultReserve: 10, MinLimit: 4, MaxLimit: 1000})

	critSuccess := float64(res.done[Critical]) / float64(res.offered[Critical])
	goodput := float64(res.done[Critical]+res.done[Default]+res.done[Sheddable]) / res.measured.Seconds()
	critP99 := p99(res.latencies[Critical])
	shedS := 1 - float64(res.admitted[Sheddable])/float64(res.offered[Sheddable])
	shedD := 1 - float64(res.admitted[Default])/float64(res.offered[Default])
	meanLimit := 0.0
	for _, l := range res.limits {
		meanLimit += l
	}
	meanLimit /= float64(len(res.limits))
	t.Logf("critical success %.4f, p99 %v; goodput %.0f/s of capacity %.0f/s; shed sheddable %.3f, default %.3f; mean limit %.1f",
		critSuccess, critP99, goodput, capacity, shedS, shedD, meanLimit)
	if critSuccess < 0.995 {
		t.Errorf("critical success %.4f, want at least 0.995", critSuccess)
	}
	if critP99 > 2*service {
		t.Errorf("critical p99 %v, want at most twice the idle latency %v", critP99, service)
	}
	if goodput < 0.9*capacity {
		t.Errorf("goodput %.0f/s, want at least 0.9 × %.0f", goodput, capacity)
	}
	if shedS < shedD {
		t.Errorf("shed %.3f of Sheddable and %.3f of Default, want Sheddable shed first", shedS, shedD)
	}
	if meanLimit < float64(workers) || meanLimit > 3*float64(workers) {
		t.Errorf("mean limit %.1f, want near the %d workers (between 1 and 3 times)", meanLimit, workers)
	}

	// Without the shedder the same load queues without bound: the
	// latency of Critical requests grows far past the service time.
	none := sm
	none.duration, none.warmup = 10*time.Second, 2*time.Second
	raw := none.run(t, nil)
	if got := p99(raw.latencies[Critical]); got < 20*service {
		t.Errorf("without shedding the critical p99 is %v, want the collapse (above %v) that shedding prevents", got, 20*service)
	}
}

// The shedbench's application: 16 workers of 25ms (C = 640/s), a limit
// of a few tens, offered 3 × C of which a fifth Critical and the rest
// Default. Critical requests are three fifths of C, so a reserve of 20% of
// the limit would be a few slots; the measured reserve and the brief wait
// keep every Critical request, the application busy, and Default takes
// the rest.
func TestSimulatedOverloadSmallLimit(t *testing.T) {
	t.Parallel()
	const workers, service = 16, 25 * time.Millisecond
	capacity := float64(workers) / service.Seconds() // 640/s
	sm := simulation{workers: workers, service: service, rate: 3 * capacity, critical: 0.2, deflt: 0.8,
		duration: 40 * time.Second, warmup: 5 * time.Second, seed: 20}
	res := sm.run(t, &Config{CriticalReserve: 20, DefaultReserve: 10, MinLimit: 4, MaxLimit: 1000})
	critSuccess := float64(res.done[Critical]) / float64(res.offered[Critical])
	goodput := float64(res.done[Critical]+res.done[Default]) / res.measured.Seconds()
	critP99 := p99(res.latencies[Critical])
	t.Logf("critical success %.4f (%d of %d), p99 %v; goodput %.0f/s of capacity %.0f/s; default admitted %.3f",
		critSuccess, res.done[Critical], res.offered[Critical], critP99, goodput, capacity,
		float64(res.admitted[Default])/float64(res.offered[Default]))
	if critSuccess < 0.995 {
		t.Errorf("critical success %.4f, want at least 0.995", critSuccess)
	}
	if critP99 > 2*service {
		t.Errorf("critical p99 %v, want at most twice the idle latency %v", critP99, service)
	}
	if goodput < 0.9*capacity {
		t.Errorf("goodput %.0f/s, want at least 0.9 × %.0f", goodput, capacity)
	}
}

// Under a load the application serves without queueing, nothing is shed
// and the limit stays well above what is in flight.
func TestSimulatedLightLoadShedsNothing(t *testing.T) {
	t.Parallel()
	const workers, service = 48, 50 * time.Millisecond
	capacity := float64(workers) / service.Seconds()
	sm := simulation{workers: workers, service: service, rate: 0.5 * capacity, critical: 0.2, deflt: 0.4,
		duration: 20 * time.Second, warmup: 3 * time.Second, seed: 7}
	res := sm.run(t, &Config{CriticalReserve: 20, DefaultReserve: 10, MinLimit: 4, MaxLimit: 1000})
	for p := range numPriorities {
		if res.admitted[p] != res.offered[p] {
			t.Errorf("%v: admitted %d of %d at half the capacity, want all", p, res.admitted[p], res.offered[p])
		}
	}
}

// BenchmarkAdmitDone is the shedder's cost per request: one admission and
// one answered Done (a latency sample), with the clock reads they make.
func BenchmarkAdmitDone(b *testing.B) {
	m := metrics.NewMetrics(prometheus.NewRegistry())
	s := New(m, nil)
	s.Configure(&Config{CriticalReserve: 20, DefaultReserve: 10, MinLimit: 4, MaxLimit: 1000})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tk, ok := s.Admit(Default)
			if ok {
				s.Done(&tk, true)
			}
		}
	})
}
