package runner

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/proxy"
	"github.com/floodgate-dev/floodgate/sidecar/store/redislayout"
	"github.com/floodgate-dev/floodgate/sidecar/store/redisstore"
)

// EnvPrefix prefixes the environment variable of every flag: --redis-addrs
// is FLOODGATE_REDIS_ADDRS.
const EnvPrefix = "FLOODGATE_"

// EnvRedisPassword holds the Redis password. There is deliberately no flag
// for it, so that it never shows in a process listing; use it or
// --redis-password-file.
const EnvRedisPassword = "FLOODGATE_REDIS_PASSWORD"

// Config is everything floodgate-sidecar is started with: flags, each also
// settable by its environment variable. A flag given on the command line
// wins over its environment variable, which wins over the default.
//
// # Store precedence
//
// The counter store is chosen once, at start, in this order:
//  1. --store (or FLOODGATE_STORE), with --redis-addrs and the other
//     --redis-* settings;
//  2. otherwise the policy file's store section (type, addresses, tls);
//     --redis-addrs, when given, still replaces the file's addresses, and
//     the password always comes from FLOODGATE_REDIS_PASSWORD or
//     --redis-password-file;
//  3. otherwise the in-memory store.
//
// When the store comes from the policy file, the sidecar waits for the
// first valid file before it opens the store and starts serving. A later
// change to the file's store section is reported (log, /debug/config) and
// takes effect at the next restart; policies reload live.
type Config struct {
	Listen        string
	AdminListen   string
	Upstream      string
	UpstreamH2C   bool
	PolicyFile    string
	PollInterval  time.Duration
	PodLabels     string
	PodLabelsFile string
	Kubernetes    bool
	Namespace     string
	PodName       string
	Kubeconfig    string
	// ConfigMapName is the ConfigMap watched in Kubernetes mode:
	// config.ConfigMapName for a sidecar, config.RateLimitServiceConfigMapName
	// for the central rate-limit service.
	ConfigMapName string
	Store         string
	RedisAddrs    string
	RedisPassword string
	RedisPassFile string
	RedisUserFile string
	// RedisKeyNamespace is the key space of the counters (KeySpace).
	RedisKeyNamespace string
	RedisTLS          bool
	RedisTLSCAFile    string
	RedisTLSServer    string
	RedisTLSSkipVer   bool
	RedisTimeout      time.Duration
	// RedisBatchWindow is how long a Redis decision may wait to share a
	// pipelined write with others bound for the same shard; 0 sends each
	// decision on its own.
	RedisBatchWindow time.Duration
	// RedisMaxBatch bounds the decisions of one pipelined write.
	RedisMaxBatch int
	// RedisBreakerFailures and RedisBreakerCooldown tune the per-shard
	// circuit breaker.
	RedisBreakerFailures int
	RedisBreakerCooldown time.Duration
	MaxHeaderBytes       int
	// MaxDelayed bounds the requests that wait for a delayed slot, per
	// delaying rule (proxy.Options.MaxDelayed).
	MaxDelayed int64
	// LeanHTTP1 serves keep-alive HTTP/1.1 with the lean proxy core
	// (package proxy/lean); false sends every connection through
	// net/http.
	LeanHTTP1 bool
	// AllowUnderscoreHeaders forwards header fields whose names contain
	// an underscore; by default both fronts drop them.
	AllowUnderscoreHeaders bool
	// ReadHeaderTimeout bounds the time from a request head's first byte
	// to its last (slowloris).
	ReadHeaderTimeout time.Duration
	// BodyTimeout is how long each proxy.BodyWindow bytes of a request
	// body may take to arrive.
	BodyTimeout time.Duration
	// BodyMinRate, when positive, is the slowest a request body may
	// arrive, in bytes per second over each window (proxy.NewBodyPace).
	BodyMinRate int64
	// MaxConnections caps the client connections open at once on the
	// proxy listener, over both fronts; 0 is no cap.
	MaxConnections int
	// MaxPendingHeadBytes caps the bytes of request heads the client
	// connections hold beyond each head's first proxy.HeadAllowance; 0 is
	// no cap.
	MaxPendingHeadBytes int64
	DrainTimeout        time.Duration
	DenyCacheKeys       int
	LocalMaxKeys        int
	EventQueue          int
	LogLevel            string
	// GRPCListen, when set, serves Envoy's rate-limit service
	// (ShouldRateLimit), gRPC health and reflection on this address.
	GRPCListen string
	// GRPCResponseHeaders adds the rate-limit response fields to
	// ShouldRateLimit answers (response_headers_to_add).
	GRPCResponseHeaders bool
	// GRPCTLSCertFile and GRPCTLSKeyFile are the gRPC listener's TLS
	// certificate and key, and GRPCClientCAFile the CA bundle that every
	// caller's client certificate must verify against: with them the
	// listener serves TLS only, requires a client certificate, and
	// honours a request descriptor only from a gateway its policy lists
	// (envoyrls.Options.Authenticate). The three files are read again for
	// every handshake. All three or none.
	GRPCTLSCertFile, GRPCTLSKeyFile, GRPCClientCAFile string
	// GCPercent is the garbage collector's GOGC unless the GOGC
	// environment variable is set.
	GCPercent int
	// MemoryLimitRatio sets the runtime's soft memory limit to this share
	// of the container's memory limit, unless GOMEMLIMIT is set; 0 sets
	// none.
	MemoryLimitRatio float64
	// AdminPprof serves Go's profiling endpoints under /debug/pprof/ on
	// the admin listener.
	AdminPprof bool
	// CheckConfig, when set, validates and explains this policy file and
	// exits without serving.
	CheckConfig string
	// PrintRedisFunctions, when set, prints the counter functions'
	// library, for FUNCTION LOAD on an external store, and exits.
	PrintRedisFunctions bool
	// StateDir, when set, is where the sidecar saves the last document it
	// applied from its source, and reads it back at start: a restarted
	// sidecar enforces its last good revision until the source (the API
	// server) answers. The injector sets it to an emptyDir.
	StateDir string

	// debugClockStart is --debug-manual-clock, which only a build with
	// DebugClockTag has (debugclock.go).
	debugClockStart string

	// set records the flags given on the command line or by environment.
	set map[string]bool
}

