package counterstore

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

// The manager's CounterStore metrics, served with controller-runtime's on
// the manager's metrics endpoint. Only the leading manager reconciles, so
// only it exports them; a store's series go away with the store.
// storeLabel names the CounterStore in every series.
const storeLabel = "store"

var (
	storeReady = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "floodgate_counterstore_ready",
		Help: "1 when the CounterStore is Ready (every slot served by a reachable master), 0 when it is not.",
	}, []string{storeLabel})
	storeDegraded = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "floodgate_counterstore_degraded",
		Help: "1 when a Ready CounterStore runs with less redundancy than its spec asks for, else 0.",
	}, []string{storeLabel})
	storeSlots = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "floodgate_counterstore_slots_covered",
		Help: "Hash slots (of 16384) served by a reachable master of the CounterStore.",
	}, []string{storeLabel})
	storeNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "floodgate_counterstore_nodes",
		Help: "Redis nodes of the CounterStore by role: primary, replica, failed.",
	}, []string{storeLabel, "role"})
)

func init() {
	metrics.Registry.MustRegister(Collectors()...)
}

// Collectors are the CounterStore metrics the manager exports, registered
// on controller-runtime's metrics registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{storeReady, storeDegraded, storeSlots, storeNodes}
}

// recordStatus exports a store's status as metrics.
func recordStatus(name string, st *v1alpha1.CounterStoreStatus, ready, degraded bool) {
	storeReady.WithLabelValues(name).Set(boolGauge(ready))
	storeDegraded.WithLabelValues(name).Set(boolGauge(degraded))
	storeSlots.WithLabelValues(name).Set(float64(st.SlotsCovered))
	storeNodes.WithLabelValues(name, "primary").Set(float64(st.Nodes.Primaries))
	storeNodes.WithLabelValues(name, "replica").Set(float64(st.Nodes.Replicas))
	storeNodes.WithLabelValues(name, "failed").Set(float64(st.Nodes.Failed))
}

// forgetStore removes a deleted store's series.
func forgetStore(name string) {
	storeReady.DeleteLabelValues(name)
	storeDegraded.DeleteLabelValues(name)
	storeSlots.DeleteLabelValues(name)
	storeNodes.DeletePartialMatch(prometheus.Labels{storeLabel: name})
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
