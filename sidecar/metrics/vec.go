package metrics

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The families labelled by rule are vecs of this file rather than
// prometheus.CounterVec and GaugeVec. Those index their series in a Go map,
// and a Go map never gives back its buckets: after a config of 10,000
// rules is replaced by one of a single rule, the rules' series are deleted
// but their index stays at its peak size (about 90 bytes for each series
// it held at its peak). A vec here rebuilds its index when deletions have left it
// a quarter full, so its memory follows the series it holds.
//
// A series is the same object for as long as it exists: a rule that
// survives a reload resolves the counters it had, and keeps counting on
// them.

// vec is the index of a family's series, keyed by their label values.
// All its methods are safe for concurrent use.
type vec[M prometheus.Metric] struct {
	desc      *prometheus.Desc
	labels    int
	newSeries func(desc *prometheus.Desc, values []string) M

	mu     sync.RWMutex
	series map[string]M
	// peak is the most series the map has held since it was made.
	peak int
}

// minRebuild is the peak below which a vec keeps its map: a map of so
// few series costs little whatever it held.
const minRebuild = 64

func (v *vec[M]) init(desc *prometheus.Desc, labels int, newSeries func(*prometheus.Desc, []string) M) {
	v.desc, v.labels, v.newSeries = desc, labels, newSeries
	v.series = map[string]M{}
}

// seriesKey joins label values with a byte that valid UTF-8, and so a
// label value, never contains.
func seriesKey(values []string) string { return strings.Join(values, "\xff") }

// with returns the series with the label values, made if it does not exist.
// Like prometheus.CounterVec's WithLabelValues, it panics when the number
// of values is not the number of labels: a programming error.
func (v *vec[M]) with(values []string) M {
	if len(values) != v.labels {
		panic(fmt.Sprintf("metrics: %s: %d label values for %d labels", v.desc, len(values), v.labels))
	}
	k := seriesKey(values)
	v.mu.RLock()
	m, ok := v.series[k]
	v.mu.RUnlock()
	if ok {
		return m
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if m, ok := v.series[k]; ok {
		return m
	}
	m = v.newSeries(v.desc, append([]string(nil), values...))
	v.series[k] = m
	v.peak = max(v.peak, len(v.series))
	return m
}

// remove deletes the series with the label values and reports whether it
// existed.
func (v *vec[M]) remove(values []string) bool {
	k := seriesKey(values)
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.series[k]; !ok {
		return false
	}
	delete(v.series, k)
	if v.peak >= minRebuild && len(v.series) < v.peak/4 {
		// Copying the quarter that is left costs no more than the
		// deletions that emptied the rest.
		m := make(map[string]M, len(v.series))
		for k, s := range v.series {
			m[k] = s
		}
		v.series, v.peak = m, len(m)
	}
	return true
}

// Describe implements prometheus.Collector.
func (v *vec[M]) Describe(ch chan<- *prometheus.Desc) { ch <- v.desc }

// Collect implements prometheus.Collector.
func (v *vec[M]) Collect(ch chan<- prometheus.Metric) {
	v.mu.RLock()
	all := make([]prometheus.Metric, 0, len(v.series))
	for _, m := range v.series {
		all = append(all, m)
	}
	v.mu.RUnlock()
	// Sent outside the lock: the channel's reader may be slow.
	for _, m := range all {
		ch <- m
	}
}

// CounterVec is a family of counters by label values, with
// prometheus.CounterVec's WithLabelValues and DeleteLabelValues. See the
// comment at the top of this file for why it exists.
type CounterVec struct{ vec[*counter] }

var _ prometheus.Collector = (*CounterVec)(nil)

// NewCounterVec returns an empty CounterVec; register it to expose it.
func NewCounterVec(opts prometheus.CounterOpts, labels []string) *CounterVec {
	v := &CounterVec{}
	desc := prometheus.NewDesc(prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name), opts.Help, labels, opts.ConstLabels)
	v.init(desc, len(labels), func(d *prometheus.Desc, values []string) *counter {
		return &counter{desc: d, values: values, created: time.Now()}
	})
	return v
}

// WithLabelValues returns the counter with the label values, made at 0 if
// it does not exist. It panics when the number of values is wrong.
func (v *CounterVec) WithLabelValues(values ...string) prometheus.Counter { return v.with(values) }

