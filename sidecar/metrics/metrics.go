// Package metrics holds floodgate-sidecar's Prometheus metrics. They are
// registered on the registry the caller passes to NewMetrics, never on the
// global one, so tests and several sidecars in one process do not collide.
//
// Label values are policy and rule names, results, store names and shard
// addresses: all bounded by configuration. Client keys, addresses and
// descriptor values never appear as label values.
package metrics

import (
	"cmp"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

const namespace = "floodgate_sidecar"

// Decision results, the values of the "result" label of DecisionsTotal.
const (
	ResultAllowed      = "allowed"
	ResultDenied       = "denied"
	ResultShadowDenied = "shadow_denied"
	ResultUnavailable  = "unavailable"
)

// Metrics are the sidecar's collectors. All methods of the collectors are
// safe for concurrent use.
type Metrics struct {
	// DecisionsTotal counts rule decisions by policy, rule and result.
	DecisionsTotal *CounterVec
	// DecisionDuration observes the time to decide one request, over all
	// its rules, including store calls.
	DecisionDuration prometheus.Histogram
	// StoreOpsTotal counts store calls by store, shard and result (ok,
	// unavailable, error).
	StoreOpsTotal *prometheus.CounterVec
	// StoreOpDuration observes store call latency by store and shard.
	StoreOpDuration *prometheus.HistogramVec
	// LocalDenialsTotal counts decisions answered from the local deny cache
	// without a store call, by policy and rule.
	LocalDenialsTotal *CounterVec
	// FallbackDecisionsTotal counts decisions taken on a local fallback
	// bucket because the store was unavailable, by policy, rule and result.
	FallbackDecisionsTotal *CounterVec
	// DelayedTotal counts the requests a delaying rule (onExceed: Delay)
	// held for their slot, by policy, rule and how the wait ended:
	// released (the request went on), abandoned (its client went away and
	// the slot was given back) or overflow (the rule's waiting bound was
	// reached: answered 429, the slot given back).
	DelayedTotal *CounterVec
	// DelayedWaiting is the number of requests waiting for a delayed slot,
	// by policy and rule.
	DelayedWaiting *GaugeVec
	// DelaySeconds observes the waits of the released requests.
	DelaySeconds prometheus.Histogram
	// FallbackActive is 1 while the last call to some shard of the store
	// failed (decisions on its keys follow their rule's failure mode), 0
	// once every shard's last call succeeded.
	FallbackActive prometheus.Gauge
	// DenyCacheKeys is the number of keys in the local deny cache.
	DenyCacheKeys prometheus.GaugeFunc
	// ConfigInfo is 1 for the revision of the config in force.
	ConfigInfo *prometheus.GaugeVec
	// ConfigLoadsTotal counts config loads by result (ok, error).
	ConfigLoadsTotal *prometheus.CounterVec
	// ConfigErrorsTotal counts configs that were rejected.
	ConfigErrorsTotal prometheus.Counter
	// ConfigValid is 1 when the last config seen was applied, 0 when it was
	// rejected and the last good one is still in force.
	ConfigValid prometheus.Gauge
	// ConfigLastSuccess is the Unix time of the last applied config.
	ConfigLastSuccess prometheus.Gauge
	// DenyEventsTotal counts deny events by outcome: logged (written alone
	// or summed into a summary line), dropped (queue full) or unlogged
	// (the log level is above info).
	DenyEventsTotal *prometheus.CounterVec
	// ExemptTotal counts requests that a rule matched but its exempt
	// section (or its policy's) left alone, by policy and rule.
	ExemptTotal *CounterVec
	// RequestsTotal counts requests by outcome: proxied (sent upstream),
	// denied (429), unavailable (503: fail-closed or no config), rejected
	// (400: bad cost or missing key part; 401: invalid token; 431: header
	// block too large), upstream_error (502), and for concurrency rules
	// and the load shedder concurrency_denied (429) and shed (503).
	RequestsTotal *prometheus.CounterVec
	// PolicyFailed is 1 for each policy of the config in force that this
	// sidecar could not compile and does not enforce, by policy
	// (namespace/name); the other policies are in force.
	PolicyFailed *prometheus.GaugeVec
	// ConfigFromState is 1 while the config in force is the last good one
	// that the sidecar saved in its state directory and read back at
	// start, because its source (the API server) has not delivered one
	// yet.
	ConfigFromState prometheus.Gauge
	// Lease holds the metrics of leases and split counters.
	Lease *Leases
	// Admission are the metrics of concurrency rules and of the load
	// shedder (admission.go).
	Admission

	denyCacheSize func() float64
}

// The labels that name a rule, and the one of a decision's or call's result.
const (
	policyLabel = "policy"
	ruleLabel   = "rule"
	resultLabel = "result"
)

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		DecisionsTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "decisions_total",
			Help: "Rate-limit decisions by policy, rule and result (allowed, denied, shadow_denied, unavailable).",
		}, []string{policyLabel, ruleLabel, resultLabel}),
		DecisionDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "decision_duration_seconds",
			Help:    "Time to decide one request over all its matching rules, store calls included.",
			Buckets: []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1},
		}),
		StoreOpsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "store_operations_total",
			Help: "Counter store calls by store, shard and result (ok, unavailable, error).",
		}, []string{"store", "shard", resultLabel}),
		StoreOpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "store_operation_duration_seconds",
			Help:    "Counter store call latency by store and shard.",
			Buckets: []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1},
		}, []string{"store", "shard"}),
		LocalDenialsTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "local_denials_total",
			Help: "Requests denied from the local deny cache without a store call, by policy and rule.",
		}, []string{policyLabel, ruleLabel}),
		FallbackDecisionsTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "fallback_decisions_total",
			Help: "Decisions taken on a local fallback bucket while the store was unavailable, by policy, rule and result.",
		}, []string{policyLabel, ruleLabel, resultLabel}),
		DelayedTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "delayed_total",
			Help: "Requests a delaying rule held for their slot, by policy, rule and result (released, abandoned, overflow).",
		}, []string{policyLabel, ruleLabel, resultLabel}),
		DelayedWaiting: NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "delayed_waiting",
			Help: "Requests waiting for a delayed slot, by policy and rule.",
		}, []string{policyLabel, ruleLabel}),
		DelaySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "delay_seconds",
			Help:    "How long the released delayed requests waited for their slot.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}),
		FallbackActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "fallback_active",
			Help: "1 while the last call to some shard of the counter store failed, so rules on its keys follow their failure mode.",
		}),
		ConfigInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "config_info",
			Help: "1 for the revision of the sidecar config in force.",
		}, []string{"revision"}),
		ConfigLoadsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "config_loads_total",
			Help: "Sidecar config loads by result (ok, error).",
		}, []string{resultLabel}),
		ConfigErrorsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "config_errors_total",
			Help: "Sidecar configs rejected as invalid; the last good config stays in force.",
		}),
		ConfigValid: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "config_valid",
			Help: "1 when the last config seen was applied, 0 when it was rejected.",
		}),
		ConfigLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "config_last_success_timestamp_seconds",
			Help: "Unix time of the last applied sidecar config.",
		}),
		DenyEventsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "deny_events_total",
			Help: "Deny events by outcome: logged (alone or summed into a summary line), dropped because the queue was full, or unlogged because the log level is above info.",
		}, []string{"outcome"}),
		ExemptTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "exempt_total",
			Help: "Requests a rule matched but did not limit because they are exempt (its exempt section or its policy's), by policy and rule.",
		}, []string{policyLabel, ruleLabel}),
		RequestsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "requests_total",
			Help: "Requests handled by the sidecar, by outcome (proxied, denied, concurrency_denied, shed, unavailable, rejected, upstream_error).",
		}, []string{"outcome"}),
	}
	m.DenyCacheKeys = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "deny_cache_keys",
		Help: "Keys held in the local deny cache.",
	}, func() float64 {
		if m.denyCacheSize == nil {
			return 0
		}
		return m.denyCacheSize()
	})
	m.PolicyFailed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "floodgate_sidecar_policy_failed",
		Help: "1 for each policy of the config in force that this sidecar could not compile and does not enforce; the other policies are in force.",
	}, []string{"policy"})
	m.ConfigFromState = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "floodgate_sidecar_config_from_state",
		Help: "1 while the config in force is the last good one read back from --state-dir at start, because its source has not delivered one yet.",
	})
	reg.MustRegister(m.DecisionsTotal, m.DecisionDuration, m.StoreOpsTotal, m.StoreOpDuration,
		m.LocalDenialsTotal, m.FallbackDecisionsTotal, m.DelayedTotal, m.DelayedWaiting, m.DelaySeconds, m.FallbackActive, m.DenyCacheKeys,
		m.ConfigInfo, m.ConfigLoadsTotal, m.ConfigErrorsTotal, m.ConfigValid, m.ConfigLastSuccess,
		m.DenyEventsTotal, m.ExemptTotal, m.RequestsTotal, m.PolicyFailed, m.ConfigFromState)
	m.Lease = newLeases()
	reg.MustRegister(m.Lease.collectors()...)
	m.Admission = newAdmission(reg)
	return m
}

