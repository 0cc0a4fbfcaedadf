package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Priorities, the values of the "priority" label of the shedder's metrics.
const (
	PriorityCritical  = "Critical"
	PriorityDefault   = "Default"
	PrioritySheddable = "Sheddable"
)

// Admission are the metrics of concurrency rules and of the load shedder.
type Admission struct {
	// ConcurrencyInFlight is the number of this sidecar's requests that
	// hold a slot of a concurrency rule, by policy and rule. The sum over
	// the replicas is the rule's count in flight, per key summed.
	ConcurrencyInFlight *GaugeVec
	// LeaseRenewalsTotal counts the renewals of the leases of long
	// requests by policy, rule and result: renewed, lost (the lease had
	// expired and its slot was taken meanwhile) or error (the store did
	// not answer; the lease expires unless a later renewal succeeds).
	LeaseRenewalsTotal *CounterVec
	// SheddingLimit is the load shedder's adaptive limit on the requests
	// in flight to the application.
	SheddingLimit prometheus.Gauge
	// SheddingCriticalReserve is the part of the limit that only Critical
	// requests may use: reserved.critical percent of it, or the Critical
	// requests' measured concurrency with room for their bursts, whichever
	// is larger.
	SheddingCriticalReserve prometheus.Gauge
	// SheddingInFlight is the number of requests the shedder has admitted
	// to the application and that have not been answered yet.
	SheddingInFlight prometheus.Gauge
	// SheddingBaseline is the latency the shedder takes for the
	// application's when nothing queues, in seconds.
	SheddingBaseline prometheus.Gauge
	// SheddingLatency is the application's mean latency over the
	// shedder's last sampling window, in seconds.
	SheddingLatency prometheus.Gauge
	// ShedTotal counts the requests shed (answered 503 without reaching
	// the application), by priority; in Shadow mode, those that would
	// have been.
	ShedTotal *prometheus.CounterVec
	// ShedderAdmittedTotal counts the requests the shedder admitted, by
	// priority.
	ShedderAdmittedTotal *prometheus.CounterVec
}

// newAdmission creates the admission metrics and registers them on reg.
func newAdmission(reg prometheus.Registerer) Admission {
	a := Admission{
		ConcurrencyInFlight: NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "concurrency_in_flight",
			Help: "Requests of this sidecar that hold a slot of a concurrency rule, by policy and rule.",
		}, []string{policyLabel, ruleLabel}),
		LeaseRenewalsTotal: NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "concurrency_lease_renewals_total",
			Help: "Renewals of the slot leases of long requests, by policy, rule and result (renewed, lost, error).",
		}, []string{policyLabel, ruleLabel, resultLabel}),
		SheddingLimit: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "shedding_limit",
			Help: "The load shedder's adaptive limit on requests in flight to the application.",
		}),
		SheddingCriticalReserve: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "shedding_critical_reserve",
			Help: "The part of the load shedder's limit only Critical requests may use: the reserved percentage, or the Critical requests' measured concurrency with room for bursts, whichever is larger.",
		}),
		SheddingInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "shedding_in_flight",
			Help: "Requests the load shedder admitted to the application and that are not answered yet.",
		}),
		SheddingBaseline: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "shedding_baseline_latency_seconds",
			Help: "The application latency the load shedder learned for when nothing queues.",
		}),
		SheddingLatency: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "shedding_latency_seconds",
			Help: "The application's mean latency over the load shedder's last sampling window.",
		}),
		ShedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "shed_requests_total",
			Help: "Requests shed by the load shedder (503, never sent to the application), by priority and mode (enforce, or shadow for those only counted).",
		}, []string{"priority", "mode"}),
		ShedderAdmittedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "shedder_admitted_requests_total",
			Help: "Requests the load shedder admitted to the application, by priority.",
		}, []string{"priority"}),
	}
	reg.MustRegister(a.ConcurrencyInFlight, a.LeaseRenewalsTotal, a.SheddingLimit, a.SheddingCriticalReserve, a.SheddingInFlight,
		a.SheddingBaseline, a.SheddingLatency, a.ShedTotal, a.ShedderAdmittedTotal)
	return a
}

// Results of a lease renewal, the values of the "result" label of
// LeaseRenewalsTotal.
const (
	RenewalRenewed = "renewed"
	RenewalLost    = "lost"
	RenewalError   = "error"
)

// forgetAdmission deletes the concurrency series of a rule by their exact
// labels, as ForgetRule does the others.
func (m *Metrics) forgetAdmission(policy, rule string) {
	m.ConcurrencyInFlight.DeleteLabelValues(policy, rule)
	for _, result := range []string{RenewalRenewed, RenewalLost, RenewalError} {
		m.LeaseRenewalsTotal.DeleteLabelValues(policy, rule, result)
	}
}
