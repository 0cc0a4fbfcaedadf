package app

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/floodgate-dev/floodgate/controllers/rlsidentity"
)

// Options is the manager's whole configuration, filled from flags.
type Options struct {
	// MetricsAddr is where /metrics is served; "0" disables it.
	MetricsAddr string
	// SecureMetrics serves /metrics over HTTPS, and only to callers the
	// API server authenticates and authorizes for GET /metrics.
	SecureMetrics bool
	// MetricsCertDir holds tls.crt and tls.key for the metrics server.
	// When empty, a self-signed certificate is generated.
	MetricsCertDir string
	// ProbeAddr is where /healthz and /readyz are served; "0" disables
	// them.
	ProbeAddr string
	// EnableHTTP2 allows HTTP/2 on the metrics server. It is off by
	// default because of the HTTP/2 stream-reset attacks
	// (CVE-2023-44487, CVE-2023-39325). The webhook server always offers
	// HTTP/2: see webhookServer.
	EnableHTTP2 bool

	// LeaderElect makes only one replica active at a time.
	LeaderElect bool
	// LeaderElectionID names the Lease.
	LeaderElectionID string
	// LeaderElectionNamespace holds the Lease; empty means the namespace
	// the manager runs in.
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// PolicyConcurrency is how many namespaces the policy controller
	// reconciles at once.
	PolicyConcurrency int
	// RateLimitService runs the controller that compiles the policies
	// with a targetRef for the central rate-limit service
	// (floodgate-ratelimit), which runs in the manager's namespace.
	RateLimitService bool
	// RateLimitServiceName and RateLimitServicePort are the central
	// service's Service and gRPC port, which the gateway configuration
	// the manager generates points at.
	RateLimitServiceName string
	RateLimitServicePort int
	// RateLimitServiceTLS makes the central service authenticate its
	// callers: the manager keeps its CA, its serving certificate and a
	// client certificate per gateway of RateLimitGateways
	// (rlsidentity), and the generated gateway configuration presents
	// the client certificate.
	RateLimitServiceTLS bool
	// RateLimitGateways are the Gateways that get a client certificate.
	RateLimitGateways gatewayList
	// ApplyGatewayConfig makes the manager apply the generated Istio
	// EnvoyFilter or Envoy Gateway EnvoyPatchPolicy of each Gateway that
	// enforces a policy (ratelimitservice.GatewayApply), instead of only
	// publishing them; ApplyGatewayClasses limits it to those classes.
	ApplyGatewayConfig  bool
	ApplyGatewayClasses []string
	// GracefulShutdown bounds how long the manager waits for running
	// reconciles when it stops.
	GracefulShutdown time.Duration
	// UsageInterval is how often the leader reads the sidecars' usage
	// reports for the policies' status (package usage); 0 disables it.
	UsageInterval time.Duration
	// UsageWindow is the span of the counts in the policies' status.
	UsageWindow time.Duration

	// Kubeconfig is the kubeconfig file to use. When empty, the manager
	// uses $KUBECONFIG, the in-cluster config, or ~/.kube/config, in that
	// order.
	Kubeconfig string

	// Webhook configures the webhooks, their certificate and the
	// injected sidecar (webhooks.go).
	Webhook WebhookOptions

	// Zap configures logging.
	Zap zap.Options

	// skipNameValidation lets tests run several managers in one process;
	// controller names are otherwise unique per process.
	skipNameValidation bool
}

// Leader election defaults. When the leader dies without releasing its
// Lease (SIGKILL, a lost node), a standby takes over once the Lease has
// gone unrenewed for LeaseDuration as the standby saw it; the standby
// looks every RetryPeriod, stretched by up to 120% of jitter, so it may see
// the last renewal up to 2.2 periods late and act up to 2.2 periods after
// the expiry: at worst LeaseDuration + 4.4 RetryPeriods, 12.4s, typically
// about 9s. A leader that cannot renew for RenewDeadline (the API server
// down that long) stops leading and exits, to be restarted.
const (
	DefaultLeaseDuration = 8 * time.Second
	DefaultRenewDeadline = 6 * time.Second
	DefaultRetryPeriod   = time.Second
)

// DefaultOptions returns the options the flags default to.
func DefaultOptions() Options {
	return Options{
		MetricsAddr:          ":8443",
		SecureMetrics:        true,
		ProbeAddr:            ":8081",
		LeaderElectionID:     "floodgate-manager.ratelimit.floodgate.dev",
		LeaseDuration:        DefaultLeaseDuration,
		RenewDeadline:        DefaultRenewDeadline,
		RetryPeriod:          DefaultRetryPeriod,
		PolicyConcurrency:    4,
		RateLimitServiceName: "floodgate-ratelimit",
		RateLimitServicePort: 8082,
		GracefulShutdown:     30 * time.Second,
		UsageInterval:        10 * time.Second,
		UsageWindow:          5 * time.Minute,
		Webhook:              defaultWebhookOptions(),
		Zap:                  zap.Options{Development: false},
	}
}

