// Package lateness measures how much a busy machine delays this process,
// and processes it is asked to watch, over a test run, so that a timing
// bound can be the promise plus what the machine added around the event it
// bounds, measured over the same span, instead of a fixed slack that a
// busier machine exceeds or an idle one hides a bug under.
//
// A Probe measures four things, independently of the code under test:
//
//   - sleepers, each sleeping Options.Sleep at a time (the call budget of
//     the calls it will excuse), staggered so that one wakes about every
//     millisecond, record how late they woke: how late a timer of the
//     process, such as a call's deadline, can have fired;
//   - the runtime's /sched/latencies, read every couple of milliseconds:
//     how long a runnable goroutine waited for a processor, which on a
//     starved machine exceeds the timers' lateness;
//   - each thread's schedstat (/proc/self/task/*/schedstat), read as
//     often: how long the kernel left a thread of the process runnable
//     but waiting for a CPU. A goroutine (or the one holding a lock it
//     waits for) runs on a thread, and a thread left waiting again and
//     again holds it for every one of those waits, so a thread's waits
//     are summed over a span;
//   - the same for the main thread of each process of Options.PIDs (a
//     redis-server serves its clients there): how much later than on an
//     idle machine it can have answered.
//
// A bound excuses only this: a stall of the code's own (a second deadline
// waited out, a lock held across a call) is not excused, because the
// probes owe nothing to that code and on an idle machine they read about
// nothing; only the machine makes them late.
package lateness

import (
	"fmt"
	"math"
	"os"
	rtmetrics "runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configures a Probe.
type Options struct {
	// Sleep is how long each sleeper sleeps at a time: the call budget of
	// the calls the probe will excuse. There is one sleeper per
	// millisecond of it. It must be at least a millisecond.
	Sleep time.Duration
	// PIDs are other processes whose main thread's waits for a CPU are
	// measured too (Delays.Others); their IDs are read once, at Start.
	PIDs []int
}

// Probe measures the machine's delays from Start to End. Its methods may
// be called from any goroutine; During, Excuse, Stall and Worst read the
// measurement, which is complete (and sorted for them) only once End has
// returned, so call them after End.
type Probe struct {
	sleep time.Duration
	pids  []int

	mu      sync.Mutex
	sleeps  []sleepSample // in the order of their ends, once ended
	maxLate time.Duration // the worst sleep's lateness, once ended
	runq    []runqSample  // in the order of their ends
	waits   []waitSample  // in the order of their ends

	stop    chan struct{}
	done    chan struct{}
	endOnce sync.Once
}

// sleepSample is one sleep: it ran from start to end, late by late.
type sleepSample struct {
	start, end time.Time
	late       time.Duration
}

// runqSample is the longest a goroutine waited in a run queue over (from,
// to], as the runtime measured it.
type runqSample struct {
	from, to time.Time
	worst    time.Duration
}

// waitSample is how long each thread of the process (own, by thread id)
// and each watched process (others, by PID) waited runnable for a CPU over
// (from, to], as the kernel counted it. Those that did not wait are left
// out.
type waitSample struct {
	from, to    time.Time
	own, others map[int]time.Duration
}

// every is how often the run queues are read.
const every = 2 * time.Millisecond

// lead is how long before a call's start Excuse looks: a stall that began
// just before it may already have held it up.
const lead = 10 * time.Millisecond

// Start starts measuring. It panics if o.Sleep is under a millisecond, as
// time.NewTicker does on a non-positive period: that is a mistake in the
// test, not a condition it meets.
func Start(o Options) *Probe {
	if o.Sleep < time.Millisecond {
		panic(fmt.Sprintf("lateness: Sleep %v is under a millisecond", o.Sleep))
	}
	p := &Probe{sleep: o.Sleep, pids: slices.Clone(o.PIDs), stop: make(chan struct{}), done: make(chan struct{})}
	var wg sync.WaitGroup
	// A goroutine woken (by a timer, a channel) or preempted waits in a
	// run queue until a processor takes it: on a busy machine, at times
	// longer than the sleepers' timers are late. The runtime measures
	// that wait itself, for a sample of goroutines.
	wg.Go(func() {
		s := []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}}
		rtmetrics.Read(s)
		prev := slices.Clone(s[0].Value.Float64Histogram().Counts)
		from := time.Now()
		for p.tick() {
			rtmetrics.Read(s)
			h := s[0].Value.Float64Histogram()
			to := time.Now()
			worst := grown(prev, h.Counts, h.Buckets)
			copy(prev, h.Counts)
			p.mu.Lock()
			p.runq = append(p.runq, runqSample{from: from, to: to, worst: worst})
			p.mu.Unlock()
			from = to
		}
	})
	// A thread that the kernel leaves waiting for a CPU stalls the
	// goroutine it runs, the timers of its processor and any lock that
	// goroutine holds, while the other threads (and sleepers) go on.
	wg.Go(func() {
		prevOwn, prevOthers := readWaits(nil, nil, p.pids)
		from := time.Now()
		for p.tick() {
			own, others := readWaits(prevOwn, prevOthers, p.pids)
			to := time.Now()
			ws := waitSample{from: from, to: to, own: since(prevOwn, own), others: since(prevOthers, others)}
			prevOwn, prevOthers = own, others
			p.mu.Lock()
			p.waits = append(p.waits, ws)
			p.mu.Unlock()
			from = to
		}
	})
	for i := range int(p.sleep / time.Millisecond) {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * time.Millisecond)
			for {
				select {
				case <-p.stop:
					return
				default:
				}
				start := time.Now()
				time.Sleep(p.sleep)
				end := time.Now()
				p.mu.Lock()
				p.sleeps = append(p.sleeps, sleepSample{start: start, end: end, late: end.Sub(start) - p.sleep})
				p.mu.Unlock()
			}
		})
	}
	go func() {
		wg.Wait()
		p.mu.Lock()
		slices.SortFunc(p.sleeps, func(a, b sleepSample) int { return a.end.Compare(b.end) })
		for _, s := range p.sleeps {
			p.maxLate = max(p.maxLate, s.late)
		}
		p.mu.Unlock()
		close(p.done)
	}()
	return p
}

