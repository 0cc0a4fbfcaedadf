package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
)

// Defaults for Options.
const (
	// DefaultTimeout is the per-call deadline: the most a decision waits for
	// Redis, batching window included.
	DefaultTimeout = 50 * time.Millisecond
	// DefaultBatchWindow is the batch window to use unless there is a
	// reason not to: how long a decision may wait for others bound to the
	// same shard while the shard's pipelines are out. Options does not
	// apply it by itself (0 means no window); whoever builds Options, such
	// as the sidecar's flags, passes it.
	DefaultBatchWindow = 100 * time.Microsecond
	// MaxBatchWindow bounds BatchWindow: batching trades a little latency
	// for throughput, never a lot.
	MaxBatchWindow = 10 * time.Millisecond
	// DefaultMaxBatch is the most decisions one pipeline carries.
	DefaultMaxBatch = 128
	// DefaultBreakerFailures is how many consecutive failed calls open a
	// shard's circuit breaker.
	DefaultBreakerFailures = 5
	// DefaultBreakerCooldown is how long an open breaker fails fast before
	// it lets one probe through.
	DefaultBreakerCooldown = 500 * time.Millisecond
	// DefaultDialTimeout bounds connecting to a node outside any call (a
	// call's own deadline bounds the dials it waits for).
	DefaultDialTimeout = time.Second
)

// Options configure a Store. The zero value of every field but Addrs and
// BatchWindow picks the default; a zero BatchWindow means no window.
type Options struct {
	// Addrs are the seed addresses, host:port. In cluster mode (the
	// default) any reachable node will do; the store learns the rest. In
	// single mode there must be exactly one.
	Addrs []string
	// Single talks to one standalone redis-server instead of a Redis
	// Cluster.
	Single bool
	// Username and Password authenticate to every node (AUTH). Username is
	// for ACL users; empty means the default user.
	Username string
	Password string
	// Credentials, when set, replaces Username and Password: it is called
	// for every new connection, so a password changed where it comes from
	// (a file that a Kubernetes Secret volume updates, say) is used from
	// the next connection on, without a restart. It must be safe for
	// concurrent use and should not block.
	Credentials func() (username, password string)
	// TLS, when set, is used for every connection. Each node connection
	// gets a clone.
	TLS *tls.Config
	// TLSRoots, when set with TLS, is called for every new connection,
	// and the pool it returns verifies that connection's server instead of
	// TLS.RootCAs: a CA bundle read from a file that a Kubernetes Secret
	// volume fills in late, or updates, is used from the next connection
	// on, without a restart. An error fails the dial. It must be safe for
	// concurrent use.
	TLSRoots func() (*x509.CertPool, error)
	// Timeout is the per-call deadline: a decision returns within it
	// whatever Redis does (plus at most one batch window when it leads a
	// batch). 0 means DefaultTimeout.
	Timeout time.Duration
	// BatchWindow is the most a decision waits for others bound to the
	// same shard, and only while the shard already has a pipelined write
	// out (see the package documentation). 0 means no window: a decision
	// is written as soon as the shard's writer gets to it, without
	// waiting for earlier writes to be answered (decisions that queued
	// while it was writing still leave together). DefaultBatchWindow is
	// the usual value. At most MaxBatchWindow.
	BatchWindow time.Duration
	// MaxBatch is the most decisions per pipelined write; a batch that
	// fills up goes out before its window ends. 0 means DefaultMaxBatch.
	MaxBatch int
	// BreakerFailures is how many consecutive failed calls to a shard open
	// its circuit breaker. 0 means DefaultBreakerFailures.
	BreakerFailures int
	// BreakerCooldown is how long an open breaker fails fast before one
	// probe may test the shard again. 0 means DefaultBreakerCooldown.
	BreakerCooldown time.Duration
	// DialTimeout bounds background connection attempts. 0 means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// Now, when set, is the scripts' clock in place of Redis TIME: each
	// decision passes its reading as ARGV. It is for tests, which need
	// fixed instants; in production leave it nil, so that every sidecar
	// decides on the one clock of the shard that holds the key.
	Now func() time.Time
	// ClientName names every connection of the store (CLIENT SETNAME), so
	// that CLIENT LIST on a node tells whose connections they are. Empty
	// means DefaultClientName(). Redis takes printable ASCII without
	// spaces. A node that refuses to set the name (an ACL user without
	// CLIENT SETNAME) is used all the same.
	ClientName string
	// KeySpace names the tenant whose counters the store holds (Keys): a
	// Kubernetes namespace, so that a store user whose ACL key pattern is
	// Keys{Space: ns}.Pattern() reaches its own counters and no other
	// namespace's. Empty means the unnamed space, fg:{<tag>}:<part>.
	KeySpace string
}