// BindFlags registers the options as flags of fs, with o's values as
// defaults.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr,
		"Address the /metrics endpoint binds to, such as :8443; 0 disables it.")
	fs.BoolVar(&o.SecureMetrics, "metrics-secure", o.SecureMetrics,
		"Serve /metrics over HTTPS to callers authorized by the API server (TokenReview and SubjectAccessReview); false serves plain HTTP to anyone.")
	fs.StringVar(&o.MetricsCertDir, "metrics-cert-dir", o.MetricsCertDir,
		"Directory with tls.crt and tls.key for the metrics server; empty generates a self-signed certificate.")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", o.ProbeAddr,
		"Address the /healthz and /readyz probes bind to; 0 disables them.")
	fs.BoolVar(&o.EnableHTTP2, "enable-http2", o.EnableHTTP2,
		"Allow HTTP/2 on the metrics server (off by default: HTTP/2 stream-reset attacks).")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect,
		"Elect a leader so that only one replica reconciles at a time. Enable it when running more than one replica.")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", o.LeaderElectionID,
		"Name of the Lease used for leader election.")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace,
		"Namespace of the leader-election Lease; empty uses the namespace the manager runs in.")
	fs.DurationVar(&o.LeaseDuration, "leader-election-lease-duration", o.LeaseDuration,
		"How long non-leaders wait before trying to take over an unrenewed lease.")
	fs.DurationVar(&o.RenewDeadline, "leader-election-renew-deadline", o.RenewDeadline,
		"How long the leader keeps trying to renew before it gives up leadership.")
	fs.DurationVar(&o.RetryPeriod, "leader-election-retry-period", o.RetryPeriod,
		"How often leader-election clients retry.")
	fs.IntVar(&o.PolicyConcurrency, "policy-concurrency", o.PolicyConcurrency,
		"Number of namespaces the RateLimitPolicy controller reconciles concurrently.")
	fs.BoolVar(&o.RateLimitService, "ratelimit-service", o.RateLimitService,
		"Compile RateLimitPolicies with a targetRef into the central rate-limit service's ConfigMap floodgate-ratelimit-policies, in --namespace, and report their status.")
	fs.StringVar(&o.RateLimitServiceName, "ratelimit-service-name", o.RateLimitServiceName,
		"The central rate-limit service's Service, in --namespace, that the generated gateway configuration (ConfigMap floodgate-gateway-config) points at.")
	fs.IntVar(&o.RateLimitServicePort, "ratelimit-service-port", o.RateLimitServicePort,
		"The gRPC port of the central rate-limit service's Service.")
	fs.BoolVar(&o.RateLimitServiceTLS, "ratelimit-service-tls", o.RateLimitServiceTLS,
		"The central rate-limit service authenticates its callers: keep its CA (Secret floodgate-ratelimit-ca), its serving certificate (floodgate-ratelimit-tls) and a client certificate for each gateway of --ratelimit-gateways (floodgate-ratelimit-client in the gateway's namespace), and generate gateway configuration that presents it.")
	fs.Var(&o.RateLimitGateways, "ratelimit-gateways",
		"Comma-separated Gateways that get a client certificate of the central rate-limit service, as <namespace>/<name>, or <namespace>/<name>=<namespace of its pods> when its pods run elsewhere (Envoy Gateway's proxies run in its controller's namespace).")
	fs.BoolVar(&o.ApplyGatewayConfig, "apply-gateway-config", o.ApplyGatewayConfig,
		"Create, update and delete the generated Istio EnvoyFilter or Envoy Gateway EnvoyPatchPolicy of each Gateway that enforces a policy with a targetRef (server-side apply, field manager floodgate-gateway-config), by its GatewayClass's controller; only with --ratelimit-service.")
	fs.Func("apply-gateway-classes",
		"Comma-separated GatewayClasses whose Gateways --apply-gateway-config configures; empty means every Gateway whose class's controller is Istio's or Envoy Gateway's.",
		func(v string) error {
			o.ApplyGatewayClasses = nil
			for c := range strings.SplitSeq(v, ",") {
				if c = strings.TrimSpace(c); c != "" {
					o.ApplyGatewayClasses = append(o.ApplyGatewayClasses, c)
				}
			}
			return nil
		})
	fs.DurationVar(&o.GracefulShutdown, "graceful-shutdown-timeout", o.GracefulShutdown,
		"How long to wait for running reconciles on shutdown.")
	fs.DurationVar(&o.UsageInterval, "usage-interval", o.UsageInterval,
		"How often the leader reads each sidecar's usage report (its admin port) for the rule counts in the policies' status; 0 disables it.")
	fs.DurationVar(&o.UsageWindow, "usage-window", o.UsageWindow,
		"The span of the rule counts in the policies' status.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig,
		"Path to a kubeconfig; only needed out of cluster. Empty uses $KUBECONFIG, the in-cluster config or ~/.kube/config.")
	o.Webhook.bindFlags(fs)
	o.Zap.BindFlags(fs)
}

