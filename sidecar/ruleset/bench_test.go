package ruleset

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/engine"
	"github.com/floodgate-dev/floodgate/sidecar/match"
	"github.com/floodgate-dev/floodgate/sidecar/metrics"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// The benchmark's policy: 10 rules, each limiting one service's GET and
// POST requests of the free tier, per user. It is written three ways: with
// the declarative matchers, with 3 CEL conditions per rule in the forms
// people write, and with the same conditions in a form that only cel-go's
// interpreter runs (each compared with true), to show what the
// translation into Go saves.
const benchRules = 10

// benchPolicy writes the policy; match gives rule i's match block.
func benchPolicy(match func(i int) string) string {
	var b strings.Builder
	b.WriteString("apiVersion: floodgate.dev/sidecar-config/v1\npolicies:\n- name: p\n  uid: p-uid\n  rules:\n")
	for i := range benchRules {
		fmt.Fprintf(&b, "  - name: svc%d\n    match: %s\n    key: [{header: X-User}]\n    limit: {requests: 1000000000, per: 1s}\n", i, match(i))
	}
	return b.String()
}

var benchPolicies = []struct{ name, doc string }{
	{"declarative", benchPolicy(func(i int) string {
		return fmt.Sprintf(`{path: {type: Prefix, value: /svc%d/}, methods: [GET, POST], headers: [{name: X-Tier, value: free}]}`, i)
	})},
	{"cel", benchPolicy(func(i int) string {
		return fmt.Sprintf(`{when: ["request.path.startsWith('/svc%d/')", "request.method in ['GET', 'POST']", "request.headers['x-tier'] == 'free'"]}`, i)
	})},
	{"cel-interpreted", benchPolicy(func(i int) string {
		return fmt.Sprintf(`{when: ["request.path.startsWith('/svc%d/') == true", "(request.method in ['GET', 'POST']) == true", "(request.headers['x-tier'] == 'free') == true"]}`, i)
	})},
}

// benchRequests is the traffic: every service, three methods, two tiers,
// a hundred users.
func benchRequests() []*http.Request {
	var out []*http.Request
	methods := []string{"GET", "POST", "DELETE"}
	tiers := []string{"free", "gold"}
	for n := range 120 {
		req := httptest.NewRequest(methods[n%3], fmt.Sprintf("/svc%d/items/%d", n%benchRules, n), nil)
		req.Header.Set("X-Tier", tiers[n/3%2])
		req.Header.Set("X-User", fmt.Sprintf("user-%d", n%100))
		req.Header.Set("User-Agent", "bench")
		req.Header.Set("Accept", "*/*")
		req.RemoteAddr = "192.0.2.1:1234"
		out = append(out, req)
	}
	return out
}

// decider is one way of writing the policy, compiled, with an engine on
// the in-memory store.
type decider struct {
	set *Set
	e   *engine.Engine
	sc  Scratch
	v   engine.Verdict
}

func newDecider(tb testing.TB, doc string) *decider {
	tb.Helper()
	c, err := config.Load([]byte(doc))
	if err != nil {
		tb.Fatal(err)
	}
	m := metrics.NewMetrics(prometheus.NewRegistry())
	set, err := Compile(c, labels.Set{}, m)
	if err != nil {
		tb.Fatal(err)
	}
	st, err := memstore.New()
	if err != nil {
		tb.Fatal(err)
	}
	e, err := engine.New(engine.Options{Store: st, Fallback: st, Metrics: m})
	if err != nil {
		tb.Fatal(err)
	}
	return &decider{set: set, e: e}
}

// decide is the sidecar's decision on one request, as the proxy takes it:
// match, exemptions, keys and cost, then the engine. It returns the number
// of hits.
func (d *decider) decide(ctx context.Context, req *http.Request) int {
	d.sc.Request.Reset(req, match.CleanPath(req.URL.Path), d.set.Policies)
	if err := d.set.Evaluate(&d.sc); err != nil {
		panic(err)
	}
	if len(d.sc.Hits) > 0 {
		d.e.Decide(ctx, d.sc.Hits, &d.v)
	}
	return len(d.sc.Hits)
}

// The three ways of writing the policy decide alike: the benchmark
// compares equal work.
func TestBenchPoliciesAgree(t *testing.T) {
	t.Parallel()
	reqs := benchRequests()
	ctx := context.Background()
	var want [][]int
	for pi, p := range benchPolicies {
		d := newDecider(t, p.doc)
		matched := 0
		for i, req := range reqs {
			d.decide(ctx, req)
			got := slices.Clone(d.sc.Rules)
			if pi == 0 {
				want = append(want, got)
				matched += len(got)
				continue
			}
			if !slices.Equal(got, want[i]) {
				t.Errorf("%s: request %d (%s %s) hits rules %v, declarative %v", p.name, i, req.Method, req.URL.Path, got, want[i])
			}
		}
		if pi == 0 && (matched == 0 || matched == len(reqs)) {
			t.Errorf("the declarative policy matched %d of %d requests; the traffic should mix hits and misses", matched, len(reqs))
		}
		if pi == 1 {
			for _, r := range d.set.Matcher.Programs() {
				if n, total := r.Native(); n != total {
					t.Errorf("%s: %d of %d conditions run in the interpreter", p.name, total-n, total)
				}
			}
		}
	}
}

// BenchmarkDecideConditions decides the traffic under each way of writing
// the policy.
func BenchmarkDecideConditions(b *testing.B) {
	reqs := benchRequests()
	ctx := context.Background()
	for _, p := range benchPolicies {
		b.Run(p.name, func(b *testing.B) {
			d := newDecider(b, p.doc)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				d.decide(ctx, reqs[i%len(reqs)])
				i++
			}
		})
	}
}

// BenchmarkDecideConditionsRatio interleaves the declarative and CEL
// policies in slices of 512 requests, so that both see the same machine
// load, and reports the median over the slices of each one's time per
// decision and of their ratio (cel/declarative); a slice that another
// process preempted skews one pair, not the median. The acceptance bound
// is 1.25. One iteration is a slice of each.
func BenchmarkDecideConditionsRatio(b *testing.B) {
	reqs := benchRequests()
	ctx := context.Background()
	decl := newDecider(b, benchPolicies[0].doc)
	cel := newDecider(b, benchPolicies[1].doc)
	const slice = 512
	var dns, cns, ratios []float64
	i := 0
	for b.Loop() {
		// Alternate which goes first, so that neither always runs on a
		// warm or a cold cache.
		first, second := decl, cel
		if len(ratios)%2 == 1 {
			first, second = cel, decl
		}
		start := time.Now()
		for j := range slice {
			first.decide(ctx, reqs[(i+j)%len(reqs)])
		}
		mid := time.Now()
		for j := range slice {
			second.decide(ctx, reqs[(i+j)%len(reqs)])
		}
		end := time.Now()
		td, tc := mid.Sub(start), end.Sub(mid)
		if first == cel {
			td, tc = tc, td
		}
		d, c := float64(td.Nanoseconds())/slice, float64(tc.Nanoseconds())/slice
		dns, cns, ratios = append(dns, d), append(cns, c), append(ratios, c/d)
		i += slice
	}
	b.ReportMetric(median(dns), "declarative-ns/decision")
	b.ReportMetric(median(cns), "cel-ns/decision")
	b.ReportMetric(median(ratios), "cel/declarative")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
