package client

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// simBucket is a token bucket answering with the fields floodgate's
// sidecar sends: remaining rounded down, reset and Retry-After rounded up
// to whole seconds, Retry-After at least 1.
type simBucket struct {
	rate, capacity, tokens float64
	last                   time.Duration
}

func (b *simBucket) take(now time.Duration) (allowed bool, h http.Header) {
	b.tokens = math.Min(b.capacity, b.tokens+b.rate*(now-b.last).Seconds())
	b.last = now
	var remaining, retry float64
	if b.tokens >= 1 {
		b.tokens--
		allowed, remaining = true, math.Floor(b.tokens)
	} else {
		retry = (1 - b.tokens) / b.rate
	}
	reset := math.Max((b.capacity-b.tokens)/b.rate, retry)
	h = http.Header{}
	h.Set("X-RateLimit-Limit", strconv.Itoa(int(b.capacity)))
	h.Set("RateLimit-Policy", fmt.Sprintf(`"sim.key";q=%d;w=1`, int(b.rate)))
	h.Set("RateLimit", fmt.Sprintf(`"sim.key";r=%d;t=%d`, int(remaining), int(math.Ceil(reset))))
	if !allowed {
		h.Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(retry)))))
	}
	return allowed, h
}

type simEvent struct {
	at     time.Duration
	client int
	send   bool // the request goes now; otherwise the caller is ready to send
}

type simQueue []simEvent

func (q simQueue) Len() int           { return len(q) }
func (q simQueue) Less(i, j int) bool { return q[i].at < q[j].at }
func (q simQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)        { *q = append(*q, x.(simEvent)) }
func (q *simQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// simulate runs clients closed-loop callers, each with its own Pacer and
// the Transport's retry delay, against one bucket for d of simulated time,
// and returns the requests sent and denied per second.
func simulate(clients int, rate float64, d time.Duration, seed uint64) (sent, denied []int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	b := &simBucket{rate: rate, capacity: rate, tokens: rate}
	pacers := make([]Pacer, clients)
	for i := range pacers {
		pacers[i].Rand = rng.Float64
	}
	epoch := time.Unix(1_700_000_000, 0)
	const rtt = time.Millisecond
	secs := int(d / time.Second)
	sent, denied = make([]int, secs), make([]int, secs)
	q := &simQueue{}
	for i := range clients {
		heap.Push(q, simEvent{at: time.Duration(rng.Int64N(int64(time.Millisecond))), client: i})
	}
	for q.Len() > 0 {
		e := heap.Pop(q).(simEvent)
		p := &pacers[e.client]
		if !e.send {
			// Ready: wait for the pacer's slot.
			heap.Push(q, simEvent{at: e.at + p.Reserve(epoch.Add(e.at)), client: e.client, send: true})
			continue
		}
		send := e.at
		if send >= d {
			continue
		}
		ok, h := b.take(send + rtt/2)
		back := send + rtt
		sec := int(send / time.Second)
		sent[sec]++
		status := http.StatusOK
		if !ok {
			status = http.StatusTooManyRequests
			denied[sec]++
		}
		f := ParseFields(h, epoch.Add(back))
		p.Observe(epoch.Add(back), status, f)
		// Allowed or denied, the caller is ready again at once: a denied
		// request is retried, and the pacer's hold spaces the retry.
		heap.Push(q, simEvent{at: back, client: e.client})
	}
	return sent, denied
}

// TestPacerSharesALimit runs independent callers, each with its own pacer,
// against one limit on simulated time: after the first second the callers
// together are admitted about the limit's rate, and at most 5% of what
// they send is denied (10% for a capacity of 5 shared by 20); for 100
// callers on 50/s, no second after the first has more than 5% denied.
func TestPacerSharesALimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		clients int
		rate    float64
		// maxDenied is the bound on the share denied after the first
		// second, and maxWorst on any one second after the first. A
		// capacity of a few units shared by many independent callers
		// cannot be kept from emptying now and then.
		maxDenied, maxWorst float64
	}{{100, 50, 0.05, 0.05}, {10, 50, 0.05, 0.05}, {1, 50, 0.05, 0.05}, {300, 100, 0.05, 0.5}, {20, 5, 0.1, 1}} {
		t.Run(fmt.Sprintf("%d callers at %v per second", tc.clients, tc.rate), func(t *testing.T) {
			t.Parallel()
			const d = 60 * time.Second
			sent, denied := simulate(tc.clients, tc.rate, d, 1)
			var s, dn int
			worst := 0.0
			for i := 1; i < len(sent); i++ {
				s += sent[i]
				dn += denied[i]
				if sent[i] > 0 {
					worst = max(worst, float64(denied[i])/float64(sent[i]))
				}
			}
			allowed := float64(s-dn) / (d - time.Second).Seconds()
			share := float64(dn) / float64(s)
			t.Logf("after the first second: sent %d, denied %d (%.2f%%, worst second %.1f%%), admitted %.1f/s; first second sent %d, denied %d",
				s, dn, 100*share, 100*worst, allowed, sent[0], denied[0])
			if worst > tc.maxWorst {
				t.Errorf("one second after the first had %.1f%% of its requests denied, want at most %v%%", 100*worst, 100*tc.maxWorst)
			}
			if share > tc.maxDenied {
				t.Errorf("denied %.2f%% of the requests sent after the first second, want at most %v%%", 100*share, 100*tc.maxDenied)
			}
			if allowed < 0.9*tc.rate {
				t.Errorf("admitted %.1f/s, want at least 90%% of the limit (%v/s)", allowed, tc.rate)
			}
		})
	}
}
