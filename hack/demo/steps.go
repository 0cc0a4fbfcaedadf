package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/floodgate-dev/floodgate/test/kubetest"
	"github.com/floodgate-dev/floodgate/test/simnode"
)

const (
	operatorNS = "floodgate-system"
	demoNS     = "shop"
	podName    = "checkout-0"
)

// demo holds what the steps share.
type demo struct {
	opts  options
	start time.Time
	work  string
	bin   string
	root  string

	stack   *simnode.Stack
	kube    kubernetes.Interface
	kubectl *kubetest.Kubectl

	redisDir   string
	redisAddrs []string

	manager *simnode.Manager
	sidecar *simnode.Sidecar
	backend *simnode.Backend

	sidecarURL   string
	sidecarAdmin string
	managerProbe string
	managerMet   string
}

func (d *demo) prepare(ctx context.Context) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	d.root = root
	if _, err := run(ctx, root, "hack/redis-cluster.sh", "install"); err != nil {
		return err
	}
	assets, err := run(ctx, root, "hack/envtest-assets.sh")
	if err != nil {
		return err
	}
	if err := os.Setenv("KUBEBUILDER_ASSETS", assets); err != nil {
		return err
	}
	say("envtest binaries: %s", assets)
	d.bin = d.opts.bin
	if d.bin == "" {
		d.bin = filepath.Join(d.work, "bin")
		t := time.Now()
		if err := simnode.BuildBinaries(ctx, os.Stderr, root, d.bin); err != nil {
			return err
		}
		say("built floodgate-manager and floodgate-sidecar in %s", time.Since(t).Round(100*time.Millisecond))
	}
	return nil
}

func (d *demo) startControlPlane(ctx context.Context) error {
	stack, err := simnode.New(simnode.Options{
		Root: d.root, Work: filepath.Join(d.work, "run"), Bin: d.bin,
		OperatorNamespace: operatorNS, SidecarImage: "floodgate-sidecar:dev",
	})
	if err != nil {
		return err
	}
	d.stack = stack
	if err := stack.StartControlPlane(ctx); err != nil {
		return err
	}
	d.kube, d.kubectl = stack.Kube, stack.Kubectl
	v, err := d.kube.Discovery().ServerVersion()
	if err != nil {
		return err
	}
	say("kube-apiserver %s at %s", v.GitVersion, stack.Config.Host)
	say("kubectl: %s --kubeconfig %s", d.kubectl.Path, d.kubectl.Kubeconfig)
	out, err := d.kubectl.Run(ctx, "get", "crd", "-o", "name")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(out, "\n") {
		say("installed %s", l)
	}
	host, port, certDir := stack.WebhookServing()
	say("webhooks registered, served at https://%s:%d with a CA in %s", host, port, certDir)
	return nil
}

func (d *demo) startRedis(ctx context.Context) error {
	d.redisDir = filepath.Join(d.work, "run", "redis")
	out, err := run(ctx, d.root, "hack/redis-cluster.sh", "start", "--dir", d.redisDir,
		"--base-port", strconv.Itoa(d.opts.redisBasePort))
	if err != nil {
		return err
	}
	d.redisAddrs = strings.Split(out, ",")
	say("cluster_state:ok, all 16384 slots covered; seeds %s", out)
	status, err := run(ctx, d.root, "hack/redis-cluster.sh", "status", "--dir", d.redisDir)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(status, "\n") {
		say("%s", l)
	}
	return nil
}

func (d *demo) startManager(ctx context.Context) error {
	m, err := d.stack.StartManager(ctx)
	if err != nil {
		return err
	}
	d.manager = m
	d.managerProbe, d.managerMet = m.ProbeAddr, m.MetricsAddr
	if _, err := d.kubectl.Run(ctx, "create", "namespace", demoNS); err != nil {
		return err
	}
	say("floodgate-manager ready (probes http://%s, metrics http://%s/metrics, log %s)", m.ProbeAddr, m.MetricsAddr, m.Proc.Log)
	return nil
}

