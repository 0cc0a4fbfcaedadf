package runner

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/expr"
)

// heapMargin is what the heap may hold after the large configs beyond
// what it held before them, in HeapAlloc: the bytes of live objects.
// (HeapInuse also counts the free room of the spans that still hold an
// object, which the runtime keeps: 1-2 MiB more after than before here.)
// Measured: the same sequence with each large config replaced by the
// one-rule config leaves 10-15 KiB more; with the large configs, about
// 70 KiB more, the room the metric families' indexes keep for a few dozen
// series. Today's code leaves 141 MiB more (28 MiB with the 2,000 rules of
// a race build): the replaced rule set, reachable from the connections'
// scratch; the metric families' indexes at their peak; the store's tables.
const heapMargin = 1 << 20

// heapFigures are the heap after a full collection.
type heapFigures struct {
	HeapAlloc, HeapInuse uint64
	RSS                  uint64 // 0 when /proc is not there
}

func (h heapFigures) String() string {
	mib := func(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB" }
	return "HeapAlloc " + mib(h.HeapAlloc) + ", HeapInuse " + mib(h.HeapInuse) + ", RSS " + mib(h.RSS)
}

// measureHeap collects twice (sync.Pools keep their objects through one
// collection), returns what it can to the OS, and reads the heap.
func measureHeap() heapFigures {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h := heapFigures{HeapAlloc: ms.HeapAlloc, HeapInuse: ms.HeapInuse}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				h.RSS = kb << 10
			}
		}
	}
	return h
}

// largeRules is the size of the large configs: config.MaxRules, or a
// fifth of it under the race detector, which still leaves today's leaks
// a hundred times the margin.
var largeRules = map[bool]int{false: 10000, true: 2000}[raceEnabled]

