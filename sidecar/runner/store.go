package runner

import (
	"errors"
	"io/fs"
	"log/slog"
	"strings"
	"sync"
	"time"

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

// selectStore applies the precedence documented on Config to the flags
// and the document doc.
func (c *Config) selectStore(doc *config.Config) storeSelection {
	switch {
	case c.IsSet("store") && c.Store != "":
		sel := storeSelection{Type: c.Store, Addresses: c.redisAddrs(), From: "flags"}
		if c.Store == config.StoreRedis {
			sel.TLS = c.flagTLS()
		}
		return sel
	case doc != nil && doc.Store.Type != "":
		sel := storeSelection{Type: doc.Store.Type, Addresses: doc.Store.Addresses, TLS: doc.Store.TLS, From: "policy-file"}
		if a := c.redisAddrs(); len(a) > 0 && sel.Type == config.StoreRedis {
			sel.Addresses = a
		}
		if t := c.flagTLS(); t != nil && sel.Type == config.StoreRedis {
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
	store  limiter.Store
	remote bool
	// budget is the store's per-call deadline, the engine's per-decision
	// Budget; 0 for a local store.
	budget time.Duration
	close  func() error
	// setAddrs, when set, moves the store to new seed addresses without
	// a restart (a Redis Cluster whose nodes were all replaced).
	setAddrs func([]string) error
}

// openStore is the one place a counter store is built. clock, when set,
// is the memory store's clock (a debugging build's manual clock).
func openStore(sel storeSelection, cfg Config, clock func() time.Time, reg prometheus.Registerer, log *slog.Logger) (*storeHandle, error) {
	switch sel.Type {
	case config.StoreRedis:
		return openRedis(sel, cfg, reg, log)
	default:
		s, err := memstore.New(memOptions(cfg, clock)...)
		if err != nil {
			return nil, err
		}
		return &storeHandle{store: s}, nil
	}
}

// memOptions are the options of an in-memory store: the key bound and,
// when set, the clock.
func memOptions(cfg Config, clock func() time.Time) []memstore.Option {
	opts := []memstore.Option{memstore.WithMaxKeys(cfg.LocalMaxKeys)}
	if clock != nil {
		opts = append(opts, memstore.WithClock(clock))
	}
	return opts
}

// credentials returns the Redis credentials source. With
// --redis-password-file the file is read again for every new connection, so
// a password rotated where it comes from (a Secret volume the kubelet
// updates) is used without a restart; a file that cannot be read keeps the
// last password read. In Kubernetes mode the file may not exist yet: the
// injected Secret volume is optional, and fills in once the manager has
// mirrored the store's password into the namespace. --redis-username-file
// is read with it: a missing file means the default user (a store without
// ACL users), one that cannot be read otherwise keeps the last user read.
func (c *Config) credentials(log *slog.Logger) (func() (string, string), error) {
	if c.RedisPassFile == "" {
		pw := c.RedisPassword
		return func() (string, string) { return "", pw }, nil
	}
	read := func(path string) (string, error) {
		b, err := readFile(path)
		if err != nil {
			return "", err
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	first, err := read(c.RedisPassFile)
	if err != nil && (!c.Kubernetes || !errors.Is(err, fs.ErrNotExist)) {
		return nil, err
	}
	var mu sync.Mutex
	last, lastUser, warned := first, "", ""
	warn := func(file string, err error) {
		// Once per distinct error: connections are dialled again and
		// again while a store is down.
		if err.Error() != warned {
			warned = err.Error()
			log.Warn("reading a Redis credentials file; keeping the last value read", "file", file, "err", err)
		}
	}
	return func() (string, string) {
		pw, err := read(c.RedisPassFile)
		var user string
		var userErr error
		if c.RedisUserFile != "" {
			user, userErr = read(c.RedisUserFile)
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			last, warned = pw, ""
		case !errors.Is(err, fs.ErrNotExist) || last != "":
			warn(c.RedisPassFile, err)
		}
		switch {
		case userErr == nil:
			lastUser = user
		case errors.Is(userErr, fs.ErrNotExist):
			lastUser = ""
		default:
			warn(c.RedisUserFile, userErr)
		}
		return lastUser, last
	}, nil
}