// Validate reports every problem with o at once.
func (o *Options) Validate() error {
	var errs []error
	for _, a := range []struct{ flag, addr string }{
		{"metrics-bind-address", o.MetricsAddr},
		{"health-probe-bind-address", o.ProbeAddr},
	} {
		if err := validateBindAddress(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", a.flag, err))
		}
	}
	if o.MetricsCertDir != "" && !o.SecureMetrics {
		errs = append(errs, errors.New("--metrics-cert-dir: only used with --metrics-secure"))
	}
	if o.LeaderElect && o.LeaderElectionID == "" {
		errs = append(errs, errors.New("--leader-election-id: must not be empty with --leader-elect"))
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"leader-election-lease-duration", o.LeaseDuration},
		{"leader-election-renew-deadline", o.RenewDeadline},
		{"leader-election-retry-period", o.RetryPeriod},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("--%s: must be positive, got %v", d.flag, d.v))
		}
	}
	if o.RenewDeadline >= o.LeaseDuration {
		errs = append(errs, fmt.Errorf("--leader-election-renew-deadline: must be shorter than the lease duration %v, got %v", o.LeaseDuration, o.RenewDeadline))
	}
	if o.RetryPeriod >= o.RenewDeadline {
		errs = append(errs, fmt.Errorf("--leader-election-retry-period: must be shorter than the renew deadline %v, got %v", o.RenewDeadline, o.RetryPeriod))
	}
	if o.RateLimitService && o.RateLimitServiceName == "" {
		errs = append(errs, errors.New("--ratelimit-service-name: must not be empty with --ratelimit-service"))
	}
	if o.RateLimitServiceTLS && !o.RateLimitService {
		errs = append(errs, errors.New("--ratelimit-service-tls: only used with --ratelimit-service"))
	}
	if o.ApplyGatewayConfig && !o.RateLimitService {
		errs = append(errs, errors.New("--apply-gateway-config: only used with --ratelimit-service"))
	}
	if len(o.ApplyGatewayClasses) > 0 && !o.ApplyGatewayConfig {
		errs = append(errs, errors.New("--apply-gateway-classes: only used with --apply-gateway-config"))
	}
	for _, c := range o.ApplyGatewayClasses {
		if msgs := validation.IsDNS1123Subdomain(c); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--apply-gateway-classes: %q is no GatewayClass name: %s", c, strings.Join(msgs, "; ")))
		}
	}
	if len(o.RateLimitGateways) > 0 && !o.RateLimitServiceTLS {
		errs = append(errs, errors.New("--ratelimit-gateways: only used with --ratelimit-service-tls"))
	}
	if o.RateLimitServicePort < 1 || o.RateLimitServicePort > 65535 {
		errs = append(errs, fmt.Errorf("--ratelimit-service-port: must be between 1 and 65535, got %d", o.RateLimitServicePort))
	}
	if o.PolicyConcurrency < 1 || o.PolicyConcurrency > 64 {
		errs = append(errs, fmt.Errorf("--policy-concurrency: must be between 1 and 64, got %d", o.PolicyConcurrency))
	}
	if o.GracefulShutdown < 0 {
		errs = append(errs, fmt.Errorf("--graceful-shutdown-timeout: must not be negative, got %v", o.GracefulShutdown))
	}
	if o.UsageInterval < 0 || (o.UsageInterval > 0 && o.UsageInterval < time.Second) {
		errs = append(errs, fmt.Errorf("--usage-interval: must be 0 (off) or at least 1s, got %v", o.UsageInterval))
	}
	if o.UsageInterval > 0 && o.UsageWindow < 2*o.UsageInterval {
		errs = append(errs, fmt.Errorf("--usage-window: must be at least twice --usage-interval (%v), got %v", o.UsageInterval, o.UsageWindow))
	}
	errs = append(errs, o.Webhook.validate()...)
	return errors.Join(errs...)
}

// validateBindAddress accepts "0" (disabled) or host:port with a port in
// 0-65535 (0 picks a free port).
func validateBindAddress(addr string) error {
	if addr == "0" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("must be host:port, :port or 0, got %q", addr)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port must be 0-65535, got %q", port)
	}
	return nil
}

// gatewayList is the value of --ratelimit-gateways.
type gatewayList []rlsidentity.Gateway

// String implements flag.Value.
func (l *gatewayList) String() string {
	parts := make([]string, len(*l))
	for i, g := range *l {
		parts[i] = g.String()
	}
	return strings.Join(parts, ",")
}

// Set implements flag.Value: it parses the whole comma-separated list,
// which replaces any earlier one, and refuses a gateway listed twice.
func (l *gatewayList) Set(v string) error {
	var out gatewayList
	seen := map[string]bool{}
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		g, err := rlsidentity.ParseGateway(s)
		if err != nil {
			return err
		}
		if seen[g.Ref()] {
			return fmt.Errorf("gateway %s is listed twice", g.Ref())
		}
		seen[g.Ref()] = true
		out = append(out, g)
	}
	*l = out
	return nil
}
