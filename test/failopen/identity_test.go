package failopen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/test/shares"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

// The standalone fleet: replicas sidecars of one policy file, a rule of
// limit per period that fails open, and a store that refuses connections
// from the start.
const (
	replicas = 10
	limit    = 3
	period   = time.Minute
	// window is how long the fleet is offered traffic: shorter than a
	// period, so that the limit bounds what it may admit, and longer
	// than two token spacings (period/limit), so that tokens arrive in
	// it. rounds bounds the requests: one to each sidecar per round, a
	// round every pace.
	window = 45 * time.Second
	pace   = 500 * time.Millisecond
	rounds = int(window / pace)
)

// fleetPolicy is the fleet's policy file; listed lists the replicas in pods
// and replicaPods as api-0 to api-9.
func fleetPolicy(t *testing.T, listed bool) string {
	t.Helper()
	var pods, places string
	if listed {
		var names, idx []string
		for i := range replicas {
			names = append(names, fmt.Sprintf("api-%d", i))
			idx = append(idx, fmt.Sprint(i))
		}
		pods = fmt.Sprintf("pods: [%s]\n", strings.Join(names, ", "))
		places = fmt.Sprintf("  replicaPods: [%s]\n", strings.Join(idx, ", "))
	}
	doc := fmt.Sprintf(`apiVersion: floodgate.dev/sidecar-config/v1
%spolicies:
- name: login
  uid: fleet
  replicas: %d
%s  rules:
  - name: per-user
    key: [{header: X-User}]
    failureMode: Open
    limit: {requests: %d, per: %v}
`, pods, replicas, places, limit, period)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// binDir holds the floodgate-sidecar that sidecarBin built, if it did.
var binDir atomic.Pointer[string]

// sidecarBin builds floodgate-sidecar once, for the tests that run it as
// a process.
var sidecarBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "failopen-sidecar")
	if err != nil {
		return "", err
	}
	binDir.Store(&dir)
	return simnode.BuildSidecar(context.Background(), filepath.Join("..", ".."), dir)
})

func TestMain(m *testing.M) {
	code := m.Run()
	if dir := binDir.Load(); dir != nil {
		_ = os.RemoveAll(*dir)
	}
	os.Exit(code)
}

// A standalone fleet of floodgate-sidecar processes with replicas: 10, a
// rule of 3 per minute that fails open, and its Redis store refusing
// connections: sidecars that cannot take a fail-open share of their own
// refuse to start, naming the flag and the policy, and a fleet whose
// replicas are listed admits at most the limit together, each token once.
//
// The defect this pins: with no --pod-name, every sidecar took the place
// of the empty name, so all ten spent the same token, admitting 10 in a
// moment where the limit allowed 3.
func TestStandaloneFleetNeedsAPlaceEach(t *testing.T) {
	t.Parallel()
	bin, err := sidecarBin()
	if err != nil {
		t.Fatal(err)
	}
	// Nothing listens here: the store is down from the start.
	store, err := simnode.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	var backendHits atomic.Int64
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		backendHits.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(be.Close)
	args := func(policy string, name string) []string {
		a := []string{"--policy-file", policy, "--upstream", be.URL, "--store", "redis", "--redis-addrs", store}
		if name != "" {
			a = append(a, "--pod-name", name)
		}
		return a
	}

	unlisted := fleetPolicy(t, false)
	t.Run("without --pod-name, refused", func(t *testing.T) {
		t.Parallel()
		refused(t, bin, func(int) []string { return args(unlisted, "") },
			fmt.Sprintf(`floodgate-sidecar: %s: policy "login": replicas is 10 but this sidecar has no pod identity (--pod-name): `+
				`its fail-open share could collide with every other replica's; set --pod-name, or replicas to 1`, unlisted))
	})
	t.Run("with --pod-name not in replicaPods, refused", func(t *testing.T) {
		t.Parallel()
		refused(t, bin, func(i int) []string { return args(unlisted, fmt.Sprintf("api-%d", i)) },
			fmt.Sprintf(`floodgate-sidecar: %s: policy "login": replicas is 10 but this sidecar's pod "api-%%d" (--pod-name) is not in its replicaPods: `+
				`its fail-open share, placed by a hash of the name, could collide with another replica's; `+
				`list every replica in pods and replicaPods, or set replicas to 1`, unlisted))
	})
	t.Run("listed, the fleet holds the limit", func(t *testing.T) {
		t.Parallel()
		listed := fleetPolicy(t, true)
		urls := make([]string, replicas)
		var wg sync.WaitGroup
		for i := range replicas {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				s, err := simnode.StartStandalone(ctx, bin, t.TempDir(), args(listed, fmt.Sprintf("api-%d", i))...)
				if err != nil {
					t.Errorf("sidecar api-%d: %v", i, err)
					return
				}
				t.Cleanup(func() { s.Stop(10 * time.Second) })
				urls[i] = s.URL
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		hits0 := backendHits.Load()
		runListedFleet(t, urls, func() int64 { return backendHits.Load() - hits0 })
	})
}

// refused starts the fleet's sidecars, the i-th with args(i), and checks
// that each exits with status 1 and the message want (a %d in it is i)
// as its last line, without serving a request.
func refused(t *testing.T, bin string, args func(i int) []string, want string) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, append(args(i), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")...)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Errorf("sidecar %d still running after a minute; output:\n%s", i, out)
				return
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Errorf("sidecar %d: %v, want exit status 1; output:\n%s", i, err, out)
				return
			}
			lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
			w := want
			if strings.Contains(w, "%d") {
				w = fmt.Sprintf(want, i)
			}
			if last := lines[len(lines)-1]; last != w {
				t.Errorf("sidecar %d: last line\n%s\nwant\n%s", i, last, w)
			}
		})
	}
	wg.Wait()
}