// Defaults.
const (
	DefaultListen       = ":8081"
	DefaultAdminListen  = ":9090"
	DefaultUpstream     = "http://127.0.0.1:8080"
	DefaultPollInterval = time.Second
)

// Defaults of the resource budgets. With them the sidecar stays inside
// the memory limit the injector gives it (256Mi) with every connection
// held by an attacker, on either front, while clients past 10,000
// hostile connections are still served: measured with 10,000 partial
// heads, 1,000 trickling bodies and 5,000 idle h2c connections
// (docs/performance.md, "Hostile connections"). A connection costs 10-16
// KiB with a partial head (the lean core, net/http), an h2c one about 34
// KiB and counts twice (proxy.H2ConnWeight).
const (
	DefaultMaxConnections      = 10240
	DefaultMaxPendingHeadBytes = 16 << 20
)

// RegisterFlags defines the flags on fs, bound to c.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", DefaultListen, "address the proxy listens on (HTTP/1.1 and h2c)")
	fs.StringVar(&c.AdminListen, "admin-listen", DefaultAdminListen, "address serving /metrics, /healthz, /readyz and /debug/config")
	fs.BoolVar(&c.AdminPprof, "admin-pprof", false, "also serve Go's profiles (CPU, heap, goroutines) under /debug/pprof/ on --admin-listen")
	fs.StringVar(&c.Upstream, "upstream", DefaultUpstream, "the application's URL")
	fs.BoolVar(&c.UpstreamH2C, "upstream-h2c", false, "speak HTTP/2 without TLS to the upstream (gRPC applications)")
	fs.StringVar(&c.PolicyFile, "policy-file", "", "sidecar config (YAML or JSON, "+config.APIVersion+"); watched and hot-reloaded")
	fs.DurationVar(&c.PollInterval, "policy-poll-interval", DefaultPollInterval, "how often the policy file is checked for changes")
	fs.StringVar(&c.PodLabels, "pod-labels", "", "this pod's labels, k=v,k2=v2, matched against policies' podSelector")
	fs.StringVar(&c.PodLabelsFile, "pod-labels-file", "", "file of this pod's labels, one key=\"value\" per line (a downward API volume); merged with --pod-labels")
	fs.BoolVar(&c.Kubernetes, "kubernetes", false, "Kubernetes mode: watch the namespace's "+config.ConfigMapName+" ConfigMap instead of --policy-file, and report the pod condition")
	fs.StringVar(&c.Namespace, "namespace", "", "Kubernetes mode: the pod's namespace (default $"+config.EnvPodNamespace+")")
	fs.StringVar(&c.PodName, "pod-name", "", "the pod's name (default $"+config.EnvPodName+"): finds this sidecar's place among each policy's replicas (pods, replicaPods), which staggers the fail-open shares; "+
		"required with --kubernetes, and on a Redis store by a policy with replicas above 1, whose replicaPods must then list it when standalone")
	fs.StringVar(&c.StateDir, "state-dir", "", "directory where the last applied config is saved and read back at start, so that a restarted sidecar enforces it until its source answers; empty: off")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "Kubernetes mode: kubeconfig file; empty uses the in-cluster service account")
	fs.StringVar(&c.ConfigMapName, "configmap-name", config.ConfigMapName, "Kubernetes mode: the ConfigMap of the namespace to watch; the central rate-limit service watches "+config.RateLimitServiceConfigMapName)
	fs.StringVar(&c.Store, "store", "", "counter store: memory or redis (default: the policy file's store section, else memory)")
	fs.StringVar(&c.RedisAddrs, "redis-addrs", "", "comma-separated Redis Cluster seed addresses, host:port")
	fs.StringVar(&c.RedisPassFile, "redis-password-file", "", "file holding the Redis password (or set "+EnvRedisPassword+")")
	fs.StringVar(&c.RedisUserFile, "redis-username-file", "", "file holding the Redis ACL user to authenticate as with the password, read with it for every new connection; a missing file means the default user")
	fs.StringVar(&c.RedisKeyNamespace, "redis-key-namespace", "",
		"key space of the counters, inside every Redis key's hash tag, which the store user's ACL key pattern (fg:{<namespace>/*) covers (default: --namespace in Kubernetes mode, else none)")
	fs.BoolVar(&c.RedisTLS, "redis-tls", false, "use TLS to Redis")
	fs.StringVar(&c.RedisTLSCAFile, "redis-tls-ca-file", "", "CA bundle verifying Redis (default: system pool)")
	fs.StringVar(&c.RedisTLSServer, "redis-tls-server-name", "", "name expected in the Redis certificates")
	fs.BoolVar(&c.RedisTLSSkipVer, "redis-tls-insecure-skip-verify", false, "do not verify Redis certificates (testing only)")
	fs.DurationVar(&c.RedisTimeout, "redis-timeout", 0, "budget of one Redis call, and of a decision's waits and calls from the request's arrival; 0 keeps the store's default ("+redisstore.DefaultTimeout.String()+")")
	fs.DurationVar(&c.RedisBatchWindow, "redis-batch-window", redisstore.DefaultBatchWindow,
		"longest a Redis decision waits to share a pipelined write with others bound for the same shard (only while the shard has writes in flight); 0 means no window: decisions never wait for others; at most "+redisstore.MaxBatchWindow.String())
	fs.IntVar(&c.RedisMaxBatch, "redis-max-batch", redisstore.DefaultMaxBatch, "most decisions in one pipelined write to a shard")
	fs.IntVar(&c.RedisBreakerFailures, "redis-breaker-failures", redisstore.DefaultBreakerFailures,
		"consecutive failed calls to a shard that open its circuit breaker (calls then fail fast to each rule's failureMode); one timeout opens it at once, with the next call as its probe")
	fs.DurationVar(&c.RedisBreakerCooldown, "redis-breaker-cooldown", redisstore.DefaultBreakerCooldown,
		"how long, on average, an open breaker fails fast before one probe call tests the shard again (each cooldown is drawn at random between half and 1.5 times this)")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", 64<<10, "largest request header block accepted (request line and fields, as HTTP/1.1 sends them); larger gets 431")
	fs.Int64Var(&c.MaxDelayed, "max-delayed", proxy.DefaultMaxDelayed, "most requests that wait for their slot at once, per rule with onExceed: Delay; the next one gets 429 and gives its slot back")
	fs.BoolVar(&c.AllowUnderscoreHeaders, "allow-underscore-headers", false, "forward request header fields whose names contain an underscore, and let rules read them; by default they are dropped, because CGI-style servers (WSGI, Rack, PHP) read X_Api_Key as X-Api-Key")
	fs.BoolVar(&c.LeanHTTP1, "lean-http1", true, "serve keep-alive HTTP/1.1 to a plain-HTTP upstream with floodgate's lean proxy core; false: every connection through Go's net/http (h2c, upgrades and gRPC always are)")
	fs.DurationVar(&c.ReadHeaderTimeout, "read-header-timeout", 10*time.Second, "longest a client may take to send a request head; slower ones get 408 and are disconnected")
	fs.DurationVar(&c.BodyTimeout, "body-timeout", 30*time.Second, "longest each 64 KiB of a request body, and its last part, may take to arrive; a body that stalls or trickles more slowly is cut off")
	fs.Int64Var(&c.BodyMinRate, "body-min-rate", 0, "slowest a request body may arrive, in bytes per second over each window (64 KiB, or a second's worth when more); a slower body is cut off with 408; 0: off")
	fs.IntVar(&c.MaxConnections, "max-connections", DefaultMaxConnections, "most client connections open at once on --listen, over both HTTP fronts; past it a new connection is answered 503 and closed; 0: no cap")
	fs.Int64Var(&c.MaxPendingHeadBytes, "max-pending-head-bytes", DefaultMaxPendingHeadBytes, "most bytes of request heads held beyond each head's first 4 KiB, over all connections; a connection that would go past it is answered 503 and closed; 0: no cap")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 15*time.Second, "how long shutdown waits for in-flight requests")
	fs.IntVar(&c.DenyCacheKeys, "deny-cache-keys", 100000, "bound on the local deny cache")
	fs.IntVar(&c.LocalMaxKeys, "local-max-keys", 1<<20, "bound on keys in the in-memory and fallback stores")
	fs.IntVar(&c.EventQueue, "event-queue", 4096, "capacity of the deny event queue; events beyond it are dropped and counted")
	fs.IntVar(&c.GCPercent, "gc-percent", DefaultGCPercent,
		"Go garbage collector target (GOGC): heap growth in percent between collections; the GOGC environment variable, when set, wins")
	fs.Float64Var(&c.MemoryLimitRatio, "memory-limit-ratio", DefaultMemoryLimitRatio,
		"soft memory limit of the Go runtime as a share of the container's memory limit (cgroup), so that --gc-percent never grows the heap past it; 0: none; GOMEMLIMIT, when set, wins")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.GRPCListen, "grpc-listen", "", "address serving Envoy's rate-limit service (envoy.service.ratelimit.v3 ShouldRateLimit), gRPC health and reflection; empty: off")
	fs.BoolVar(&c.GRPCResponseHeaders, "grpc-response-headers", false, "add X-RateLimit-*, RateLimit, RateLimit-Policy and Retry-After to ShouldRateLimit answers (response_headers_to_add)")
	fs.StringVar(&c.GRPCTLSCertFile, "grpc-tls-cert-file", "", "PEM certificate (chain) of --grpc-listen; with --grpc-tls-key-file and --grpc-client-ca-file the listener serves only TLS callers with a verified client certificate; read again for every handshake")
	fs.StringVar(&c.GRPCTLSKeyFile, "grpc-tls-key-file", "", "PEM private key of --grpc-tls-cert-file; read again for every handshake")
	fs.StringVar(&c.GRPCClientCAFile, "grpc-client-ca-file", "", "PEM CA bundle that callers' client certificates must verify against; a request descriptor is then honoured only from a gateway its policy lists; read again for every handshake")
	fs.BoolVar(&c.PrintRedisFunctions, "print-redis-functions", false, "print the Redis Functions library of the counter scripts (for FUNCTION LOAD on an external store whose user may not load it), then exit")
	fs.StringVar(&c.CheckConfig, "check-config", "", "validate and explain a policy file (floodgate sidecar config or envoyproxy/ratelimit config, detected), then exit")
	debugFlags(fs, c)
}