// largeConfig returns a config of the given number of rules in 20
// policies. With matching, every rule applies to GET /api/x with an
// X-API-Key, in the shapes the sidecar compiles differently: header keys,
// key alternatives, path prefixes and regular expressions, CEL conditions
// and key expressions, exemptions, every algorithm, shadow mode. Without
// it, each rule has an exact path of its own. The limits are 3 requests a
// second, so that a few requests fill the deny cache, and the counters
// expire within 3 seconds.
func largeConfig(rev string, matching bool, rules int) string {
	const policies = 20
	perPolicy := rules / policies
	algorithms := []string{"TokenBucket", "FixedWindow", "SlidingWindow", "GCRA", "SlidingLog"}
	type obj = map[string]any
	var pols []obj
	for p := range policies {
		list := make([]obj, 0, perPolicy)
		for i := range perPolicy {
			n := p*perPolicy + i
			r := obj{"limit": obj{"requests": 3, "per": "1s", "algorithm": algorithms[n%len(algorithms)]}}
			header := obj{"header": "X-API-Key"}
			if !matching {
				r["name"] = fmt.Sprintf("plain-%d", n)
				r["match"] = obj{"path": obj{"type": "Exact", "value": fmt.Sprintf("/p/%d", n)}}
				r["key"] = []any{header}
				list = append(list, r)
				continue
			}
			r["name"] = fmt.Sprintf("match-%d", n)
			switch {
			case n%50 == 0:
				// CEL, interpreted (compared with true) and as Go.
				r["match"] = obj{"when": []string{fmt.Sprintf("(request.headers['x-api-key'].size() > %d) == true", n%7)}}
				r["key"] = []any{obj{"expression": fmt.Sprintf("request.headers['x-api-key'] + '/%d'", n)}}
				r["exempt"] = obj{"when": []string{fmt.Sprintf("request.headers['x-exempt'] == '%d'", n)}}
			case n%5 == 1:
				r["match"] = obj{"path": obj{"type": "Prefix", "value": "/api"}}
				r["keys"] = []any{[]any{header}, []any{obj{"clientIP": obj{}}}}
			case n%5 == 2:
				r["match"] = obj{"path": obj{"type": "RegularExpression", "value": fmt.Sprintf("/api/[a-z]+(/%d)?", n)}, "methods": []string{"GET"}}
				r["key"] = []any{header}
			case n%5 == 3:
				r["mode"] = "Shadow"
				r["key"] = []any{header, obj{"method": obj{}}}
			default:
				r["key"] = []any{header}
			}
			list = append(list, r)
		}
		pols = append(pols, obj{"name": fmt.Sprintf("pol-%d", p), "uid": fmt.Sprintf("uid-%d", p), "rules": list})
	}
	b, err := json.Marshal(obj{"apiVersion": "floodgate.dev/sidecar-config/v1", "revision": rev, "policies": pols})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// oneRuleConfig is the small config before and after the large ones.
func oneRuleConfig(rev string) string {
	return policyDoc(rev, "key: [{header: X-API-Key}]\nlimit: {requests: 100, per: 1s}")
}

// A config that shrinks gives back the memory its rules took. The
// sidecar goes from one rule to 10,000 rules (largeRules), to 10,000
// rules that all match the traffic (so that counters, the deny cache,
// SlidingLog logs, metric series, CEL programs and the connections'
// scratch fill up), and back to one rule, through the apply path of its
// file watcher, with requests over loopback at each step on the same
// keep-alive connections. Once the counters of the removed rules have
// expired (their windows are 1s) and the in-memory stores have been
// swept, the heap is back to its size before the large configs.
func TestShrunkConfigGivesBackItsHeap(t *testing.T) {
	// Not parallel: it reads the process's heap, which parallel tests
	// would move.
	if testing.Short() {
		t.Skip("compiles two configs of thousands of rules")
	}
	b := newBackend(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	// At warn, deny events are counted, not logged into the test's
	// buffer, which would hold them in the heap.
	s := startSidecar(t, b.URL, oneRuleConfig("one"), true, "--log-level", "warn")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	t.Cleanup(client.CloseIdleConnections)
	// send sends perKey requests for each of keys API keys, four at a
	// time, and counts the answers by status.
	send := func(path string, keys, perKey int) map[int]int {
		t.Helper()
		type answer struct {
			status int
			err    error
		}
		answers := make(chan answer, keys*perKey)
		sem := make(chan struct{}, 4)
		for k := range keys {
			for range perKey {
				sem <- struct{}{}
				go func() {
					defer func() { <-sem }()
					req, _ := http.NewRequest("GET", s.url+path, nil)
					req.Header.Set("X-API-Key", "key-"+strconv.Itoa(k))
					res, err := client.Do(req)
					if err != nil {
						answers <- answer{err: err}
						return
					}
					_, _ = io.Copy(io.Discard, res.Body)
					_ = res.Body.Close()
					answers <- answer{status: res.StatusCode}
				}()
			}
		}
		got := map[int]int{}
		for range keys * perKey {
			a := <-answers
			if a.err != nil {
				t.Fatalf("GET %s: %v", path, a.err)
			}
			got[a.status]++
		}
		return got
	}
	apply := func(doc, rev string) {
		t.Helper()
		writeAtomic(t, s.policy, doc)
		// Compiling 10,000 rules takes seconds, more on a busy machine
		// or under the race detector; the wait only bounds a hang.
		deadline := time.Now().Add(5 * time.Minute)
		for s.Status().Revision != rev {
			if time.Now().After(deadline) {
				t.Fatalf("revision %q never applied; status %+v", rev, s.Status())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	send("/api/x", 8, 2)
	// cel-go builds its parser's tables, about 0.4 MiB, with the first
	// expression a process compiles, and keeps them: once, not per config.
	if _, err := expr.CompileConditions([]string{"(request.headers['x-api-key'].size() > 0) == true"}); err != nil {
		t.Fatal(err)
	}
	before := measureHeap()

	apply(largeConfig("plain", false, largeRules), "plain")
	if got := send("/p/7", 8, 2); got[http.StatusOK] != 16 {
		t.Fatalf("plain rules: answers %v, want 16 200s", got)
	}
	apply(largeConfig("matching", true, largeRules), "matching")
	// Four requests of a key within one second of each other are over
	// its rules' limits; a busy machine may spread a round of them wider,
	// so rounds go on until one has been refused (the deny cache then
	// holds entries too). The wait only bounds a hang.
	got := send("/api/x", 8, 4)
	for deadline := time.Now().Add(5 * time.Minute); got[http.StatusTooManyRequests] == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("matching rules: answers %v, want some 429s", got)
		}
		got = send("/api/x", 8, 4)
	}
	peak := measureHeap()
	if st := s.Status(); st.Rules != largeRules {
		t.Fatalf("%d rules in force, want %d", st.Rules, largeRules)
	}

	apply(oneRuleConfig("one again"), "one again")
	send("/api/x", 8, 2)
	// The counters of the removed rules live until their windows end, as
	// they would in Redis: a rule put back within its window finds its
	// counts. Every window here is 1s, so within 4s every counter has
	// expired (SlidingWindow's state lasts two windows, then
	// limiter.TTLMargin, rounded up to a second), and a sweep leaves the
	// stores empty; the wait only bounds a hang.
	deadline := time.Now().Add(time.Minute)
	for s.sweep() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the in-memory stores still hold %d keys a minute after the last request", s.sweep())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The metrics of the removed rules go off the apply path, soon after
	// it; here, now.
	s.applyMu.Lock()
	s.forgetPending()
	s.applyMu.Unlock()
	after := measureHeap()

	t.Logf("before the large configs: %v", before)
	t.Logf("%d matching rules:    %v", largeRules, peak)
	t.Logf("back to one rule:         %v", after)
	if after.HeapAlloc > before.HeapAlloc+heapMargin {
		t.Errorf("back to one rule, the heap holds %d bytes, %d more than before the large configs; want at most %d more",
			after.HeapAlloc, after.HeapAlloc-before.HeapAlloc, heapMargin)
	}
	if n := removedSeries(t, s); n > 0 {
		t.Errorf("/metrics still has %d series of removed rules", n)
	}
}

// removedSeries counts the series of /metrics labelled with a rule of the
// large configs.
func removedSeries(t *testing.T, s *sidecar) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(s.metricsText(t), "\n") {
		if strings.Contains(line, `rule="plain-`) || strings.Contains(line, `rule="match-`) {
			n++
		}
	}
	return n
}
