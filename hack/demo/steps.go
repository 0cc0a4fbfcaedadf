package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/floodgate-dev/floodgate/test/kubetest"
)

const (
	operatorNS = "floodgate-system"
	demoNS     = "shop"
	podName    = "checkout-0"
	sidecarCtr = "floodgate-sidecar"
)

// demo holds what the steps share.
type demo struct {
	opts  options
	start time.Time
	work  string
	bin   string
	root  string

	env     *envtest.Environment
	cfg     *rest.Config
	kube    kubernetes.Interface
	kubectl *kubetest.Kubectl

	redisDir   string
	redisAddrs []string

	procs   []*proc
	manager *proc
	sidecar *proc

	backend      *http.Server
	backendAddr  string
	backendHits  atomic.Int64
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
		if _, err := run(ctx, root, "go", "build", "-o", d.bin+"/", "./cmd/floodgate-manager", "./cmd/floodgate-sidecar"); err != nil {
			return err
		}
		say("built floodgate-manager and floodgate-sidecar in %s", time.Since(t).Round(100*time.Millisecond))
	}
	return nil
}

func (d *demo) startControlPlane(ctx context.Context) error {
	d.env = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(d.root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(d.root, "config", "webhook")},
		},
	}
	cfg, err := d.env.Start()
	if err != nil {
		return fmt.Errorf("starting envtest: %w", err)
	}
	d.cfg = cfg
	if d.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if d.kubectl, err = kubetest.NewKubectl(d.env, filepath.Join(d.work, "run")); err != nil {
		return err
	}
	v, err := d.kube.Discovery().ServerVersion()
	if err != nil {
		return err
	}
	say("kube-apiserver %s at %s", v.GitVersion, cfg.Host)
	say("kubectl: %s --kubeconfig %s", d.kubectl.Path, d.kubectl.Kubeconfig)
	out, err := d.kubectl.Run(ctx, "get", "crd", "-o", "name")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(out, "\n") {
		say("installed %s", l)
	}
	wh := d.env.WebhookInstallOptions
	say("webhooks registered, served at https://%s:%d with a CA in %s", wh.LocalServingHost, wh.LocalServingPort, wh.LocalServingCertDir)
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
	for _, ns := range []string{operatorNS, demoNS} {
		if _, err := d.kubectl.Run(ctx, "create", "namespace", ns); err != nil {
			return err
		}
	}
	probe, err := freeAddr()
	if err != nil {
		return err
	}
	met, err := freeAddr()
	if err != nil {
		return err
	}
	d.managerProbe, d.managerMet = probe, met
	wh := d.env.WebhookInstallOptions
	args := []string{
		"--kubeconfig", d.kubectl.Kubeconfig,
		"--namespace", operatorNS,
		"--health-probe-bind-address", probe,
		"--metrics-bind-address", met,
		"--metrics-secure=false",
		"--webhook-port", strconv.Itoa(wh.LocalServingPort),
		"--webhook-cert-dir", wh.LocalServingCertDir,
		"--webhook-cert-mode", "external",
		"--sidecar-image", "floodgate-sidecar:dev",
		"--zap-log-level", "info",
	}
	p, err := d.startProc("floodgate-manager", nil, filepath.Join(d.bin, "floodgate-manager"), args...)
	if err != nil {
		return err
	}
	d.manager = p
	if err := waitHTTP(ctx, "http://"+probe+"/readyz", p, 60*time.Second); err != nil {
		return err
	}
	say("floodgate-manager ready (probes http://%s, metrics http://%s/metrics, log %s)", probe, met, p.log)
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
	if err := poll(ctx, 200*time.Millisecond, 60*time.Second, "CounterStore default Ready", func() (bool, error) {
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
	path := filepath.Join(d.work, "run", name)
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		return err
	}
	out, err := d.kubectl.Run(ctx, "apply", "-f", path)
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
	sc := sidecarContainer(p)
	if sc == nil {
		return fmt.Errorf("the webhook did not inject %s; pod containers: %v", sidecarCtr, lines)
	}
	lines = append(lines, "sidecar args: "+strings.Join(sc.Args, " "))
	show("$ kubectl -n shop get pod checkout-0  (as admitted)", strings.Join(lines, "\n"))

	// Admitting the same pod again adds no second sidecar.
	return nil
}

func sidecarContainer(p *corev1.Pod) *corev1.Container {
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == sidecarCtr {
			return &p.Spec.Containers[i]
		}
	}
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == sidecarCtr {
			return &p.Spec.InitContainers[i]
		}
	}
	return nil
}