// Parse parses args into c: flags first, then, for each flag not given,
// its environment variable read through getenv.
func (c *Config) Parse(fs *flag.FlagSet, args []string, getenv func(string) (string, bool)) error {
	c.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	c.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if c.set[f.Name] {
			return
		}
		env := EnvName(f.Name)
		if v, ok := getenv(env); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
				return
			}
			c.set[f.Name] = true
		}
	})
	if v, ok := getenv(EnvRedisPassword); ok {
		c.RedisPassword = v
	}
	// The downward API's conventional names fill the pod identity.
	for _, d := range []struct {
		flag, env string
		dst       *string
	}{{"namespace", config.EnvPodNamespace, &c.Namespace}, {"pod-name", config.EnvPodName, &c.PodName}} {
		if v, ok := getenv(d.env); ok && !c.set[d.flag] {
			*d.dst = v
			c.set[d.flag] = true
		}
	}
	return errors.Join(errs...)
}

// KeySpace returns the key space of the Redis counters:
// --redis-key-namespace, else the pod's namespace in Kubernetes mode, else
// none.
func (c *Config) KeySpace() string {
	switch {
	case c.RedisKeyNamespace != "":
		return c.RedisKeyNamespace
	case c.Kubernetes:
		return c.Namespace
	}
	return ""
}

