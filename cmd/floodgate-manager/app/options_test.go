package app

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestDefaultOptionsAreValid(t *testing.T) {
	t.Parallel()
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Fatalf("DefaultOptions().Validate() = %v, want nil", err)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	o := DefaultOptions()
	o.MetricsAddr = "8443"
	o.ProbeAddr = ":99999"
	o.SecureMetrics = false
	o.MetricsCertDir = "/certs"
	o.LeaderElect = true
	o.LeaderElectionID = ""
	o.RenewDeadline = 20 * time.Second
	o.RetryPeriod = 0
	o.PolicyConcurrency = 0
	o.GracefulShutdown = -time.Second
	err := o.Validate()
	if err == nil {
		t.Fatal("Validate() = nil, want errors")
	}
	for _, want := range []string{
		`--metrics-bind-address: must be host:port, :port or 0, got "8443"`,
		`--health-probe-bind-address: port must be 0-65535, got "99999"`,
		"--metrics-cert-dir: only used with --metrics-secure",
		"--leader-election-id: must not be empty",
		"--leader-election-retry-period: must be positive",
		"--leader-election-renew-deadline: must be shorter than the lease duration",
		"--policy-concurrency: must be between 1 and 64, got 0",
		"--graceful-shutdown-timeout: must not be negative",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q\nwant it to contain %q", err, want)
		}
	}
}

func TestValidateAcceptsDisabledServers(t *testing.T) {
	t.Parallel()
	o := DefaultOptions()
	o.MetricsAddr, o.ProbeAddr = "0", "0"
	if err := o.Validate(); err != nil {
		t.Fatalf("Validate() = %v, want nil for disabled servers", err)
	}
}

func TestMainRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--policy-concurrency=0"}, 2, "--policy-concurrency: must be between 1 and 64"},
		{[]string{"--no-such-flag"}, 2, "flag provided but not defined: -no-such-flag"},
		{[]string{"extra"}, 2, `unexpected arguments ["extra"]`},
		{[]string{"-h"}, 0, "-leader-elect"},
	} {
		var stderr bytes.Buffer
		if got := Main(context.Background(), tc.args, &stderr); got != tc.code {
			t.Errorf("Main(%q) = %d, want %d (stderr: %s)", tc.args, got, tc.code, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.out) {
			t.Errorf("Main(%q) wrote %q, want it to contain %q", tc.args, stderr.String(), tc.out)
		}
	}
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	Main(context.Background(), []string{"-h"}, &stderr)
	for _, flag := range []string{
		"metrics-bind-address", "metrics-secure", "metrics-cert-dir", "health-probe-bind-address", "enable-http2",
		"leader-elect", "leader-election-id", "leader-election-namespace", "leader-election-lease-duration",
		"leader-election-renew-deadline", "leader-election-retry-period", "policy-concurrency",
		"graceful-shutdown-timeout", "kubeconfig", "zap-log-level", "ratelimit-service-tls", "ratelimit-gateways",
	} {
		if !strings.Contains(stderr.String(), "-"+flag) {
			t.Errorf("-h does not document --%s", flag)
		}
	}
}

func TestValidateWebhookOptions(t *testing.T) {
	t.Parallel()
	o := DefaultOptions()
	o.Webhook = WebhookOptions{Namespace: "Bad_NS", Port: 70000, CertMode: "manual", ServiceName: "svc"}
	err := o.Validate()
	if err == nil {
		t.Fatal("Validate() = nil, want errors")
	}
	for _, want := range []string{
		`--namespace: a lowercase RFC 1123 label`,
		"--sidecar-image: must not be empty",
		"--webhook-port: must be between 1 and 65535, got 70000",
		"--webhook-cert-dir: must not be empty",
		`--webhook-cert-mode: must be self-managed or external, got "manual"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q\nwant it to contain %q", err, want)
		}
	}
	o.Webhook = defaultWebhookOptions()
	o.Webhook.CertSecret = ""
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--webhook-cert-secret") {
		t.Errorf("Validate() = %v, want it to reject an empty --webhook-cert-secret in self-managed mode", err)
	}
	o.Webhook.CertMode = CertModeExternal
	if err := o.Validate(); err != nil {
		t.Errorf("Validate() = %v; external mode needs no Secret", err)
	}
}

// The central service's TLS flags: the gateway list is parsed whole and
// strictly, and each flag needs the one it refines.
func TestRateLimitServiceTLSFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--ratelimit-service-tls"}, 2, "--ratelimit-service-tls: only used with --ratelimit-service"},
		{[]string{"--ratelimit-service", "--ratelimit-gateways=shop/public"}, 2, "--ratelimit-gateways: only used with --ratelimit-service-tls"},
		{[]string{"--ratelimit-gateways=public"}, 2, `gateway "public": must be <namespace>/<name>`},
		{[]string{"--ratelimit-gateways=shop/public=Envoy"}, 2, `secret namespace "Envoy"`},
		{[]string{"--ratelimit-gateways=shop/public,shop/public=egw"}, 2, "gateway shop/public is listed twice"},
	} {
		var stderr bytes.Buffer
		if got := Main(context.Background(), tc.args, &stderr); got != tc.code {
			t.Errorf("Main(%q) = %d, want %d (stderr: %s)", tc.args, got, tc.code, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.out) {
			t.Errorf("Main(%q) wrote %q, want it to contain %q", tc.args, stderr.String(), tc.out)
		}
	}
	o := DefaultOptions()
	if err := o.RateLimitGateways.Set(" shop/public, bank/edge=envoy-gateway-system ,"); err != nil {
		t.Fatal(err)
	}
	if got, want := o.RateLimitGateways.String(), "shop/public,bank/edge=envoy-gateway-system"; got != want {
		t.Errorf("--ratelimit-gateways = %q, want %q", got, want)
	}
	o.RateLimitService, o.RateLimitServiceTLS = true, true
	if err := o.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
}
