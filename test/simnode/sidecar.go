package simnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// InjectedSidecar returns the floodgate-sidecar container the injection
// webhook added to pod. It is an error when there is none, or more than
// one, among the containers and init containers.
func InjectedSidecar(pod *corev1.Pod) (*corev1.Container, error) {
	var found []*corev1.Container
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == config.ContainerName {
				found = append(found, &list[i])
			}
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("pod %s/%s has no %s container: the webhook did not inject it", pod.Namespace, pod.Name, config.ContainerName)
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("pod %s/%s has %d %s containers, want exactly one", pod.Namespace, pod.Name, len(found), config.ContainerName)
}

// PodIP is the address this node gives a pod: a loopback address of its
// own, derived from its uid (127.0.0.1 is never one), so that each pod's
// sidecar can serve its admin port at the pod IP and the port the webhook
// chose, as in a cluster, where floodgate-manager reads it.
func PodIP(pod *corev1.Pod) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(pod.UID))
	n := h.Sum32()
	return fmt.Sprintf("127.%d.%d.%d", 1+n%254, (n>>8)%256, 1+(n>>16)%254)
}

// adminPort returns the sidecar's admin port as injected.
func adminPort(sc *corev1.Container) (int32, bool) {
	for _, p := range sc.Ports {
		if p.Name == injection.AdminPortName {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// ResolveEnv turns a container's env into plain NAME=value pairs, as the
// kubelet would: literal values, the downward-API fields the injector uses
// (the pod IP is the pod's loopback address, PodIP) and Secret keys. A missing Secret is an
// error unless the reference is optional.
func (s *Stack) ResolveEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container) ([]string, error) {
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
			case "metadata.uid":
				v = string(pod.UID)
			case "status.podIP":
				v = PodIP(pod)
			case "spec.serviceAccountName":
				v = pod.Spec.ServiceAccountName
			case "spec.nodeName":
				v = "localhost"
			default:
				return nil, fmt.Errorf("env %s: downward-API field %s is not resolved locally", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env = append(env, e.Name+"="+v)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			sec, err := s.Kube.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err != nil {
				if ref.Optional != nil && *ref.Optional {
					continue
				}
				return nil, fmt.Errorf("env %s from secret %s/%s: %w", e.Name, pod.Namespace, ref.Name, err)
			}
			v, ok := sec.Data[ref.Key]
			if !ok && (ref.Optional == nil || !*ref.Optional) {
				return nil, fmt.Errorf("env %s: secret %s/%s has no key %q", e.Name, pod.Namespace, ref.Name, ref.Key)
			}
			env = append(env, e.Name+"="+string(v))
		default:
			return nil, fmt.Errorf("env %s: unsupported valueFrom", e.Name)
		}
	}
	return env, nil
}

// SidecarOptions say which pod's injected sidecar to run and in front of
// what.
type SidecarOptions struct {
	// Namespace and Pod name the annotated pod. Required.
	Namespace, Pod string
	// Upstream is the app's URL, e.g. a Backend's URL. Required.
	Upstream string
	// Name names the process and its log (default
	// "floodgate-sidecar-<namespace>-<pod>").
	Name string
	// ReadyTimeout bounds the wait for the store password Secret and for
	// /readyz (default 30s).
	ReadyTimeout time.Duration
	// Args are more flags, after the injected ones and the local
	// overrides (later flags win).
	Args []string
}

// Sidecar is an injected floodgate-sidecar running as a local process.
type Sidecar struct {
	// Proc is the process.
	Proc *Process
	// URL is where it proxies (http://127.0.0.1:port).
	URL string
	// AdminURL serves /metrics, /readyz, /usage and /debug/config, at
	// the pod's IP (PodIP) and the injected admin port.
	AdminURL string
	// Injected is the container as the webhook injected it.
	Injected corev1.Container
	// Args are the arguments it runs with: the injected ones, then the
	// local overrides.
	Args []string
	// Env is the resolved injected environment it runs with.
	Env []string
}

// StartSidecar runs the sidecar injected into o.Pod as a local process:
// it resolves the injected env, writes the downward-API labels file and the
// store password file (waiting for the Secret the manager mirrors), starts
// the binary with the injected args plus overrides for the addresses (a
// free loopback port for the proxy, the pod's IP and injected port for the
// admin server, o.Upstream, a kubeconfig, the labels and password files),
// and waits until /readyz answers.
func (s *Stack) StartSidecar(ctx context.Context, o SidecarOptions) (*Sidecar, error) {
	if o.Namespace == "" || o.Pod == "" || o.Upstream == "" {
		return nil, fmt.Errorf("simnode: SidecarOptions need Namespace, Pod and Upstream, got %+v", o)
	}
	if o.Name == "" {
		o.Name = "floodgate-sidecar-" + o.Namespace + "-" + o.Pod
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	pod, err := s.Kube.CoreV1().Pods(o.Namespace).Get(ctx, o.Pod, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading pod %s/%s: %w", o.Namespace, o.Pod, err)
	}
	sc, err := InjectedSidecar(pod)
	if err != nil {
		return nil, err
	}
	if len(sc.Command) > 1 {
		return nil, fmt.Errorf("injected command %q: only the floodgate-sidecar binary itself runs locally", sc.Command)
	}
	var env []string
	var password string
	var lastErr error
	if err := Poll(ctx, 100*time.Millisecond, o.ReadyTimeout, "the sidecar's env and store password Secret to resolve", func() (bool, error) {
		if env, lastErr = s.ResolveEnv(ctx, pod, sc); lastErr == nil {
			password, lastErr = s.writeStoreAuth(ctx, pod, sc)
		}
		return lastErr == nil, nil
	}); err != nil {
		return nil, errors.Join(err, lastErr)
	}
	labels, err := s.writeLabels(pod)
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(s.opts.Bin, "floodgate-sidecar")
	// A free port can be taken by another process before the sidecar
	// binds it; the sidecar then exits at once, and gets other ports.
	port, ok := adminPort(sc)
	if !ok {
		return nil, fmt.Errorf("pod %s/%s: the injected sidecar has no %s port", pod.Namespace, pod.Name, injection.AdminPortName)
	}
	admin := net.JoinHostPort(PodIP(pod), strconv.Itoa(int(port)))
	for attempt := 1; ; attempt++ {
		side, err := s.startSidecarOnce(ctx, o, bin, sc, env, labels, password, admin)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return side, err
		}
	}
}

func (s *Stack) startSidecarOnce(ctx context.Context, o SidecarOptions, bin string, sc *corev1.Container, env []string, labels, password, admin string) (*Sidecar, error) {
	listen, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	// The pod's state emptyDir: a directory per sidecar that outlives a
	// restart of its process, as the emptyDir outlives a container restart.
	state := filepath.Join(s.opts.Work, "state", o.Name)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", state, err)
	}
	// Later flags win, so the overrides follow the injected arguments.
	args := append(append([]string{}, sc.Args...),
		"--listen", listen,
		"--admin-listen", admin,
		"--upstream", o.Upstream,
		"--kubeconfig", s.Kubectl.Kubeconfig,
		"--pod-labels-file", labels,
		"--state-dir", state,
	)
	if password != "" {
		args = append(args, "--redis-password-file", password,
			"--redis-username-file", filepath.Join(filepath.Dir(password), config.StoreAuthUserKey))
	}
	args = append(args, o.Args...)
	p, err := s.StartProcess(o.Name, env, bin, args...)
	if err != nil {
		return nil, err
	}
	side := &Sidecar{Proc: p, URL: "http://" + listen, AdminURL: "http://" + admin, Injected: *sc.DeepCopy(), Args: args, Env: env}
	if err := WaitHTTP(ctx, side.AdminURL+"/readyz", p, o.ReadyTimeout); err != nil {
		p.Stop(5 * time.Second)
		return nil, err
	}
	return side, nil
}