// EnvName returns the environment variable of a flag.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// IsSet reports whether a flag was given on the command line or by its
// environment variable.
func (c *Config) IsSet(flagName string) bool { return c.set[flagName] }

// validateGRPCTLS checks the gRPC listener's TLS flags: all three or
// none, and only with --grpc-listen.
func (c *Config) validateGRPCTLS(bad func(flagName, format string, args ...any)) {
	set := map[string]bool{
		"grpc-tls-cert-file":  c.GRPCTLSCertFile != "",
		"grpc-tls-key-file":   c.GRPCTLSKeyFile != "",
		"grpc-client-ca-file": c.GRPCClientCAFile != "",
	}
	n := 0
	for _, ok := range set {
		if ok {
			n++
		}
	}
	if n == 0 {
		return
	}
	if c.GRPCListen == "" {
		bad("grpc-tls-cert-file", "needs --grpc-listen")
	}
	if n < len(set) {
		for _, name := range []string{"grpc-tls-cert-file", "grpc-tls-key-file", "grpc-client-ca-file"} {
			if !set[name] {
				bad(name, "required with the other gRPC TLS flags: the listener serves TLS only to callers with a verified client certificate")
			}
		}
	}
}

// Validate reports every problem with c at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flagName, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s (%s): %s", flagName, EnvName(flagName), fmt.Sprintf(format, args...)))
	}
	for name, addr := range map[string]string{"listen": c.Listen, "admin-listen": c.AdminListen} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			bad(name, "%v", err)
		}
	}
	if c.Listen == c.AdminListen && !strings.HasSuffix(c.Listen, ":0") {
		bad("admin-listen", "must differ from --listen")
	}
	if c.GRPCListen != "" {
		if _, _, err := net.SplitHostPort(c.GRPCListen); err != nil {
			bad("grpc-listen", "%v", err)
		} else if (c.GRPCListen == c.Listen || c.GRPCListen == c.AdminListen) && !strings.HasSuffix(c.GRPCListen, ":0") {
			bad("grpc-listen", "must differ from --listen and --admin-listen")
		}
	}
	c.validateGRPCTLS(bad)
	if u, err := url.Parse(c.Upstream); err != nil {
		bad("upstream", "%v", err)
	} else if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		bad("upstream", "must be an http:// or https:// URL with a host, got %q", c.Upstream)
	}
	c.validateSource(bad)
	if c.PollInterval < 10*time.Millisecond {
		bad("policy-poll-interval", "must be at least 10ms, got %v", c.PollInterval)
	}
	if _, err := c.Labels(); err != nil {
		bad("pod-labels", "%v", err)
	}
	switch c.Store {
	case "", config.StoreMemory, config.StoreRedis:
	default:
		bad("store", "must be memory or redis, got %q", c.Store)
	}
	if c.Store == config.StoreRedis && c.RedisAddrs == "" {
		bad("redis-addrs", "--store redis needs at least one address")
	}
	if c.Store == config.StoreMemory && c.RedisAddrs != "" {
		bad("redis-addrs", "given with --store memory")
	}
	c.validateRedis(bad)
	if c.StateDir != "" {
		if st, err := os.Stat(c.StateDir); err != nil {
			bad("state-dir", "%v", err)
		} else if !st.IsDir() {
			bad("state-dir", "%s is not a directory", c.StateDir)
		}
	}
	if c.MaxDelayed < 1 || c.MaxDelayed > 1_000_000 {
		bad("max-delayed", "must be between 1 and 1000000, got %d", c.MaxDelayed)
	}
	if c.MaxHeaderBytes < 4096 || c.MaxHeaderBytes > 16<<20 {
		bad("max-header-bytes", "must be between 4096 and 16777216, got %d", c.MaxHeaderBytes)
	}
	if c.DrainTimeout < 0 {
		bad("drain-timeout", "must not be negative")
	}
	if c.BodyTimeout <= 0 {
		bad("body-timeout", "must be positive, got %v", c.BodyTimeout)
	}
	c.validateBudgets(bad)
	if c.ReadHeaderTimeout <= 0 {
		bad("read-header-timeout", "must be positive, got %v", c.ReadHeaderTimeout)
	}
	if c.DenyCacheKeys < 1 {
		bad("deny-cache-keys", "must be at least 1")
	}
	if c.LocalMaxKeys < 1 {
		bad("local-max-keys", "must be at least 1")
	}
	if c.EventQueue < 1 {
		bad("event-queue", "must be at least 1")
	}
	if c.GCPercent < 25 || c.GCPercent > 10000 {
		bad("gc-percent", "must be between 25 and 10000, got %d", c.GCPercent)
	}
	if !(c.MemoryLimitRatio >= 0 && c.MemoryLimitRatio <= 1) {
		bad("memory-limit-ratio", "must be between 0 and 1, got %v", c.MemoryLimitRatio)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log-level", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
	return errors.Join(errs...)
}