// runListedFleet offers the fleet at urls a request for one key at every
// replica each round, for at most rounds rounds in window, and checks
// what it admitted against the tokens dealt to it: token j of the limit
// arrives at j * period/limit since the epoch and belongs to replica j mod
// replicas alone, which may spend it once it has seen the key (a key
// starts empty). hits is what the backend saw.
func runListedFleet(t *testing.T, urls []string, hits func() int64) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2}}
	t.Cleanup(client.CloseIdleConnections)
	send := func(i int) shares.Answer {
		a := shares.Answer{Replica: i, Sent: time.Now()}
		req, err := http.NewRequest(http.MethodGet, urls[i]+"/login", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-User", "alice")
		res, err := client.Do(req)
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
			a.Done = time.Now()
			return a
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		a.Code, a.Done = res.StatusCode, time.Now()
		return a
	}
	var answers []shares.Answer
	tick := time.NewTicker(pace)
	defer tick.Stop()
	start := time.Now()
	for r := 0; r < rounds && time.Since(start) < window; r++ {
		for i := range urls {
			answers = append(answers, send(i))
		}
		<-tick.C
	}
	elapsed := time.Since(start)

	// The tokens each replica could have spent: those that arrived after
	// its first decision and before its last. lower counts those that
	// certainly arrived between the first answer and the last request,
	// upper those that may have, between the first request and the last
	// answer.
	first := make([]shares.Answer, len(urls))
	last := make([]shares.Answer, len(urls))
	admitted := make([]int, len(urls))
	codes := map[int]int{}
	for _, a := range answers {
		if first[a.Replica].Sent.IsZero() {
			first[a.Replica] = a
		}
		last[a.Replica] = a
		codes[a.Code]++
		if a.Code == http.StatusOK {
			admitted[a.Replica]++
		}
	}
	// tokens counts replica i's tokens arriving in (from, to].
	spacing := int64(period / limit)
	tokens := func(i int, from, to time.Time) int {
		n := 0
		for j := from.UnixNano()/spacing + 1; j*spacing <= to.UnixNano(); j++ {
			if j%replicas == int64(i) {
				n++
			}
		}
		return n
	}
	total, lower, upper := 0, 0, 0
	for i := range urls {
		lo, hi := tokens(i, first[i].Done, last[i].Sent), tokens(i, first[i].Sent, last[i].Done)
		if admitted[i] < lo || admitted[i] > hi {
			t.Errorf("replica api-%d admitted %d, want the tokens dealt to it in its window: %d to %d", i, admitted[i], lo, hi)
		}
		total, lower, upper = total+admitted[i], lower+lo, upper+hi
	}
	t.Logf("%d sidecars, replicas %d, %d per %v, store refusing connections: %d requests over %v (%v); admitted %d, per replica %v; tokens dealt to the fleet in its window: %d to %d",
		len(urls), replicas, limit, period, len(answers), elapsed.Round(time.Millisecond), codes, total, admitted, lower, upper)
	if total > limit {
		t.Errorf("the fleet admitted %d in %v, more than the limit %d per %v", total, elapsed.Round(time.Millisecond), limit, period)
	}
	if lower == 0 {
		t.Errorf("no token certainly arrived in the %v window: it shows nothing", elapsed.Round(time.Millisecond))
	}
	if codes[http.StatusOK]+codes[http.StatusTooManyRequests] != len(answers) {
		t.Errorf("answers %v, want only 200 and 429 from a rule that fails open", codes)
	}
	if got := hits(); got != int64(total) {
		t.Errorf("the backend saw %d requests, the clients %d admitted", got, total)
	}
	if span := answers[len(answers)-1].Done.Sub(answers[0].Sent); span >= period {
		t.Errorf("the traffic took %v, a period or more: the limit bounds a period's admissions, not these", span)
	}
}