// DeleteLabelValues deletes the counter with the label values and reports
// whether it existed.
func (v *CounterVec) DeleteLabelValues(values ...string) bool { return v.remove(values) }

// GaugeVec is a family of gauges by label values, with
// prometheus.GaugeVec's WithLabelValues and DeleteLabelValues.
type GaugeVec struct{ vec[*gauge] }

var _ prometheus.Collector = (*GaugeVec)(nil)

// NewGaugeVec returns an empty GaugeVec; register it to expose it.
func NewGaugeVec(opts prometheus.GaugeOpts, labels []string) *GaugeVec {
	v := &GaugeVec{}
	desc := prometheus.NewDesc(prometheus.BuildFQName(opts.Namespace, opts.Subsystem, opts.Name), opts.Help, labels, opts.ConstLabels)
	v.init(desc, len(labels), func(d *prometheus.Desc, values []string) *gauge { return &gauge{desc: d, values: values} })
	return v
}

// WithLabelValues returns the gauge with the label values, made at 0 if it
// does not exist. It panics when the number of values is wrong.
func (v *GaugeVec) WithLabelValues(values ...string) prometheus.Gauge { return v.with(values) }

// DeleteLabelValues deletes the gauge with the label values and reports
// whether it existed.
func (v *GaugeVec) DeleteLabelValues(values ...string) bool { return v.remove(values) }

// counter is prometheus's counter without exemplars. Its label pairs are
// built when it is collected, not kept: a rule has a dozen series, most of
// them never scraped with a value other than 0.
type counter struct {
	// intVal holds the integer increments, floatVal's bits the others, as
	// prometheus's counter does: an integer Add is one atomic add.
	intVal   atomic.Uint64
	floatVal atomic.Uint64
	desc     *prometheus.Desc
	values   []string
	created  time.Time
}

var _ prometheus.Counter = (*counter)(nil)

func (c *counter) Desc() *prometheus.Desc { return c.desc }

func (c *counter) Inc() { c.intVal.Add(1) }

// Add adds v, which must not be negative: like prometheus's counters, it
// panics otherwise.
func (c *counter) Add(v float64) {
	if v < 0 {
		panic("metrics: counter cannot decrease in value")
	}
	if i := uint64(v); float64(i) == v {
		c.intVal.Add(i)
		return
	}
	for {
		old := c.floatVal.Load()
		if c.floatVal.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

func (c *counter) value() float64 {
	return math.Float64frombits(c.floatVal.Load()) + float64(c.intVal.Load())
}

func (c *counter) Write(out *dto.Metric) error {
	out.Label = prometheus.MakeLabelPairs(c.desc, c.values)
	out.Counter = &dto.Counter{Value: new(c.value()), CreatedTimestamp: timestamppb.New(c.created)}
	return nil
}

func (c *counter) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *counter) Collect(ch chan<- prometheus.Metric) { ch <- c }

// gauge is prometheus's gauge.
type gauge struct {
	bits   atomic.Uint64 // the float64 value
	desc   *prometheus.Desc
	values []string
}

var _ prometheus.Gauge = (*gauge)(nil)

func (g *gauge) Desc() *prometheus.Desc { return g.desc }

func (g *gauge) Set(v float64) { g.bits.Store(math.Float64bits(v)) }

func (g *gauge) Add(v float64) {
	for {
		old := g.bits.Load()
		if g.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

func (g *gauge) Inc()              { g.Add(1) }
func (g *gauge) Dec()              { g.Add(-1) }
func (g *gauge) Sub(v float64)     { g.Add(-v) }
func (g *gauge) SetToCurrentTime() { g.Set(float64(time.Now().UnixNano()) / 1e9) }

func (g *gauge) Write(out *dto.Metric) error {
	out.Label = prometheus.MakeLabelPairs(g.desc, g.values)
	out.Gauge = &dto.Gauge{Value: new(math.Float64frombits(g.bits.Load()))}
	return nil
}

func (g *gauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *gauge) Collect(ch chan<- prometheus.Metric) { ch <- g }

// size returns the number of series and the peak the index is sized for.
func (v *vec[M]) size() (n, peak int) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.series), v.peak
}
