// Package failopen checks, with real sidecars in front of a real backend
// and a real Redis Cluster that is then killed, that a fleet of sidecars
// falling back to their local shares admits at most what one bucket of the
// rule's limit would, starting empty at the kill, for every limit and
// replica count, including a limit below the replica count, and that each
// replica spends the tokens dealt to it; and, with floodgate-sidecar
// processes whose store refuses connections, that a standalone sidecar
// without a share of its own (no --pod-name, or a name the policy's
// replicaPods does not list) refuses to start.
package failopen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/test/redistest"
	"github.com/floodgate-dev/floodgate/test/shares"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

type fleetCase struct {
	name     string
	requests int64
	per      time.Duration
	replicas int
	// run is how long traffic is offered after the kill; workers send
	// requests round robin over the sidecars, each pausing pace between
	// two requests.
	run     time.Duration
	workers int
	pace    time.Duration
}

func TestFleetHoldsTheLimitWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	for _, tc := range []fleetCase{
		{name: "3 per minute on 10 replicas", requests: 3, per: time.Minute, replicas: 10, run: 150 * time.Second, workers: 1, pace: 100 * time.Millisecond},
		{name: "1000 per second on 3 replicas", requests: 1000, per: time.Second, replicas: 3, run: 5 * time.Second, workers: 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runFleet(t, tc)
		})
	}
}

