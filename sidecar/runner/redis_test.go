package runner

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/test/redistest"
	"github.com/floodgate-dev/floodgate/test/shares"
)

func TestExactAllowedCountsRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, redistest.Options{Masters: 3})
	cc := cluster.NewClient()
	t.Cleanup(func() { _ = cc.Close() })
	addrs := strings.Join(cluster.Addrs(), ",")
	be := newBackend(t, nil)
	for _, alg := range algorithms {
		t.Run(alg, func(t *testing.T) {
			// Two sidecars share the cluster: together they admit exactly
			// the limit.
			doc := fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
policies:
- name: p
  uid: uid-%s
  rules:
  - name: r
    key: [{header: X-User}]
    limit: {requests: 7, per: 1h, algorithm: %s}
`, strings.ToLower(alg), alg)
			// A generous call budget: under -race on a shared machine the
			// default 50ms can pass, and a timed-out call falls back to a
			// local bucket, which is not what this test measures.
			args := []string{"--store", "redis", "--redis-addrs", addrs, "--redis-timeout", "2s"}
			a := startSidecar(t, be.URL, doc, true, args...)
			b := startSidecar(t, be.URL, doc, true, args...)
			c := &http.Client{}
			// Redis counts on its own clock, in hour-long windows for
			// FixedWindow and SlidingWindow: requests that a window
			// boundary splits count in two, and are sent again for a
			// user of their own.
			var counts map[int]int
			redistest.InOneWindow(t, cc, time.Hour, func(attempt int) func() {
				counts = map[int]int{}
				for i := range 30 {
					url := a.url
					if i%2 == 1 {
						url = b.url
					}
					res, _ := get(t, c, url+"/x", "X-User", fmt.Sprint("alice-", attempt))
					counts[res.StatusCode]++
				}
				return func() {}
			})
			for _, sc := range []*sidecar{a, b} {
				if n := sc.metric(t, `floodgate_sidecar_fallback_decisions_total{policy="p",result="allowed",rule="r"}`); n != 0 {
					t.Fatalf("%v decisions fell back to local buckets: Redis calls failed", n)
				}
			}
			if counts[200] != 7 || counts[429] != 23 {
				t.Errorf("statuses over two sidecars %v, want 7x200 and 23x429", counts)
			}
			if got := a.Status().Store; got.Type != "redis" || got.From != "flags" {
				t.Errorf("store status %+v", got)
			}
		})
	}
}

func TestStoreFromPolicyFile(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, redistest.Options{Masters: 1})
	be := newBackend(t, nil)
	quoted := make([]string, 0, len(cluster.Addrs()))
	for _, a := range cluster.Addrs() {
		quoted = append(quoted, strconv.Quote(a))
	}
	doc := fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
store: {type: redis, addresses: [%s]}
policies:
- name: p
  uid: uid-file
  rules:
  - name: r
    limit: {requests: 2, per: 1h}
`, strings.Join(quoted, ","))
	sc := startSidecar(t, be.URL, doc, true, "--redis-timeout", "2s")
	if got := sc.Status().Store; got.Type != "redis" || got.From != "policy-file" {
		t.Fatalf("store status %+v, want redis from the policy file", got)
	}
	c := &http.Client{}
	var codes []int
	for range 3 {
		res, _ := get(t, c, sc.url+"/")
		codes = append(codes, res.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 200 429]" {
		t.Errorf("codes %v", codes)
	}
	// The counter lives in Redis, not in the sidecar.
	n, err := cluster.NewClient().Keys(t.Context(), "fg:{uid-file:r:*").Result()
	if err != nil || len(n) != 1 {
		t.Errorf("redis keys %v, %v; want one counter of uid-file", n, err)
	}
}

func TestFailureModesWithClusterKilled(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, redistest.Options{Masters: 3})
	be := newBackend(t, nil)
	doc := `apiVersion: floodgate.dev/sidecar-config/v1
pods: [api-0, api-1]
policies:
- name: p
  uid: uid-fail
  replicas: 2
  replicaPods: [0, 1]
  rules:
  - name: open
    match: {path: {type: Prefix, value: /open}}
    key: [{header: X-User}]
    failureMode: Open
    limit: {requests: 10, per: 1s}
  - name: closed
    match: {path: {type: Prefix, value: /closed}}
    key: [{header: X-User}]
    failureMode: Closed
    limit: {requests: 10, per: 1h}
`
	// A budget that a loaded test machine meets: with the cluster up,
	// every call must succeed. Dead nodes refuse connections at once.
	sc := startSidecar(t, be.URL, doc, true, "--pod-name", "api-0", "--store", "redis", "--redis-addrs", strings.Join(cluster.Addrs(), ","), "--redis-timeout", "2s")
	c := &http.Client{}
	for _, p := range []string{"/open", "/closed"} {
		if res, _ := get(t, c, sc.url+p, "X-User", "warm"); res.StatusCode != 200 {
			t.Fatalf("%s with the cluster up: %d", p, res.StatusCode)
		}
	}
	var wg sync.WaitGroup
	for _, n := range cluster.Nodes() {
		wg.Go(func() {
			if err := cluster.Kill(n); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()

	// Closed: 503 with Retry-After and a problem body; nothing reaches the
	// application.
	before := be.hits.Load()
	for range 3 {
		res, body := get(t, c, sc.url+"/closed", "X-User", "u")
		if res.StatusCode != 503 {
			t.Fatalf("fail-closed rule with the cluster down: %d, want 503", res.StatusCode)
		}
		if ra, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("Retry-After = %q", res.Header.Get("Retry-After"))
		}
		var p map[string]any
		if err := json.Unmarshal([]byte(body), &p); err != nil || p["status"] != 503.0 {
			t.Errorf("503 body %q: %v", body, err)
		}
	}
	if be.hits.Load() != before {
		t.Errorf("a fail-closed request reached the application")
	}
	// Open: this replica's share of 10 per second among 2 replicas, 5 per
	// second, starting empty: requests every 20ms for 2s take every token
	// of the share as it arrives (10, the first request finding none).
	// What it admits is judged against the tokens dealt to it while it
	// was asked, each answer known to have been decided between its
	// request and its answer, however a busy machine spaced them.
	counts := map[int]int{}
	var answers []shares.Answer
	for start := time.Now(); time.Since(start) < 2*time.Second; time.Sleep(20 * time.Millisecond) {
		a := shares.Answer{Sent: time.Now()}
		res, _ := get(t, c, sc.url+"/open", "X-User", "u")
		a.Done, a.Code = time.Now(), res.StatusCode
		answers = append(answers, a)
		counts[res.StatusCode]++
	}
	sh := shares.Share{Index: 0, Of: 2, Requests: 10, Period: time.Second}
	lo, hi := sh.RefusedBetween(answers), sh.Tokens(answers[0].Sent, answers[len(answers)-1].Done)
	if counts[200] < lo || counts[200] > hi || counts[429] == 0 || len(counts) != 2 {
		t.Errorf("fail-open rule with the cluster down: %v, want %d to %d x200 (the share of 10/s among 2 replicas dealt in the %v of requests), the rest 429",
			counts, lo, hi, answers[len(answers)-1].Done.Sub(answers[0].Sent))
	}
	// The shards that hold the test's counters were called and failed:
	// their breakers are not closed.
	notClosed := 0
	for _, n := range cluster.Nodes() {
		if sc.metric(t, `floodgate_sidecar_store_breaker_state{shard="`+n.Addr()+`"}`) != 0 {
			notClosed++
		}
	}
	if notClosed == 0 {
		t.Errorf("no shard breaker reported open or half-open with the cluster dead")
	}
	if got := sc.metric(t, "floodgate_sidecar_fallback_active"); got != 1 {
		t.Errorf("fallback_active = %v, want 1", got)
	}
	if got := sc.metric(t, `floodgate_sidecar_fallback_decisions_total{policy="p",result="allowed",rule="open"}`); got != float64(counts[200]) {
		t.Errorf("fallback allowed = %v, want %d", got, counts[200])
	}
	if got := sc.metric(t, `floodgate_sidecar_decisions_total{policy="p",result="unavailable",rule="closed"}`); got != 3 {
		t.Errorf("unavailable decisions = %v, want 3", got)
	}
}

// TestStoreFollowsNewAddresses replaces every node of the store, as
// deleting every Pod of a managed store does, and publishes the new
// addresses in the policy file, as the manager does in the ConfigMap: the
// sidecar counts in the new cluster without a restart, and still reports
// no drift.
func TestStoreFollowsNewAddresses(t *testing.T) {
	t.Parallel()
	old := redistest.StartCluster(t, redistest.Options{Masters: 1})
	be := newBackend(t, nil)
	doc := func(rev string, addrs []string) string {
		quoted := make([]string, 0, len(addrs))
		for _, a := range addrs {
			quoted = append(quoted, strconv.Quote(a))
		}
		return fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
revision: %q
store: {type: redis, addresses: [%s]}
policies:
- name: p
  uid: uid-follow
  rules:
  - name: r
    key: [{header: X-User}]
    failureMode: Closed
    limit: {requests: 2, per: 1h}
`, rev, strings.Join(quoted, ","))
	}
	sc := startSidecar(t, be.URL, doc("1", old.Addrs()), true, "--redis-timeout", "2s",
		"--redis-breaker-failures", "1", "--redis-breaker-cooldown", "100ms")
	c := &http.Client{}
	codes := func(user string) string {
		var out []int
		for range 3 {
			res, _ := get(t, c, sc.url+"/", "X-User", user)
			out = append(out, res.StatusCode)
		}
		return fmt.Sprint(out)
	}
	if got := codes("a"); got != "[200 200 429]" {
		t.Fatalf("codes on the first cluster %s", got)
	}
	for _, n := range old.Nodes() {
		if err := old.Kill(n); err != nil {
			t.Fatal(err)
		}
	}
	if res, _ := get(t, c, sc.url+"/", "X-User", "b"); res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("fail-closed rule with every node gone: %d, want 503", res.StatusCode)
	}

	repl := redistest.StartCluster(t, redistest.Options{Masters: 1})
	writeAtomic(t, sc.policy, doc("2", repl.Addrs()))
	sc.waitRevision(t, "2")
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, _ := get(t, c, sc.url+"/", "X-User", "probe")
		if res.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision on the new cluster 10s after its addresses were published: %d", res.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := codes("c"); got != "[200 200 429]" {
		t.Errorf("codes on the new cluster %s, want [200 200 429]", got)
	}
	n, err := repl.NewClient().Keys(t.Context(), "fg:{uid-follow:r:*").Result()
	if err != nil || len(n) != 2 {
		t.Errorf("keys on the new cluster %v, %v; want the counters of users probe and c", n, err)
	}
	st := sc.Status()
	if st.StoreDrift != "" {
		t.Errorf("storeDrift %q after following new addresses", st.StoreDrift)
	}
	if fmt.Sprint(st.Store.Addresses) != fmt.Sprint(repl.Addrs()) {
		t.Errorf("store addresses %v, want %v", st.Store.Addresses, repl.Addrs())
	}
}