func (d *demo) applyPolicies(ctx context.Context) error {
	var addrs strings.Builder
	for _, a := range d.redisAddrs {
		fmt.Fprintf(&addrs, "      - %q\n", a)
	}
	store := fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: CounterStore
metadata:
  name: default
spec:
  external:
    addresses:
%s`, addrs.String())
	if err := d.apply(ctx, "counterstore.yaml", store); err != nil {
		return err
	}
	if err := simnode.Poll(ctx, 200*time.Millisecond, 60*time.Second, "CounterStore default Ready", func() (bool, error) {
		out, err := d.kubectl.Run(ctx, "get", "counterstore", "default", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", err
	}); err != nil {
		return err
	}
	out, err := d.kubectl.Run(ctx, "get", "counterstore", "-o", "wide")
	if err != nil {
		return err
	}
	show("$ kubectl get counterstore -o wide", out)
	if err := d.apply(ctx, "policy.yaml", policyYAML(5)); err != nil {
		return err
	}
	show("$ kubectl -n shop apply -f policy.yaml", policyYAML(5))
	return nil
}

// policyYAML is the demo's policy; perUser is the per-API-key limit, which
// the live edit changes.
func policyYAML(perUser int) string {
	return fmt.Sprintf(`apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: checkout
  namespace: shop
spec:
  podSelector:
    matchLabels: {app: checkout}
  rules:
  - name: per-api-key          # each API key: %[1]d requests per 10 s
    match:
      path: {type: Prefix, value: /api/}
    key:
    - header: X-API-Key
    limit: {requests: %[1]d, per: 10s, algorithm: TokenBucket}
    failureMode: Open          # store down: local bucket of limit/replicas
  - name: login-per-ip         # 3 login attempts per client IP per minute
    match:
      path: {type: Exact, value: /login}
      methods: [POST]
    key:
    - clientIP: {}
    limit: {requests: 3, per: 1m, algorithm: GCRA}
    failureMode: Closed        # store down: refuse logins
  - name: all-requests-shadow  # trial limit: counted and reported, never enforced
    key:
    - method: {}
    limit: {requests: 8, per: 1m, algorithm: FixedWindow}
    mode: Shadow
`, perUser)
}

func (d *demo) apply(ctx context.Context, name, doc string) error {
	out, err := d.stack.Apply(ctx, name, doc)
	if err != nil {
		return err
	}
	say("%s", out)
	return nil
}

func (d *demo) createPod(ctx context.Context) error {
	pod := `apiVersion: v1
kind: Pod
metadata:
  name: checkout-0
  namespace: shop
  labels: {app: checkout}
  annotations:
    floodgate.dev/inject: "true"
spec:
  containers:
  - name: app
    image: example.com/checkout:1.0
    ports:
    - {name: http, containerPort: 8080}
`
	if err := d.apply(ctx, "pod.yaml", pod); err != nil {
		return err
	}
	p, err := d.kube.CoreV1().Pods(demoNS).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var lines []string
	for _, c := range p.Spec.Containers {
		var ports []string
		for _, pt := range c.Ports {
			ports = append(ports, fmt.Sprintf("%s:%d", pt.Name, pt.ContainerPort))
		}
		lines = append(lines, fmt.Sprintf("container %-18s image %-28s ports %s", c.Name, c.Image, strings.Join(ports, ",")))
	}
	for _, g := range p.Spec.ReadinessGates {
		lines = append(lines, fmt.Sprintf("readiness gate %s", g.ConditionType))
	}
	sc, err := simnode.InjectedSidecar(p)
	if err != nil {
		return fmt.Errorf("%w; pod containers: %v", err, lines)
	}
	lines = append(lines, "sidecar args: "+strings.Join(sc.Args, " "))
	show("$ kubectl -n shop get pod checkout-0  (as admitted)", strings.Join(lines, "\n"))
	return nil
}

func (d *demo) startSidecar(ctx context.Context) error {
	// The sample backend plays the app container.
	b, err := simnode.StartBackend("checkout")
	if err != nil {
		return err
	}
	d.backend = b
	// The injected container runs with its arguments and environment;
	// what differs on this machine (no pod network namespace, so free
	// loopback ports, the sample backend as the app, and a kubeconfig
	// instead of the in-cluster service account) is overridden.
	sc, err := d.stack.StartSidecar(ctx, simnode.SidecarOptions{
		Namespace: demoNS, Pod: podName, Upstream: b.URL, Name: "floodgate-sidecar",
	})
	if err != nil {
		return err
	}
	d.sidecar = sc
	d.sidecarURL, d.sidecarAdmin = sc.URL, sc.AdminURL
	say("sidecar serving %s -> app %s (admin %s, log %s)", d.sidecarURL, b.Addr, d.sidecarAdmin, sc.Proc.Log)

	// The sidecar reports the revision it loaded as a pod condition; the
	// kubelet would then mark the pod Ready. The demo plays the kubelet.
	loaded, err := d.stack.WaitPolicyLoaded(ctx, demoNS, podName, 30*time.Second)
	if err != nil {
		return err
	}
	say("pod condition floodgate.dev/policy-loaded=True (%s)", loaded)
	if err := d.stack.MarkPodReady(ctx, demoNS, podName); err != nil {
		return err
	}
	say("pod marked Running and Ready (the demo plays the kubelet)")
	if err := simnode.Poll(ctx, 200*time.Millisecond, 30*time.Second, "policy Programmed", func() (bool, error) {
		out, err := d.kubectl.Run(ctx, "-n", demoNS, "get", "rlp", "checkout", "-o", `jsonpath={.status.conditions[?(@.type=="Programmed")].status}`)
		return out == "True", err
	}); err != nil {
		return err
	}
	out, err := d.kubectl.Run(ctx, "-n", demoNS, "get", "rlp")
	if err != nil {
		return err
	}
	show("$ kubectl -n shop get rlp", out)
	return nil
}

func (d *demo) cleanup() {
	if d.backend != nil {
		_ = d.backend.Close()
	}
	if d.stack != nil {
		if err := d.stack.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the control plane: %v\n", err)
		}
	}
	if d.redisDir != "" {
		_, _ = run(context.Background(), d.root, "hack/redis-cluster.sh", "stop", "--dir", d.redisDir)
	}
}

func say(format string, args ...any) {
	fmt.Printf("    "+format+"\n", args...)
}

func show(title, body string) {
	fmt.Printf("    %s\n", title)
	for _, l := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		fmt.Printf("      %s\n", l)
	}
}