// validateBudgets checks the bounds on what clients hold: connections,
// head bytes and the pace of bodies.
func (c *Config) validateBudgets(bad func(flagName, format string, args ...any)) {
	if least := proxy.MinUsefulRate(c.BodyTimeout); c.BodyMinRate < 0 || c.BodyMinRate > 0 && c.BodyMinRate < least {
		bad("body-min-rate", "must be 0 (off) or at least %d bytes/s, what --body-timeout %v already requires (64 KiB per timeout), got %d", least, c.BodyTimeout, c.BodyMinRate)
	}
	if c.MaxConnections < 0 {
		bad("max-connections", "must be 0 (no cap) or positive, got %d", c.MaxConnections)
	}
	if c.MaxPendingHeadBytes < 0 || c.MaxPendingHeadBytes > 0 && c.MaxPendingHeadBytes < int64(c.MaxHeaderBytes) {
		bad("max-pending-head-bytes", "must be 0 (no cap) or at least --max-header-bytes (%d), got %d", c.MaxHeaderBytes, c.MaxPendingHeadBytes)
	}
}

// validateRedis checks the Redis store's flags.
func (c *Config) validateRedis(bad func(flagName, format string, args ...any)) {
	for _, a := range c.redisAddrs() {
		if err := config.ValidateAddress(a); err != nil {
			bad("redis-addrs", "%q: %v", a, err)
		}
	}
	if c.RedisPassFile != "" {
		if c.RedisPassword != "" {
			bad("redis-password-file", "give either it or %s, not both", EnvRedisPassword)
		}
		// In Kubernetes mode the file comes from an optional Secret
		// volume and may appear after the start.
		if _, err := os.Stat(c.RedisPassFile); err != nil && (!c.Kubernetes || !errors.Is(err, fs.ErrNotExist)) {
			bad("redis-password-file", "%v", err)
		}
	}
	if c.RedisUserFile != "" && c.RedisPassFile == "" {
		bad("redis-username-file", "needs --redis-password-file")
	}
	if err := redislayout.ValidKeySpace(c.KeySpace()); err != nil {
		bad("redis-key-namespace", "%v", err)
	}
	if c.RedisTLSCAFile != "" {
		if _, err := caPool(c.RedisTLSCAFile); err != nil {
			bad("redis-tls-ca-file", "%v", err)
		}
	}
	if c.RedisTimeout < 0 {
		bad("redis-timeout", "must not be negative")
	}
	if c.RedisBatchWindow < 0 || c.RedisBatchWindow > redisstore.MaxBatchWindow {
		bad("redis-batch-window", "must be between 0 (no window) and %v, got %v", redisstore.MaxBatchWindow, c.RedisBatchWindow)
	}
	if c.RedisMaxBatch < 1 {
		bad("redis-max-batch", "must be at least 1, got %d", c.RedisMaxBatch)
	}
	if c.RedisBreakerFailures < 1 {
		bad("redis-breaker-failures", "must be at least 1, got %d", c.RedisBreakerFailures)
	}
	if c.RedisBreakerCooldown <= 0 {
		bad("redis-breaker-cooldown", "must be positive, got %v", c.RedisBreakerCooldown)
	}
}

