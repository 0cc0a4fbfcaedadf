package runner

import (
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/limiter"
	"github.com/floodgate-dev/floodgate/sidecar/store/memstore"
)

// storeSelection is the store the flags and the first config resolve to.
type storeSelection struct {
	Type      string
	Addresses []string
	TLS       *config.TLS
	From      string // "flags", "policy-file" or "default"
}

// selectStore applies the precedence documented on Config.
func (r *Runner) selectStore(c *config.Config) storeSelection {
	cfg := r.cfg
	switch {
	case cfg.IsSet("store") && cfg.Store != "":
		sel := storeSelection{Type: cfg.Store, Addresses: cfg.redisAddrs(), From: "flags"}
		if cfg.Store == config.StoreRedis {
			sel.TLS = cfg.flagTLS()
		}
		return sel
	case c != nil && c.Store.Type != "":
		sel := storeSelection{Type: c.Store.Type, Addresses: c.Store.Addresses, TLS: c.Store.TLS, From: "policy-file"}
		if a := cfg.redisAddrs(); len(a) > 0 && sel.Type == config.StoreRedis {
			sel.Addresses = a
		}
		if t := cfg.flagTLS(); t != nil && sel.Type == config.StoreRedis {
			sel.TLS = t
		}
		return sel
	}
	return storeSelection{Type: config.StoreMemory, From: "default"}
}

// flagTLS returns the TLS settings of the --redis-tls flags, or nil.
func (c *Config) flagTLS() *config.TLS {
	if !c.RedisTLS && c.RedisTLSCAFile == "" && c.RedisTLSServer == "" && !c.RedisTLSSkipVer {
		return nil
	}
	return &config.TLS{CAFile: c.RedisTLSCAFile, ServerName: c.RedisTLSServer, InsecureSkipVerify: c.RedisTLSSkipVer}
}

// storeHandle is an open counter store.
type storeHandle struct {
	store   limiter.Store
	shardOf func(key string) string
	remote  bool
	close   func() error
}

// openStore is the one place a counter store is built.
func openStore(sel storeSelection, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*storeHandle, error) {
	switch sel.Type {
	case config.StoreRedis:
		return openRedis(sel, cfg, reg, log)
	default:
		s, err := memstore.New(memstore.WithMaxKeys(cfg.LocalMaxKeys))
		if err != nil {
			return nil, err
		}
		return &storeHandle{store: s}, nil
	}
}

// password reads the Redis password from the environment or the file.
func (c *Config) password() (string, error) {
	if c.RedisPassFile == "" {
		return c.RedisPassword, nil
	}
	b, err := readFile(c.RedisPassFile)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}
