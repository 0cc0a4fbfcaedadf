// Package app is floodgate-manager's composition root: it turns the
// validated Options into a controller-runtime Manager with the metrics and
// probe servers, leader election, a cache sized for what the controllers
// read, and every component (controller or webhook) registered.
//
// To add a component, append it to components: its setup function gets the
// manager and the options, and is called once before the manager starts.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kubeconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/controllers/gatewayconfig"
	"github.com/floodgate-dev/floodgate/controllers/metricsauth"
	"github.com/floodgate-dev/floodgate/controllers/podlimits"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/controllers/ratelimitservice"
	"github.com/floodgate-dev/floodgate/controllers/rlsidentity"
	"github.com/floodgate-dev/floodgate/controllers/sidecaraccess"
	"github.com/floodgate-dev/floodgate/controllers/usage"
)

// Name is the binary's name, also the Event reporter's.
const Name = "floodgate-manager"

// component is one controller or webhook run by the manager.
type component struct {
	name  string
	setup func(ctx context.Context, mgr ctrl.Manager, o *Options) error
}

// components are the manager's controllers and webhooks, set up in order.
var components = []component{
	{name: policy.ControllerName, setup: setupPolicy},
	{name: policy.ClusterControllerName, setup: func(_ context.Context, mgr ctrl.Manager, _ *Options) error {
		return (&policy.ClusterReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr)
	}},
	{name: podlimits.ControllerName, setup: func(_ context.Context, mgr ctrl.Manager, _ *Options) error {
		return (&podlimits.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder(Name)}).SetupWithManager(mgr)
	}},
	{name: counterstore.ControllerName, setup: func(ctx context.Context, mgr ctrl.Manager, o *Options) error {
		return counterstore.Setup(ctx, mgr, storeMetrics(), counterstore.Options{Namespace: o.Webhook.Namespace}, controller.Options{})
	}},
	{name: "webhook certificate", setup: setupWebhookCert},
	{name: "webhooks", setup: setupWebhooks},
	{name: sidecaraccess.ControllerName, setup: setupSidecarAccess},
	{name: ratelimitservice.ControllerName, setup: setupRateLimitService},
	{name: "rate-limit service identity", setup: setupRateLimitIdentity},
}

// storeMetrics are the CounterStore metrics, registered on
// controller-runtime's registry, which the manager's metrics endpoint
// serves. That registry is the process's, so they are registered once per
// process, however many managers it builds (the tests build several).
var storeMetrics = sync.OnceValue(func() *counterstore.Metrics { return counterstore.NewMetrics(crmetrics.Registry) })

func setupPolicy(ctx context.Context, mgr ctrl.Manager, o *Options) error {
	r := &policy.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(Name)}
	if o.UsageInterval > 0 {
		c := usage.New(mgr.GetClient(), usage.Options{Interval: o.UsageInterval, Window: o.UsageWindow})
		if err := mgr.Add(c); err != nil {
			return fmt.Errorf("add the usage collector: %w", err)
		}
		r.Usage = c
	}
	return r.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: o.PolicyConcurrency})
}

// setupRateLimitService runs the central rate-limit service's controller
// when --ratelimit-service is set.
func setupRateLimitService(_ context.Context, mgr ctrl.Manager, o *Options) error {
	if !o.RateLimitService {
		return nil
	}
	r := &ratelimitservice.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(Name),
		Namespace: o.Webhook.Namespace,
		Service: gatewayconfig.Service{
			Name: o.RateLimitServiceName, Namespace: o.Webhook.Namespace, Port: int32(o.RateLimitServicePort),
			TLS: o.RateLimitServiceTLS,
		},
		Apply: ratelimitservice.GatewayApply{Enabled: o.ApplyGatewayConfig, Classes: o.ApplyGatewayClasses},
	}
	return r.SetupWithManager(mgr, controller.Options{MaxConcurrentReconciles: 1})
}

// setupRateLimitIdentity keeps the central rate-limit service's
// certificates when --ratelimit-service-tls is set (package rlsidentity).
func setupRateLimitIdentity(_ context.Context, mgr ctrl.Manager, o *Options) error {
	if !o.RateLimitService || !o.RateLimitServiceTLS {
		return nil
	}
	m, err := rlsidentity.New(rlsidentity.Options{
		Client:             mgr.GetClient(),
		Reader:             mgr.GetAPIReader(),
		Namespace:          o.Webhook.Namespace,
		ServiceName:        o.RateLimitServiceName,
		Gateways:           o.RateLimitGateways,
		OwnerWebhookConfig: o.Webhook.MutatingConfig,
		Log:                ctrl.Log.WithName("rlsidentity"),
	})
	if err != nil {
		return err
	}
	return mgr.Add(m)
}