func runFleet(t *testing.T, tc fleetCase) {
	cluster := redistest.StartCluster(t, redistest.Options{Masters: 1})
	var backendHits atomic.Int64
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		backendHits.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(be.Close)

	// One document for the fleet: the replicas listed by pod name, as
	// floodgate-manager writes them.
	var pods, idx []string
	for i := range tc.replicas {
		pods = append(pods, fmt.Sprintf("%q", fmt.Sprintf("api-%d", i)))
		idx = append(idx, fmt.Sprint(i))
	}
	doc := fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
pods: [%s]
policies:
- name: login
  uid: fleet
  replicas: %d
  replicaPods: [%s]
  rules:
  - name: per-user
    key: [{header: X-User}]
    failureMode: Open
    limit: {requests: %d, per: %v}
`, strings.Join(pods, ", "), tc.replicas, strings.Join(idx, ", "), tc.requests, tc.per)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var urls []string
	for i := range tc.replicas {
		urls = append(urls, startSidecar(t, policy, be.URL, fmt.Sprintf("api-%d", i), cluster.Addrs()))
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	send := func(replica int, user string) shares.Answer {
		a := shares.Answer{Replica: replica, Sent: time.Now()}
		req, err := http.NewRequest(http.MethodGet, urls[replica]+"/login", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-User", user)
		res, err := client.Do(req)
		if err != nil {
			t.Errorf("request: %v", err)
			a.Done = time.Now()
			return a
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		a.Code, a.Done = res.StatusCode, time.Now()
		return a
	}
	// With the store up, every sidecar decides on it. The key is not the
	// one measured: that one's shares are first seen after the kill, and
	// start empty there.
	for i := range urls {
		if got := send(i, "warm").Code; got != http.StatusOK && got != http.StatusTooManyRequests {
			t.Fatalf("with the store up: %d", got)
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
	killed := time.Now()
	hits0 := backendHits.Load()

	var mu sync.Mutex
	var answers []shares.Answer
	var next atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), tc.run)
	defer cancel()
	for range tc.workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				a := send(int(next.Add(1))%len(urls), "alice")
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
				if a.Code != http.StatusOK && a.Code != http.StatusTooManyRequests && a.Code != 0 {
					t.Errorf("a request while the store is down got %d, neither 200 nor 429", a.Code)
				}
				if tc.pace > 0 {
					time.Sleep(tc.pace)
				}
			}
		})
	}
	wg.Wait()

	// What the fleet admitted is judged on when the sidecars decided,
	// which each answer bounds: after its request was sent, before its
	// answer came back. A busy machine may answer late, or hold the
	// clients, but the tokens a share deals arrive on the sidecars' clock.
	fleet := shares.Share{Index: 0, Of: 1, Requests: tc.requests, Period: tc.per}
	var admitted []shares.Answer
	for _, a := range answers {
		if a.Code == http.StatusOK {
			admitted = append(admitted, a)
		}
	}
	// No more than one bucket of the limit, starting empty at the kill:
	// by the time any answer came back, the fleet had admitted no more
	// than the tokens that had arrived since the kill.
	slices.SortFunc(admitted, func(a, b shares.Answer) int { return a.Done.Compare(b.Done) })
	var worstAt shares.Answer
	worstN, worstArrived := 0, 0
	for k, a := range admitted {
		if n, arrived := k+1, fleet.Tokens(killed, a.Done); n-arrived > worstN-worstArrived {
			worstAt, worstN, worstArrived = a, n, arrived
		}
	}
	if worstN > worstArrived {
		t.Errorf("%v after the kill the fleet had admitted %d, more than the %d tokens of the limit that had arrived since",
			worstAt.Done.Sub(killed), worstN, worstArrived)
	}
	// Within any stretch of time, no more than the bucket's capacity (the
	// limit) and what refilled it in the stretch: for a period, twice the
	// limit. The stretches are a period from each admitted request's
	// start, and count the admissions certainly decided within them.
	slices.SortFunc(admitted, func(a, b shares.Answer) int { return a.Sent.Compare(b.Sent) })
	worst, worstBound := 0, 0
	var worstFrom time.Time
	for i, a := range admitted {
		end, n := a.Sent.Add(tc.per), 0
		for _, b := range admitted[i:] {
			if !b.Sent.Before(end) {
				break
			}
			if !b.Done.After(end) {
				n++
			}
		}
		if bound := int(tc.requests) + fleet.Tokens(a.Sent, end); n-bound > worst-worstBound || worstFrom.IsZero() {
			worst, worstBound, worstFrom = n, bound, a.Sent
		}
	}
	if worst > worstBound {
		t.Errorf("the %v from %v after the kill admitted %d, more than one bucket of the limit could (%d)", tc.per, worstFrom.Sub(killed), worst, worstBound)
	}
	// Each replica spends the tokens dealt to it: all those that arrived
	// between two refusals of its own close enough that none could expire
	// unasked; and no more than those that arrived while it was asked.
	var lowers, uppers []int
	total := 0
	for i := range urls {
		var mine []shares.Answer
		for _, a := range answers {
			if a.Replica == i {
				mine = append(mine, a)
			}
		}
		slices.SortFunc(mine, func(a, b shares.Answer) int { return a.Sent.Compare(b.Sent) })
		sh := shares.Share{Index: i, Of: tc.replicas, Requests: tc.requests, Period: tc.per}
		got := 0
		for _, a := range mine {
			if a.Code == http.StatusOK {
				got++
			}
		}
		lo, hi := sh.RefusedBetween(mine), 0
		if len(mine) > 0 {
			hi = sh.Tokens(mine[0].Sent, mine[len(mine)-1].Done)
		}
		if got < lo || got > hi {
			t.Errorf("replica api-%d admitted %d, want the tokens dealt to it: %d to %d", i, got, lo, hi)
		}
		lowers, uppers, total = append(lowers, lo), append(uppers, hi), total+got
	}
	perPeriod := make([]int, int(tc.run/tc.per)+1)
	for _, a := range admitted {
		if p := int(a.Done.Sub(killed) / tc.per); p < len(perPeriod) {
			perPeriod[p]++
		}
	}
	want := float64(tc.requests) * float64(tc.run) / float64(tc.per)
	t.Logf("L=%d per %v, R=%d, Redis killed, %v of traffic: %d requests offered, %d admitted (backend saw %d), %.2f of the limit's rate; answered per period from the kill: %v; most decided in a window of %v: %d (bound %d); per replica %d to %d dealt",
		tc.requests, tc.per, tc.replicas, tc.run, len(answers), len(admitted), backendHits.Load()-hits0, float64(len(admitted))/want, perPeriod, tc.per, worst, worstBound, lowers, uppers)
	if got := backendHits.Load() - hits0; got != int64(len(admitted)) {
		t.Errorf("the backend saw %d requests, the clients %d admitted", got, len(admitted))
	}
}

// startSidecar runs floodgate-sidecar for pod name on policy, in front of
// upstream, with the Redis Cluster at addrs; it returns the proxy's URL.
func startSidecar(t *testing.T, policy, upstream, name string, addrs []string) string {
	t.Helper()
	return simnode.RunInProcess(t, "--upstream", upstream, "--policy-file", policy, "--pod-name", name,
		"--store", "redis", "--redis-addrs", strings.Join(addrs, ","), "--redis-timeout", "1s")
}