// DefaultClientName returns "floodgate-sidecar:" and the host name, which
// in Kubernetes is the pod's name, with any byte Redis does not take in a
// name replaced by '-'.
func DefaultClientName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "floodgate-sidecar"
	}
	b := []byte("floodgate-sidecar:" + host)
	for i, c := range b {
		if !nameByte(c) {
			b[i] = '-'
		}
	}
	return string(b[:min(len(b), maxClientName)])
}

// maxClientName bounds Options.ClientName.
const maxClientName = 256

// nameByte reports whether Redis takes c in a client name.
func nameByte(c byte) bool { return c > ' ' && c <= '~' }

// withDefaults returns o with defaults filled in, or every problem with it.
func (o Options) withDefaults() (Options, error) {
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.BreakerFailures == 0 {
		o.BreakerFailures = DefaultBreakerFailures
	}
	if o.BreakerCooldown == 0 {
		o.BreakerCooldown = DefaultBreakerCooldown
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.ClientName == "" {
		o.ClientName = DefaultClientName()
	}
	if o.Credentials == nil {
		user, pw := o.Username, o.Password
		o.Credentials = func() (string, string) { return user, pw }
	}
	return o, o.Validate()
}

// Validate reports every problem with o at once. Zero fields are valid:
// they mean the defaults.
func (o Options) Validate() error {
	var errs []error
	if len(o.Addrs) == 0 {
		errs = append(errs, errors.New("addrs: at least one address is required"))
	}
	if o.Single && len(o.Addrs) > 1 {
		errs = append(errs, fmt.Errorf("addrs: single mode takes exactly one address, got %d", len(o.Addrs)))
	}
	for i, a := range o.Addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			errs = append(errs, fmt.Errorf("addrs[%d]: %q is not host:port", i, a))
		}
	}
	if o.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout: must not be negative, got %v", o.Timeout))
	}
	if o.BatchWindow < 0 || o.BatchWindow > MaxBatchWindow {
		errs = append(errs, fmt.Errorf("batchWindow: must be between 0 (no window) and %v, got %v", MaxBatchWindow, o.BatchWindow))
	}
	if o.MaxBatch < 0 {
		errs = append(errs, fmt.Errorf("maxBatch: must not be negative, got %d", o.MaxBatch))
	}
	if o.BreakerFailures < 0 {
		errs = append(errs, fmt.Errorf("breakerFailures: must not be negative, got %d", o.BreakerFailures))
	}
	if o.BreakerCooldown < 0 {
		errs = append(errs, fmt.Errorf("breakerCooldown: must not be negative, got %v", o.BreakerCooldown))
	}
	if o.DialTimeout < 0 {
		errs = append(errs, fmt.Errorf("dialTimeout: must not be negative, got %v", o.DialTimeout))
	}
	if len(o.ClientName) > maxClientName || strings.IndexFunc(o.ClientName, func(r rune) bool { return r > 0x7f || !nameByte(byte(r)) }) >= 0 {
		errs = append(errs, fmt.Errorf("clientName: must be at most %d bytes of printable ASCII without spaces, got %q", maxClientName, o.ClientName))
	}
	if err := redislayout.ValidKeySpace(o.KeySpace); err != nil {
		errs = append(errs, fmt.Errorf("keySpace: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redisstore: invalid options: %w", err)
	}
	return nil
}

// dialTLS returns the TLS configuration of one new connection: nil
// without TLS, else a clone of TLS with TLSRoots' pool when it is set.
func (o *Options) dialTLS() (*tls.Config, error) {
	if o.TLS == nil {
		return nil, nil
	}
	c := o.TLS.Clone()
	if o.TLSRoots != nil {
		pool, err := o.TLSRoots()
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	return c, nil
}
