package runner

import (
	"log/slog"

	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

// openRedis opens the Redis Cluster store. It does not connect: a cluster
// that is down at start only makes decisions fail over to each rule's
// failure mode until it answers.
func openRedis(sel storeSelection, cfg Config, log *slog.Logger) (*storeHandle, error) {
	pw, err := cfg.password()
	if err != nil {
		return nil, err
	}
	tc, err := tlsConfig(sel.TLS)
	if err != nil {
		return nil, err
	}
	s, err := redisstore.New(redisstore.Options{Addrs: sel.Addresses, Password: pw, TLS: tc, Timeout: cfg.RedisTimeout})
	if err != nil {
		return nil, err
	}
	log.Debug("redis store ready", "addrs", sel.Addresses, "tls", tc != nil)
	return &storeHandle{store: s, shardOf: s.ShardOf, remote: true, close: s.Close}, nil
}