func (d *demo) startSidecar(ctx context.Context) error {
	pod, err := d.kube.CoreV1().Pods(demoNS).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	sc := sidecarContainer(pod)
	if sc == nil {
		return fmt.Errorf("no %s container", sidecarCtr)
	}
	// The sample backend plays the app container.
	if err := d.startBackend(); err != nil {
		return err
	}
	env, err := d.resolveEnv(ctx, pod, sc)
	if err != nil {
		return err
	}
	// The pod's files: the downward-API labels file.
	podinfo := filepath.Join(d.work, "run", "podinfo")
	if err := os.MkdirAll(podinfo, 0o755); err != nil {
		return err
	}
	var lbl []string
	for k, v := range pod.Labels {
		lbl = append(lbl, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(lbl)
	if err := os.WriteFile(filepath.Join(podinfo, "labels"), []byte(strings.Join(lbl, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	listen, err := freeAddr()
	if err != nil {
		return err
	}
	admin, err := freeAddr()
	if err != nil {
		return err
	}
	d.sidecarURL, d.sidecarAdmin = "http://"+listen, "http://"+admin
	// The injected arguments, then what differs on this machine: there is
	// no pod network namespace, so the ports move to free loopback ones,
	// the "app" is the sample backend, and the API server is reached with
	// a kubeconfig instead of the in-cluster service account.
	args := append([]string{}, sc.Args...)
	args = append(args,
		"--listen", listen,
		"--admin-listen", admin,
		"--upstream", "http://"+d.backendAddr,
		"--kubeconfig", d.kubectl.Kubeconfig,
		"--pod-labels-file", filepath.Join(podinfo, "labels"),
	)
	p, err := d.startProc("floodgate-sidecar", env, filepath.Join(d.bin, "floodgate-sidecar"), args...)
	if err != nil {
		return err
	}
	d.sidecar = p
	if err := waitHTTP(ctx, d.sidecarAdmin+"/readyz", p, 30*time.Second); err != nil {
		return err
	}
	say("sidecar serving %s -> app %s (admin %s, log %s)", d.sidecarURL, d.backendAddr, d.sidecarAdmin, p.log)

	// The sidecar reports the revision it loaded as a pod condition; the
	// kubelet would then mark the pod Ready. The demo plays the kubelet.
	var loaded string
	if err := poll(ctx, 100*time.Millisecond, 30*time.Second, "pod condition floodgate.dev/policy-loaded", func() (bool, error) {
		p, err := d.kube.CoreV1().Pods(demoNS).Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == "floodgate.dev/policy-loaded" && c.Status == corev1.ConditionTrue {
				loaded = c.Message
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	say("pod condition floodgate.dev/policy-loaded=True (%s)", loaded)
	if err := d.markPodReady(ctx); err != nil {
		return err
	}
	if err := poll(ctx, 200*time.Millisecond, 30*time.Second, "policy Programmed", func() (bool, error) {
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

// resolveEnv turns the injected container's env into plain values, as the
// kubelet would: downward-API fields and Secret keys.
func (d *demo) resolveEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container) ([]string, error) {
	var env []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil:
			var v string
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = pod.Name
			case "metadata.namespace":
				v = pod.Namespace
			case "status.podIP":
				v = "127.0.0.1"
			case "spec.serviceAccountName":
				v = pod.Spec.ServiceAccountName
			default:
				continue
			}
			env = append(env, e.Name+"="+v)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, err := d.kube.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err != nil {
				if ref.Optional != nil && *ref.Optional {
					continue
				}
				return nil, fmt.Errorf("env %s from secret %s: %w", e.Name, ref.Name, err)
			}
			env = append(env, e.Name+"="+string(s.Data[ref.Key]))
		}
	}
	return env, nil
}

func (d *demo) markPodReady(ctx context.Context) error {
	now := metav1.Now()
	patch := map[string]any{
		"status": map[string]any{
			"phase":  "Running",
			"podIP":  "127.0.0.1",
			"podIPs": []map[string]string{{"ip": "127.0.0.1"}},
			"conditions": []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			},
		},
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = d.kube.CoreV1().Pods(demoNS).Patch(ctx, podName, types.StrategicMergePatchType, data, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("marking the pod ready: %w", err)
	}
	say("pod marked Running and Ready (the demo plays the kubelet)")
	return nil
}

func (d *demo) cleanup() {
	if d.backend != nil {
		_ = d.backend.Close()
	}
	for i := len(d.procs) - 1; i >= 0; i-- {
		d.procs[i].stop(10 * time.Second)
	}
	if d.redisDir != "" {
		_, _ = run(context.Background(), d.root, "hack/redis-cluster.sh", "stop", "--dir", d.redisDir)
	}
	if d.env != nil {
		_ = d.env.Stop()
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