// tick waits one sampling interval and reports whether the measurement
// goes on.
func (p *Probe) tick() bool {
	select {
	case <-p.stop:
		return false
	case <-time.After(every):
		return true
	}
}

// End stops the measurement and returns once it is complete: after the
// sleeps under way, at most one Sleep and its lateness. It may be called
// more than once.
func (p *Probe) End() {
	p.endOnce.Do(func() { close(p.stop) })
	<-p.done
}

// Delays is what the machine held this process, and the watched
// processes, up by over a span of time, each figure from one probe.
type Delays struct {
	// Timer is the worst lateness of the sleeps that overlap the span:
	// how late a timer of the process can have fired in it.
	Timer time.Duration
	// Goroutine is the longest a runnable goroutine waited for a
	// processor in the sampling intervals that overlap the span, as the
	// runtime measured it (the lower bound of the highest
	// /sched/latencies bucket that grew).
	Goroutine time.Duration
	// Thread is the longest one thread of the process waited for a CPU
	// within one of those intervals: the longest single stall.
	Thread time.Duration
	// Held is the most one thread of the process waited for a CPU in all
	// of those intervals together.
	Held time.Duration
	// Others is the most one watched process's main thread waited for a
	// CPU in all of those intervals together: how much later than on an
	// idle machine it can have answered in the span.
	Others time.Duration
}

