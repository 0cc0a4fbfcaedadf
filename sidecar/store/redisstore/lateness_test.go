package redisstore_test

import (
	"math"
	"os"
	rtmetrics "runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// lateness measures how late this process's goroutines run on the shared
// machine, so that a fault test can hold a decision to its deadline plus
// what the machine itself delayed it by, measured over the same span,
// instead of a fixed slack that a busier machine exceeds. It is the
// measurement test/faults makes (its noise), for one store:
//
//   - sleepers, each sleeping a call budget at a time, staggered so that
//     one wakes about every millisecond, record how late they woke: how
//     late a caller's own deadline timer can have fired;
//   - the runtime's /sched/latencies, read every couple of milliseconds:
//     how long a runnable goroutine waited for a processor;
//   - each thread's schedstat, read as often: how long the kernel left a
//     thread of the process waiting for a CPU. A decision's goroutine (or
//     the one holding a lock it waits for) runs on a thread, and a thread
//     left waiting again and again holds it for each of those waits, so
//     they are summed per thread over the decision's span.
//
// A stall of the store's own (a second deadline waited out, a lock held
// across a call) is not excused: the measurement owes nothing to the
// store, and on an idle machine it reads about nothing.
type lateness struct {
	sleep   time.Duration
	mu      sync.Mutex
	sleeps  []sleepSample  // in the order of their ends, once stopped
	runq    []runqSample   // in the order of their ends
	threads []threadSample // in the order of their ends
	maxLate time.Duration
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// sleepSample is one sleep: it ran from start to end, late by late.
type sleepSample struct {
	start, end time.Time
	late       time.Duration
}

// runqSample is the longest a goroutine waited in a run queue over (from,
// to], as the runtime measured it (the lower bound of the highest
// histogram bucket that grew).
type runqSample struct {
	from, to time.Time
	worst    time.Duration
}

// threadSample is how long each thread of the process waited runnable for
// a CPU over (from, to]; threads that did not wait are left out.
type threadSample struct {
	from, to time.Time
	waits    map[string]time.Duration
}

// latenessEvery is how often the run queues are read.
const latenessEvery = 2 * time.Millisecond

// startLateness starts measuring, with sleepers of sleep each (the call
// budget of the decisions it will excuse).
func startLateness(sleep time.Duration) *lateness {
	l := &lateness{sleep: sleep, stop: make(chan struct{}), done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() {
		s := []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}}
		rtmetrics.Read(s)
		prev := slices.Clone(s[0].Value.Float64Histogram().Counts)
		from := time.Now()
		for l.wait(latenessEvery) {
			rtmetrics.Read(s)
			h := s[0].Value.Float64Histogram()
			to := time.Now()
			var worst time.Duration
			for i := len(h.Counts) - 1; i >= 0; i-- {
				if h.Counts[i] > prev[i] {
					if b := h.Buckets[i]; b > 0 && !math.IsInf(b, 0) {
						worst = time.Duration(b * float64(time.Second))
					}
					break
				}
			}
			copy(prev, h.Counts)
			l.mu.Lock()
			l.runq = append(l.runq, runqSample{from: from, to: to, worst: worst})
			l.mu.Unlock()
			from = to
		}
	})
	wg.Go(func() {
		prev := threadWaits()
		from := time.Now()
		for l.wait(latenessEvery) {
			cur := threadWaits()
			to := time.Now()
			ts := threadSample{from: from, to: to}
			for tid, w := range cur {
				if p, ok := prev[tid]; ok && w > p {
					if ts.waits == nil {
						ts.waits = map[string]time.Duration{}
					}
					ts.waits[tid] = w - p
				}
			}
			prev = cur
			l.mu.Lock()
			l.threads = append(l.threads, ts)
			l.mu.Unlock()
			from = to
		}
	})
	for i := range int(sleep / time.Millisecond) {
		wg.Go(func() {
			if !l.wait(time.Duration(i) * time.Millisecond) {
				return
			}
			for {
				start := time.Now()
				if !l.wait(sleep) {
					return
				}
				end := time.Now()
				l.mu.Lock()
				l.sleeps = append(l.sleeps, sleepSample{start: start, end: end, late: end.Sub(start) - sleep})
				l.mu.Unlock()
			}
		})
	}
	go func() {
		wg.Wait()
		l.mu.Lock()
		slices.SortFunc(l.sleeps, func(a, b sleepSample) int { return a.end.Compare(b.end) })
		for _, s := range l.sleeps {
			l.maxLate = max(l.maxLate, s.late)
		}
		l.mu.Unlock()
		close(l.done)
	}()
	return l
}

// wait sleeps d, and reports false, at once, when the measurement ends.
func (l *lateness) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.stop:
		return false
	case <-t.C:
		return true
	}
}

// end stops the measurement; it may be called more than once. The
// excuses read after it.
func (l *lateness) end() {
	l.once.Do(func() { close(l.stop) })
	<-l.done
}

// excuse returns what a call that ran from at for took may exceed its
// deadline by, on account of the machine: the worst lateness of the
// sleeps that overlap it (from just before it started, when a stall may
// already have held it up), which is how late its own timer may have
// fired, plus the longer of the longest run-queue wait of a goroutine and
// the most one thread waited for a CPU, over the same span.
func (l *lateness) excuse(at time.Time, took time.Duration) time.Duration {
	from, to := at.Add(-10*time.Millisecond), at.Add(took)
	l.mu.Lock()
	defer l.mu.Unlock()
	var late time.Duration
	i, _ := slices.BinarySearchFunc(l.sleeps, from, func(s sleepSample, t time.Time) int { return s.end.Compare(t) })
	// A sleep that began by to ends by to + its sleep + its lateness.
	for horizon := to.Add(l.sleep + l.maxLate); i < len(l.sleeps) && !l.sleeps[i].end.After(horizon); i++ {
		if s := l.sleeps[i]; !s.start.After(to) {
			late = max(late, s.late)
		}
	}
	var goroutine time.Duration
	j, _ := slices.BinarySearchFunc(l.runq, from, func(s runqSample, t time.Time) int { return s.to.Compare(t) })
	for ; j < len(l.runq) && !l.runq[j].from.After(to); j++ {
		goroutine = max(goroutine, l.runq[j].worst)
	}
	var held time.Duration
	sums := map[string]time.Duration{}
	k, _ := slices.BinarySearchFunc(l.threads, from, func(s threadSample, t time.Time) int { return s.to.Compare(t) })
	for ; k < len(l.threads) && !l.threads[k].from.After(to); k++ {
		for tid, w := range l.threads[k].waits {
			sums[tid] += w
			held = max(held, sums[tid])
		}
	}
	return late + max(goroutine, held)
}

// worst returns the worst lateness of a sleep over the whole run.
func (l *lateness) worst() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxLate
}

// threadWaits returns, by thread id, how long each thread of the process
// has waited runnable for a CPU (the second field of its schedstat).
// Threads it cannot read are left out.
func threadWaits() map[string]time.Duration {
	out := map[string]time.Duration{}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return out
	}
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/schedstat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			out[task.Name()] = time.Duration(ns)
		}
	}
	return out
}