// Main runs the manager with the command line args, and returns the exit
// status: 0 after a clean stop, 1 when the manager fails, 2 for bad flags.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	o := DefaultOptions()
	fs := flag.NewFlagSet(Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", Name, fs.Args())
		return 2
	}
	namespaceSet := false
	fs.Visit(func(f *flag.Flag) { namespaceSet = namespaceSet || f.Name == "namespace" })
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" && !namespaceSet {
		o.Webhook.Namespace = ns
	}
	if err := o.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "%s: invalid flags:\n%v\n", Name, err)
		return 2
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.Zap)))
	log := ctrl.Log.WithName("setup")

	cfg, err := restConfig(o.Kubeconfig)
	if err != nil {
		log.Error(err, "loading the kubeconfig")
		return 1
	}
	if err := Run(ctx, cfg, o); err != nil {
		log.Error(err, "manager stopped")
		return 1
	}
	return 0
}

// restConfig loads the API server configuration from path, or from the
// usual places when path is empty.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		return kubeconfig.GetConfig()
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// NewScheme returns the scheme of every type the manager reads or writes.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add client-go types to the scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add %s to the scheme: %w", v1alpha1.GroupVersion, err)
	}
	if err := gatewayv1.Install(s); err != nil {
		return nil, fmt.Errorf("add %s to the scheme: %w", gatewayv1.GroupVersion, err)
	}
	return s, nil
}

// NewManager builds the manager and sets up every component, without
// starting it.
func NewManager(ctx context.Context, cfg *rest.Config, o Options) (ctrl.Manager, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}

	var tlsOpts []func(*tls.Config)
	if !o.EnableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	metrics := metricsserver.Options{
		BindAddress:   o.MetricsAddr,
		SecureServing: o.SecureMetrics,
		CertDir:       o.MetricsCertDir,
		TLSOpts:       tlsOpts,
	}
	if o.SecureMetrics {
		metrics.FilterProvider = metricsauth.Provider(metricsauth.Options{})
	}

	graceful := o.GracefulShutdown
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metrics,
		HealthProbeBindAddress:        o.ProbeAddr,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              o.LeaderElectionID,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.LeaseDuration,
		RenewDeadline:                 &o.RenewDeadline,
		RetryPeriod:                   &o.RetryPeriod,
		GracefulShutdownTimeout:       &graceful,
		Cache:                         CacheOptions(o.Webhook.Namespace),
		WebhookServer:                 webhookServer(&o),
		Controller:                    ctrlconfig.Controller{SkipNameValidation: &o.skipNameValidation},
	})
	if err != nil {
		return nil, fmt.Errorf("create the manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("informers", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("informers not synced")
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("add the readiness check: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhooks", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return nil, fmt.Errorf("add the webhook readiness check: %w", err)
	}
	for _, c := range components {
		if err := c.setup(ctx, mgr, &o); err != nil {
			return nil, fmt.Errorf("set up %s: %w", c.name, err)
		}
	}
	return mgr, nil
}

// CacheOptions keeps the cache to what the controllers need, and to what
// the manager's RBAC lets it watch: ConfigMaps only with the policy
// controller's label; Secrets, StatefulSets, Services,
// PodDisruptionBudgets and NetworkPolicies only in the manager's own
// namespace (managerNamespace), where the managed stores and the webhook
// certificate live; no managedFields on any object. A component that needs
// other ConfigMaps adds its own label selector here.
func CacheOptions(managerNamespace string) cache.Options {
	own := cache.ByObject{Namespaces: map[string]cache.Config{managerNamespace: {}}}
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {
				Label: labels.SelectorFromSet(labels.Set{policy.ManagedByLabel: policy.ManagedByValue}),
			},
			&corev1.Secret{}:                {Namespaces: own.Namespaces},
			&corev1.Service{}:               {Namespaces: own.Namespaces},
			&appsv1.StatefulSet{}:           {Namespaces: own.Namespaces},
			&policyv1.PodDisruptionBudget{}: {Namespaces: own.Namespaces},
			&networkingv1.NetworkPolicy{}:   {Namespaces: own.Namespaces},
		},
	}
}

// Run builds the manager and runs it until ctx is done.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	mgr, err := NewManager(ctx, cfg, o)
	if err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("starting", "metrics", o.MetricsAddr, "probes", o.ProbeAddr, "leaderElection", o.LeaderElect)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run the manager: %w", err)
	}
	return nil
}