// During returns the delays measured over [from, to].
func (p *Probe) During(from, to time.Time) Delays {
	p.mu.Lock()
	defer p.mu.Unlock()
	var d Delays
	i, _ := slices.BinarySearchFunc(p.sleeps, from, func(s sleepSample, t time.Time) int { return s.end.Compare(t) })
	// The sleeps are in the order of their ends: one that began by to
	// ends by to + its sleep + its lateness, so the scan goes that far (a
	// late sleep, which matters most, ends after punctual ones that began
	// later).
	for horizon := to.Add(p.sleep + p.maxLate); i < len(p.sleeps) && !p.sleeps[i].end.After(horizon); i++ {
		if s := p.sleeps[i]; !s.start.After(to) {
			d.Timer = max(d.Timer, s.late)
		}
	}
	j, _ := slices.BinarySearchFunc(p.runq, from, func(s runqSample, t time.Time) int { return s.to.Compare(t) })
	for ; j < len(p.runq) && !p.runq[j].from.After(to); j++ {
		d.Goroutine = max(d.Goroutine, p.runq[j].worst)
	}
	own, others := map[int]time.Duration{}, map[int]time.Duration{}
	k, _ := slices.BinarySearchFunc(p.waits, from, func(s waitSample, t time.Time) int { return s.to.Compare(t) })
	for ; k < len(p.waits) && !p.waits[k].from.After(to); k++ {
		for tid, w := range p.waits[k].own {
			d.Thread = max(d.Thread, w)
			own[tid] += w
			d.Held = max(d.Held, own[tid])
		}
		for pid, w := range p.waits[k].others {
			others[pid] += w
			d.Others = max(d.Others, others[pid])
		}
	}
	return d
}

// Excuse returns what a call that ran from at for took may exceed its
// bound by, on account of the machine: over the call's span, from just
// before it started, how late its own timer may have fired (Timer), plus
// how long the machine held it runnable: the longest wait of a goroutine
// for a processor or the most one thread waited for a CPU (Held),
// whichever is longer. Other processes' waits are not included: add
// During's Others where the bound depends on their answers.
func (p *Probe) Excuse(at time.Time, took time.Duration) time.Duration {
	d := p.During(at.Add(-lead), at.Add(took))
	return d.Timer + max(d.Goroutine, d.Held)
}

// Stall returns the longest the machine held this process up at once in
// [from, to]: the sleeps' worst lateness, plus the longest single wait of
// a goroutine for a processor or of a thread for a CPU. It bounds how far
// one stall can have pushed events together, where Excuse bounds how late
// one call can have been.
func (p *Probe) Stall(from, to time.Time) time.Duration {
	d := p.During(from, to)
	return d.Timer + max(d.Goroutine, d.Thread)
}

// Worst returns the delays measured over the whole run; its Held and
// Others are a thread's and a watched process's waits over all of it.
func (p *Probe) Worst() Delays {
	return p.During(time.Time{}, time.Now().Add(time.Hour))
}

// grown returns the lower bound of the highest bucket of a
// /sched/latencies histogram whose count grew from prev to cur, or 0 if
// none did (or that bound is not finite and positive).
func grown(prev, cur []uint64, buckets []float64) time.Duration {
	for i := len(cur) - 1; i >= 0; i-- {
		if cur[i] > prev[i] {
			if b := buckets[i]; b > 0 && !math.IsInf(b, 0) {
				return time.Duration(b * float64(time.Second))
			}
			return 0
		}
	}
	return 0
}

// since returns how much each entry of cur grew from prev, leaving out
// those that did not grow or were not in prev (a thread or process seen
// for the first time); nil if none grew.
func since(prev, cur map[int]time.Duration) map[int]time.Duration {
	var out map[int]time.Duration
	for id, w := range cur {
		if p, ok := prev[id]; ok && w > p {
			if out == nil {
				out = map[int]time.Duration{}
			}
			out[id] = w - p
		}
	}
	return out
}

// readWaits returns, by thread id, how long each thread of the process
// has waited runnable for a CPU, and, by PID, each process of pids's main
// thread, in maps sized after the last ones. Those it cannot read are left
// out.
func readWaits(lastOwn, lastOthers map[int]time.Duration, pids []int) (own, others map[int]time.Duration) {
	own = make(map[int]time.Duration, len(lastOwn))
	others = make(map[int]time.Duration, len(lastOthers))
	for _, pid := range pids {
		if w, ok := readSchedstat("/proc/" + strconv.Itoa(pid) + "/schedstat"); ok {
			others[pid] = w
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return own, others
	}
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		if w, ok := readSchedstat("/proc/self/task/" + task.Name() + "/schedstat"); ok {
			own[tid] = w
		}
	}
	return own, others
}

func readSchedstat(path string) (time.Duration, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	return parseSchedstat(string(b))
}

// parseSchedstat reads a schedstat file's "<on CPU ns> <waiting ns>
// <timeslices>": the time spent runnable but waiting for a CPU.
func parseSchedstat(s string) (time.Duration, bool) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ns), true
}
