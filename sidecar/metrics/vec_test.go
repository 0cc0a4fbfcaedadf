package metrics

import (
	"bytes"
	"runtime"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// text renders what reg exposes, as /metrics does.
func text(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// A CounterVec and a GaugeVec expose what prometheus's vecs expose after
// the same calls.
func TestVecsExposeAsPrometheusVecs(t *testing.T) {
	t.Parallel()
	labels := []string{"policy", "rule"}
	copts := prometheus.CounterOpts{Namespace: "ns", Name: "calls_total", Help: "Calls.", ConstLabels: prometheus.Labels{"zone": "a"}}
	gopts := prometheus.GaugeOpts{Namespace: "ns", Name: "in_flight", Help: "In flight."}
	ours, theirs := prometheus.NewRegistry(), prometheus.NewRegistry()
	oc, og := NewCounterVec(copts, labels), NewGaugeVec(gopts, labels)
	tc, tg := prometheus.NewCounterVec(copts, labels), prometheus.NewGaugeVec(gopts, labels)
	ours.MustRegister(oc, og)
	theirs.MustRegister(tc, tg)
	for _, lv := range [][]string{{"p", "a"}, {"p", "b"}, {"q", "a\"quoted\""}, {"p", "gone"}} {
		for _, c := range []prometheus.Counter{oc.WithLabelValues(lv...), tc.WithLabelValues(lv...)} {
			c.Inc()
			c.Add(2)
			c.Add(0.25)
		}
		for _, g := range []prometheus.Gauge{og.WithLabelValues(lv...), tg.WithLabelValues(lv...)} {
			g.Set(5)
			g.Inc()
			g.Sub(0.5)
			g.Dec()
		}
	}
	if !oc.DeleteLabelValues("p", "gone") || !tc.DeleteLabelValues("p", "gone") || !og.DeleteLabelValues("p", "gone") || !tg.DeleteLabelValues("p", "gone") {
		t.Fatal("DeleteLabelValues of an existing series = false")
	}
	if oc.DeleteLabelValues("p", "gone") || og.DeleteLabelValues("p", "never") {
		t.Error("DeleteLabelValues of a missing series = true")
	}
	if got, want := text(t, ours), text(t, theirs); got != want {
		t.Errorf("exposed:\n%s\nprometheus's vecs expose:\n%s", got, want)
	}
}

// Forgetting most rules leaves every family labelled by rule indexed in a
// map at least a quarter full, and a rule that stays keeps its counters,
// the same objects with their counts.
func TestForgetRuleShrinksTheIndex(t *testing.T) {
	t.Parallel()
	m := NewMetrics(prometheus.NewRegistry())
	resolve := func(rule string) *Rule {
		r := m.ForRule("pol", rule)
		m.Lease.ForLeaseRule("pol", rule).SplitCalls(2)
		m.ExemptTotal.WithLabelValues("pol", rule)
		m.ConcurrencyInFlight.WithLabelValues("pol", rule)
		m.LeaseRenewalsTotal.WithLabelValues("pol", rule, RenewalRenewed)
		return r
	}
	keep := resolve("keep")
	keep.Allowed.Inc()
	for i := range 1000 {
		resolve("r" + strconv.Itoa(i))
	}
	for i := range 1000 {
		m.ForgetRule("pol", "r"+strconv.Itoa(i))
	}
	for name, v := range map[string]interface{ size() (int, int) }{
		"decisions": m.DecisionsTotal, "local denials": m.LocalDenialsTotal, "fallback": m.FallbackDecisionsTotal,
		"exempt": m.ExemptTotal, "lease hits": m.Lease.HitsTotal, "lease calls": m.Lease.CallsTotal,
		"granted": m.Lease.GrantedTokensTotal, "returned": m.Lease.ReturnedTokensTotal, "lost": m.Lease.LostTokensTotal,
		"split calls": m.Lease.SplitCallsTotal, "borrows": m.Lease.SplitBorrowsTotal,
		"in flight": m.ConcurrencyInFlight, "renewals": m.LeaseRenewalsTotal,
	} {
		if n, peak := v.size(); n == 0 || peak >= minRebuild && 4*n < peak {
			t.Errorf("%s: %d series in an index sized for %d", name, n, peak)
		}
	}
	again := m.ForRule("pol", "keep")
	if again.Allowed != keep.Allowed {
		t.Error("the rule that stayed resolves another counter than the one it had")
	}
	if got := m.Totals(); len(got) != 1 || got[0].Rule != "keep" || got[0].Allowed != 1 {
		t.Errorf("Totals = %+v, want the rule that stayed, with its 1 allowed", got)
	}
}

// The series of a large config, once forgotten, give back their memory:
// the heap is back to its size before they were made. prometheus's vecs
// kept their index at its peak, about 90 bytes per series.
func TestForgottenRulesGiveBackTheirHeap(t *testing.T) {
	// Not parallel: it reads the heap.
	m := NewMetrics(prometheus.NewRegistry())
	resolve := func(rule string) {
		m.ForRule("pol", rule)
		m.Lease.ForLeaseRule("pol", rule)
		m.ExemptTotal.WithLabelValues("pol", rule)
	}
	resolve("keep")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 10000 {
		resolve("r" + strconv.Itoa(i))
	}
	for i := range 10000 {
		m.ForgetRule("pol", "r"+strconv.Itoa(i))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(m)
	// The indexes may keep room for a few dozen series each.
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 128<<10 {
		t.Errorf("after 10,000 rules came and went, the heap holds %d bytes more; want at most %d", grew, 128<<10)
	}
}
