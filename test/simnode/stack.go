package simnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/floodgate-dev/floodgate/test/kubetest"
)

// Defaults of Options.
const (
	DefaultOperatorNamespace = "floodgate-system"
	DefaultSidecarImage      = "floodgate-sidecar:dev"
)

// Options configure a Stack.
type Options struct {
	// Root is the floodgate checkout: config/crd/bases and config/webhook
	// are read from it. Required.
	Root string
	// Work is the directory for logs, the kubeconfig, applied manifests and
	// the pods' files. Required; created when missing.
	Work string
	// Bin holds the floodgate-manager and floodgate-sidecar binaries (see
	// BuildBinaries). Required.
	Bin string
	// OperatorNamespace is the manager's namespace (default
	// DefaultOperatorNamespace).
	OperatorNamespace string
	// SidecarImage is the image the injection webhook writes into pods
	// (default DefaultSidecarImage). The local run never pulls it.
	SidecarImage string
}

// Validate reports every problem with o at once.
func (o Options) Validate() error {
	var errs []error
	for _, f := range []struct{ name, val string }{{"Root", o.Root}, {"Work", o.Work}, {"Bin", o.Bin}} {
		if f.val == "" {
			errs = append(errs, fmt.Errorf("simnode: Options.%s is required", f.name))
		}
	}
	if o.Root != "" {
		for _, d := range []string{"config/crd/bases", "config/webhook"} {
			if _, err := os.Stat(filepath.Join(o.Root, d)); err != nil {
				errs = append(errs, fmt.Errorf("simnode: Options.Root %s: %w", o.Root, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Stack is one local floodgate installation: a control plane, the manager
// and any number of sidecars. Create it with New, start it with
// StartControlPlane and StartManager, and always call Stop.
type Stack struct {
	opts Options

	// Env is the envtest environment; set by StartControlPlane.
	Env *envtest.Environment
	// Config reaches the API server as envtest's admin; set by
	// StartControlPlane.
	Config *rest.Config
	// Kube is a clientset for Config; set by StartControlPlane.
	Kube kubernetes.Interface
	// Kubectl runs the real kubectl as a system:masters user; set by
	// StartControlPlane.
	Kubectl *kubetest.Kubectl
	// CRDApply is what `kubectl apply -f config/crd/bases` printed.
	CRDApply string

	mu    sync.Mutex
	procs []*Process
}

// New checks o and creates the work directory.
func New(o Options) (*Stack, error) {
	if o.OperatorNamespace == "" {
		o.OperatorNamespace = DefaultOperatorNamespace
	}
	if o.SidecarImage == "" {
		o.SidecarImage = DefaultSidecarImage
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Work, 0o755); err != nil {
		return nil, fmt.Errorf("simnode: creating %s: %w", o.Work, err)
	}
	return &Stack{opts: o}, nil
}

// Work returns the work directory.
func (s *Stack) Work() string { return s.opts.Work }

// OperatorNamespace returns the manager's namespace.
func (s *Stack) OperatorNamespace() string { return s.opts.OperatorNamespace }

// StartControlPlane starts kube-apiserver and etcd with the webhook
// configurations of config/webhook pointed at a local serving address,
// then applies the CRDs of config/crd/bases with kubectl and waits until
// they are Established. KUBEBUILDER_ASSETS must name the envtest binaries.
func (s *Stack) StartControlPlane(ctx context.Context) error {
	s.Env = &envtest.Environment{
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(s.opts.Root, "config", "webhook")},
		},
	}
	cfg, err := s.Env.Start()
	if err != nil {
		return fmt.Errorf("starting envtest: %w", err)
	}
	s.Config = cfg
	if s.Kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("building a clientset: %w", err)
	}
	if s.Kubectl, err = kubetest.NewKubectl(s.Env, s.opts.Work); err != nil {
		return err
	}
	crds := filepath.Join(s.opts.Root, "config", "crd", "bases")
	if s.CRDApply, err = s.Kubectl.Run(ctx, "apply", "-f", crds); err != nil {
		return fmt.Errorf("applying the CRDs: %w", err)
	}
	if _, err := s.Kubectl.Run(ctx, "wait", "--for=condition=Established", "--timeout=60s", "-f", crds); err != nil {
		return fmt.Errorf("waiting for the CRDs: %w", err)
	}
	return nil
}

// WebhookServing returns the host, port and certificate directory where
// the registered webhooks expect their server.
func (s *Stack) WebhookServing() (host string, port int, certDir string) {
	w := s.Env.WebhookInstallOptions
	return w.LocalServingHost, w.LocalServingPort, w.LocalServingCertDir
}

// Manager is a running floodgate-manager.
type Manager struct {
	// Proc is the process.
	Proc *Process
	// ProbeAddr serves /healthz and /readyz.
	ProbeAddr string
	// MetricsAddr serves /metrics over plain HTTP.
	MetricsAddr string
}

// StartManager creates the operator namespace and starts floodgate-manager
// serving the webhooks on the address and certificate the control plane
// registered, and waits until it is ready.
func (s *Stack) StartManager(ctx context.Context) (*Manager, error) {
	if _, err := s.Kubectl.Run(ctx, "create", "namespace", s.opts.OperatorNamespace); err != nil {
		return nil, err
	}
	return s.startManager(ctx, "floodgate-manager", true)
}

// StartManagerReplica starts one more replica of floodgate-manager, as a
// Deployment of two or more runs it: the replicas elect a leader (every
// replica runs with --leader-elect). With webhooks, it serves the
// registered webhooks, which only one process on the machine can (the
// previous one must be gone); otherwise it serves them on a port of its
// own that nothing calls. name names its process and log.
func (s *Stack) StartManagerReplica(ctx context.Context, name string, webhooks bool) (*Manager, error) {
	return s.startManager(ctx, name, webhooks)
}

func (s *Stack) startManager(ctx context.Context, name string, registered bool) (*Manager, error) {
	// A free port can be taken by another process before the manager
	// binds it; the manager then exits at once, and gets other ports.
	for attempt := 1; ; attempt++ {
		m, err := s.startManagerOnce(ctx, name, registered)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return m, err
		}
	}
}

func (s *Stack) startManagerOnce(ctx context.Context, name string, registered bool) (*Manager, error) {
	probe, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	met, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	_, port, certDir := s.WebhookServing()
	if !registered {
		free, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		if _, p, err := net.SplitHostPort(free); err == nil {
			port, _ = strconv.Atoi(p)
		}
	}
	p, err := s.StartProcess(name, nil, filepath.Join(s.opts.Bin, "floodgate-manager"),
		"--kubeconfig", s.Kubectl.Kubeconfig,
		"--namespace", s.opts.OperatorNamespace,
		"--health-probe-bind-address", probe,
		"--metrics-bind-address", met,
		"--metrics-secure=false",
		"--webhook-port", strconv.Itoa(port),
		"--webhook-cert-dir", certDir,
		"--webhook-cert-mode", "external",
		"--sidecar-image", s.opts.SidecarImage,
		"--zap-log-level", "info",
		// As the Helm chart runs it: one replica leads at a time.
		"--leader-elect",
		"--leader-election-namespace", s.opts.OperatorNamespace,
	)
	if err != nil {
		return nil, err
	}
	if err := WaitHTTP(ctx, "http://"+probe+"/readyz", p, 60*time.Second); err != nil {
		p.Stop(5 * time.Second)
		return nil, err
	}
	return &Manager{Proc: p, ProbeAddr: probe, MetricsAddr: met}, nil
}

// StartProcess starts a process that Stop will stop, logging to
// WORK/<name>.log.
func (s *Stack) StartProcess(name string, env []string, bin string, args ...string) (*Process, error) {
	p, err := StartProcess(name, filepath.Join(s.opts.Work, name+".log"), env, bin, args...)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p, nil
}

// Apply writes doc to WORK/<name> and runs kubectl apply -f on it. It
// returns kubectl's output, which on failure is also in the error.
func (s *Stack) Apply(ctx context.Context, name, doc string) (string, error) {
	path := filepath.Join(s.opts.Work, name)
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return s.Kubectl.Run(ctx, "apply", "-f", path)
}

// Stop stops every process the stack started, newest first, each with a
// grace period, then the control plane.
func (s *Stack) Stop() error {
	s.mu.Lock()
	procs := s.procs
	s.procs = nil
	s.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(10 * time.Second)
	}
	if s.Env != nil {
		if err := s.Env.Stop(); err != nil {
			return fmt.Errorf("stopping envtest: %w", err)
		}
	}
	return nil
}