// writeLabels writes the pod's downward-API labels file, one key="value"
// per line, and returns its path.
func (s *Stack) writeLabels(pod *corev1.Pod) (string, error) {
	dir := filepath.Join(s.opts.Work, "podinfo", pod.Namespace, pod.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	var lines []string
	for k, v := range pod.Labels {
		lines = append(lines, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(lines)
	path := filepath.Join(dir, "labels")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return path, nil
}

// writeStoreAuth plays the kubelet for the injected store password volume:
// it writes the Secret's key into a local file and returns its path, or ""
// when the sidecar mounts no such volume. It is an error while the Secret
// or its key is missing: the kubelet would leave the optional volume empty,
// but a sidecar started before the manager has mirrored the password would
// make the first decisions fail over, which tests and the demo do not want.
func (s *Stack) writeStoreAuth(ctx context.Context, pod *corev1.Pod, c *corev1.Container) (string, error) {
	var vol *corev1.Volume
	for _, m := range c.VolumeMounts {
		if m.Name != injection.StoreAuthVolume {
			continue
		}
		for i := range pod.Spec.Volumes {
			if pod.Spec.Volumes[i].Name == m.Name && pod.Spec.Volumes[i].Secret != nil {
				vol = &pod.Spec.Volumes[i]
			}
		}
	}
	if vol == nil {
		return "", nil
	}
	sec, err := s.Kube.CoreV1().Secrets(pod.Namespace).Get(ctx, vol.Secret.SecretName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("volume %s from secret %s/%s: %w", vol.Name, pod.Namespace, vol.Secret.SecretName, err)
	}
	v, ok := sec.Data[config.StoreAuthKey]
	if !ok {
		return "", fmt.Errorf("volume %s: secret %s/%s has no key %q", vol.Name, pod.Namespace, vol.Secret.SecretName, config.StoreAuthKey)
	}
	dir := filepath.Join(s.opts.Work, "store-auth", pod.Namespace, pod.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	path := filepath.Join(dir, config.StoreAuthKey)
	if err := os.WriteFile(path, v, 0o600); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	// The user, when the store has one for the sidecars, sits beside it;
	// without it the sidecar authenticates as the default user.
	if u, ok := sec.Data[config.StoreAuthUserKey]; ok {
		if err := os.WriteFile(filepath.Join(dir, config.StoreAuthUserKey), u, 0o600); err != nil {
			return "", fmt.Errorf("writing the store user: %w", err)
		}
	}
	return path, nil
}

// Revision returns the revision of the config the sidecar has in force,
// from its /debug/config.
func (sc *Sidecar) Revision(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, sc.AdminURL+"/debug/config", nil)
	if err != nil {
		return "", err
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", req.URL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var st struct {
		Revision string `json:"revision"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return "", fmt.Errorf("decoding %s: %w", req.URL, err)
	}
	return st.Revision, nil
}

// Metric returns the sum of the sidecar's samples of the metric name whose
// labels include every label in match.
func (sc *Sidecar) Metric(ctx context.Context, name string, match map[string]string) (float64, error) {
	return MetricSum(ctx, sc.AdminURL+"/metrics", name, match)
}

// PolicyLoaded returns the sidecar's floodgate.dev/policy-loaded condition
// on a pod, or nil when it has not reported one.
func (s *Stack) PolicyLoaded(ctx context.Context, namespace, name string) (*corev1.PodCondition, error) {
	pod, err := s.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
	}
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == config.ConditionPolicyLoaded {
			return &pod.Status.Conditions[i], nil
		}
	}
	return nil, nil
}

// WaitPolicyLoaded waits until the pod's sidecar reports
// floodgate.dev/policy-loaded=True and returns the condition's message (the
// revision in force).
func (s *Stack) WaitPolicyLoaded(ctx context.Context, namespace, name string, timeout time.Duration) (string, error) {
	var msg string
	err := Poll(ctx, 100*time.Millisecond, timeout, "pod condition "+string(config.ConditionPolicyLoaded)+" on "+namespace+"/"+name, func() (bool, error) {
		c, err := s.PolicyLoaded(ctx, namespace, name)
		if err != nil || c == nil || c.Status != corev1.ConditionTrue {
			return false, err
		}
		msg = c.Message
		return true, nil
	})
	return msg, err
}

// MarkPodReady plays the kubelet once the containers run: the pod becomes
// Running at its PodIP with PodScheduled, ContainersReady and Ready true.
// The sidecar's own condition is left as it reported it.
func (s *Stack) MarkPodReady(ctx context.Context, namespace, name string) error {
	pod, err := s.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
	}
	ip := PodIP(pod)
	now := metav1.Now()
	patch := map[string]any{
		"status": map[string]any{
			"phase":  "Running",
			"podIP":  ip,
			"podIPs": []map[string]string{{"ip": ip}},
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
	if _, err := s.Kube.CoreV1().Pods(namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("marking pod %s/%s ready: %w", namespace, name, err)
	}
	return nil
}