// SetDenyCacheSize installs the function DenyCacheKeys reads. It must be
// called before the metrics are scraped concurrently.
func (m *Metrics) SetDenyCacheSize(f func() float64) { m.denyCacheSize = f }

// Rule holds the pre-resolved counters of one rule, so that the hot path
// never looks labels up.
type Rule struct {
	Allowed, Denied, ShadowDenied, Unavailable prometheus.Counter
	LocalDenials                               prometheus.Counter
	FallbackAllowed, FallbackDenied            prometheus.Counter
}

// DelayRule is a delaying rule's series: DelayedTotal's released,
// abandoned and overflow, and DelayedWaiting's.
type DelayRule struct {
	Released, Abandoned, Overflow prometheus.Counter
	Waiting                       prometheus.Gauge
	Seconds                       prometheus.Observer
}

// ForDelayRule resolves a delaying rule's series; a rule that does not
// delay has none.
func (m *Metrics) ForDelayRule(policy, rule string) *DelayRule {
	return &DelayRule{
		Released:  m.DelayedTotal.WithLabelValues(policy, rule, DelayReleased),
		Abandoned: m.DelayedTotal.WithLabelValues(policy, rule, DelayAbandoned),
		Overflow:  m.DelayedTotal.WithLabelValues(policy, rule, DelayOverflow),
		Waiting:   m.DelayedWaiting.WithLabelValues(policy, rule),
		Seconds:   m.DelaySeconds,
	}
}