// validateSource checks the config source: --policy-file in standalone
// mode, the pod's identity in Kubernetes mode.
func (c *Config) validateSource(bad func(flagName, format string, args ...any)) {
	if !c.Kubernetes {
		if c.PolicyFile == "" {
			bad("policy-file", "required in standalone mode")
		}
		if c.IsSet("configmap-name") {
			bad("configmap-name", "only used with --kubernetes")
		}
		return
	}
	if c.ConfigMapName == "" {
		bad("configmap-name", "must not be empty")
	}
	if c.PolicyFile != "" {
		bad("policy-file", "not used with --kubernetes, which reads the namespace's %s ConfigMap", config.ConfigMapName)
	}
	if c.Namespace == "" {
		bad("namespace", "required with --kubernetes (or set %s)", config.EnvPodNamespace)
	}
	if c.PodName == "" {
		bad("pod-name", "required with --kubernetes (or set %s)", config.EnvPodName)
	}
}

func (c *Config) redisAddrs() []string {
	var out []string
	for _, a := range strings.Split(c.RedisAddrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Labels parses --pod-labels-file and --pod-labels; a label in both takes
// the --pod-labels value.
func (c *Config) Labels() (labels.Set, error) {
	out := labels.Set{}
	if c.PodLabelsFile != "" {
		data, err := os.ReadFile(c.PodLabelsFile)
		if err != nil {
			return nil, fmt.Errorf("pod labels file: %w", err)
		}
		if out, err = ParseLabelsFile(data); err != nil {
			return nil, fmt.Errorf("pod labels file %s: %w", c.PodLabelsFile, err)
		}
	}
	if strings.TrimSpace(c.PodLabels) == "" {
		return out, nil
	}
	m, err := labels.ConvertSelectorToLabelsMap(c.PodLabels)
	if err != nil {
		return nil, err
	}
	for k, v := range m {
		out[k] = v
	}
	return out, nil
}

// ParseLabelsFile parses the downward API's labels file: one key="value"
// per line, the value a Go-quoted string.
func ParseLabelsFile(data []byte) (labels.Set, error) {
	out := labels.Set{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, quoted, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: want key=\"value\", got %q", i+1, line)
		}
		v, err := strconv.Unquote(quoted)
		if err != nil {
			return nil, fmt.Errorf("line %d: value of %s is not a quoted string: %w", i+1, k, err)
		}
		out[k] = v
	}
	return out, nil
}

// LogLevel maps --log-level to a slog level.
func LogLevel(s string) slog.Level {
	switch s {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}
