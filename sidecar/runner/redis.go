package runner

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

// openRedis opens the Redis Cluster store. It does not connect: a cluster
// that is down at start only makes decisions fail over to each rule's
// failure mode until it answers.
func openRedis(sel storeSelection, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*storeHandle, error) {
	creds, err := cfg.credentials(log)
	if err != nil {
		return nil, err
	}
	tc, roots := tlsConfig(sel.TLS)
	s, err := redisstore.New(redisstore.Options{
		Addrs: sel.Addresses, Credentials: creds, TLS: tc, TLSRoots: roots, Timeout: cfg.RedisTimeout,
		BatchWindow: cfg.RedisBatchWindow, MaxBatch: cfg.RedisMaxBatch,
		BreakerFailures: cfg.RedisBreakerFailures, BreakerCooldown: cfg.RedisBreakerCooldown,
		KeySpace: cfg.KeySpace(),
	})
	if err != nil {
		return nil, err
	}
	if err := reg.Register(breakerCollector{s}); err != nil {
		_ = s.Close()
		return nil, err
	}
	log.Debug("redis store ready", "addrs", sel.Addresses, "tls", tc != nil, "keySpace", cfg.KeySpace())
	return &storeHandle{store: s, remote: true, budget: s.Timeout(), close: s.Close, setAddrs: s.SetAddrs}, nil
}

var breakerDesc = prometheus.NewDesc("floodgate_sidecar_store_breaker_state",
	"Circuit breaker state per Redis shard: 0 closed, 1 open, 2 half-open.", []string{"shard"}, nil)

// breakerCollector reports the Redis store's breakers at scrape time.
type breakerCollector struct{ s *redisstore.Store }

// Describe implements prometheus.Collector.
func (breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- breakerDesc }

// Collect implements prometheus.Collector.
func (c breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, sh := range c.s.Shards() {
		ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, float64(sh.Breaker), sh.Addr)
	}
}