// ForRule resolves a rule's counters.
func (m *Metrics) ForRule(policy, rule string) *Rule {
	return &Rule{
		Allowed:         m.DecisionsTotal.WithLabelValues(policy, rule, ResultAllowed),
		Denied:          m.DecisionsTotal.WithLabelValues(policy, rule, ResultDenied),
		ShadowDenied:    m.DecisionsTotal.WithLabelValues(policy, rule, ResultShadowDenied),
		Unavailable:     m.DecisionsTotal.WithLabelValues(policy, rule, ResultUnavailable),
		LocalDenials:    m.LocalDenialsTotal.WithLabelValues(policy, rule),
		FallbackAllowed: m.FallbackDecisionsTotal.WithLabelValues(policy, rule, ResultAllowed),
		FallbackDenied:  m.FallbackDecisionsTotal.WithLabelValues(policy, rule, ResultDenied),
	}
}

// The results of DelayedTotal.
const (
	DelayReleased  = "released"
	DelayAbandoned = "abandoned"
	DelayOverflow  = "overflow"
)

// ForgetRule deletes the series of a rule that is no longer configured.
// It deletes each series by its exact labels, the ones ForRule made, so its
// cost does not grow with the number of series: forgetting n rules is
// O(n).
func (m *Metrics) ForgetRule(policy, rule string) {
	for _, result := range []string{ResultAllowed, ResultDenied, ResultShadowDenied, ResultUnavailable} {
		m.DecisionsTotal.DeleteLabelValues(policy, rule, result)
	}
	m.LocalDenialsTotal.DeleteLabelValues(policy, rule)
	m.FallbackDecisionsTotal.DeleteLabelValues(policy, rule, ResultAllowed)
	m.FallbackDecisionsTotal.DeleteLabelValues(policy, rule, ResultDenied)
	for _, result := range []string{DelayReleased, DelayAbandoned, DelayOverflow} {
		m.DelayedTotal.DeleteLabelValues(policy, rule, result)
	}
	m.DelayedWaiting.DeleteLabelValues(policy, rule)
	m.ExemptTotal.DeleteLabelValues(policy, rule)
	m.Lease.forget(policy, rule)
	m.forgetAdmission(policy, rule)
}

// RuleTotals are one rule's counters, by result, and its exempt count.
type RuleTotals struct {
	Policy, Rule                               string
	Allowed, Denied, ShadowDenied, Unavailable uint64
	Exempt                                     uint64
}

// Totals reads the decision and exempt counters of every rule, ordered by
// policy and rule. It reads the collectors as a scrape does, so it never
// touches the decision path; it is safe for concurrent use.
func (m *Metrics) Totals() []RuleTotals {
	byRule := map[[2]string]*RuleTotals{}
	get := func(labels []*dto.LabelPair) (*RuleTotals, string) {
		var policy, rule, result string
		for _, l := range labels {
			switch l.GetName() {
			case policyLabel:
				policy = l.GetValue()
			case "rule":
				rule = l.GetValue()
			case resultLabel:
				result = l.GetValue()
			}
		}
		k := [2]string{policy, rule}
		t := byRule[k]
		if t == nil {
			t = &RuleTotals{Policy: policy, Rule: rule}
			byRule[k] = t
		}
		return t, result
	}
	read := func(c prometheus.Collector, f func(t *RuleTotals, result string, v uint64)) {
		ch := make(chan prometheus.Metric, 64)
		go func() { c.Collect(ch); close(ch) }()
		for pm := range ch {
			var out dto.Metric
			if err := pm.Write(&out); err != nil {
				continue
			}
			t, result := get(out.GetLabel())
			f(t, result, uint64(out.GetCounter().GetValue()))
		}
	}
	read(m.DecisionsTotal, func(t *RuleTotals, result string, v uint64) {
		switch result {
		case ResultAllowed:
			t.Allowed = v
		case ResultDenied:
			t.Denied = v
		case ResultShadowDenied:
			t.ShadowDenied = v
		case ResultUnavailable:
			t.Unavailable = v
		}
	})
	read(m.ExemptTotal, func(t *RuleTotals, _ string, v uint64) { t.Exempt = v })
	out := make([]RuleTotals, 0, len(byRule))
	for _, t := range byRule {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b RuleTotals) int { return cmp.Or(cmp.Compare(a.Policy, b.Policy), cmp.Compare(a.Rule, b.Rule)) })
	return out
}
