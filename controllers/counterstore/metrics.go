package counterstore

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

// storeLabel names the CounterStore in every series.
const storeLabel = "store"

// Metrics are the manager's CounterStore metrics. The manager registers
// them on controller-runtime's metrics registry, so they are served with
// its own on the manager's metrics endpoint. Only the leading manager
// reconciles, so only it exports them; a store's series go away with the
// store. Their methods are safe for concurrent use.
type Metrics struct {
	ready, degraded, slots, nodes *prometheus.GaugeVec
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ready: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "floodgate_counterstore_ready",
			Help: "1 when the CounterStore is Ready (every slot served by a reachable master), 0 when it is not.",
		}, []string{storeLabel}),
		degraded: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "floodgate_counterstore_degraded",
			Help: "1 when a Ready CounterStore runs with less redundancy than its spec asks for, else 0.",
		}, []string{storeLabel}),
		slots: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "floodgate_counterstore_slots_covered",
			Help: "Hash slots (of 16384) served by a reachable master of the CounterStore.",
		}, []string{storeLabel}),
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "floodgate_counterstore_nodes",
			Help: "Redis nodes of the CounterStore by role: primary, replica, failed.",
		}, []string{storeLabel, "role"}),
	}
	reg.MustRegister(m.ready, m.degraded, m.slots, m.nodes)
	return m
}

// record exports a store's status.
func (m *Metrics) record(name string, st *v1alpha1.CounterStoreStatus) {
	m.ready.WithLabelValues(name).Set(boolGauge(meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionReady)))
	m.degraded.WithLabelValues(name).Set(boolGauge(meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionDegraded)))
	m.slots.WithLabelValues(name).Set(float64(st.SlotsCovered))
	m.nodes.WithLabelValues(name, "primary").Set(float64(st.Nodes.Primaries))
	m.nodes.WithLabelValues(name, "replica").Set(float64(st.Nodes.Replicas))
	m.nodes.WithLabelValues(name, "failed").Set(float64(st.Nodes.Failed))
}

// forget removes a deleted store's series.
func (m *Metrics) forget(name string) {
	m.ready.DeleteLabelValues(name)
	m.degraded.DeleteLabelValues(name)
	m.slots.DeleteLabelValues(name)
	m.nodes.DeletePartialMatch(prometheus.Labels{storeLabel: name})
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
