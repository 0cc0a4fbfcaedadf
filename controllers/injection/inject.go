// Package injection is floodgate-manager's sidecar injector: a mutating
// admission webhook for Pods, and the pure function, Inject, that builds
// the injected pod.
//
// # Opting in
//
// Only pods annotated floodgate.dev/inject: "true" reach the webhook (the
// webhook configuration's matchConditions), and never pods of kube-system,
// kube-public, kube-node-lease or the manager's own namespace (its
// namespaceSelector). The handler checks both again, so a configuration
// edited by hand cannot make it touch other pods.
//
// # The injected sidecar
//
// The sidecar is a native sidecar container named floodgate-sidecar: the
// first init container, with restartPolicy Always, so that it starts before
// the application and stops after it. It runs under the restricted Pod
// Security profile (non-root, read-only root file system, no capabilities,
// no privilege escalation, the RuntimeDefault seccomp profile) and proxies
// explicitly, without iptables. It gets the pod's name and namespace from
// the downward API, the pod's labels as the file
// /etc/floodgate/podinfo/labels, its own service account token (a
// projected volume, so it works even when the pod does not mount one), the
// store password as the file /etc/floodgate/store-auth/password from the
// Secret floodgate-store-auth that the manager mirrors into the namespace
// (an optional volume: the sidecar starts before the Secret exists and reads
// the file again for every new connection, so a rotated password needs no
// restart), and the Secrets and ConfigMaps that the
// namespace's policies reference for JWT verification, under
// compiler.MountDir.
//
// # Port takeover
//
// Services select a pod port by name or by number. The sidecar takes over
// the name: the application's port named, say, "http" is renamed
// "app-http" (its number does not change), and the sidecar declares a new
// port named "http" on its listen port and proxies to the application on
// 127.0.0.1. A Service with targetPort: http therefore sends its traffic
// through the sidecar with no change. A Service that targets the number
// (targetPort: 8080) still reaches the application directly, bypassing the
// sidecar: point it at the name, or at the sidecar's listen port. The
// application's probes and lifecycle hooks that named the port are
// rewritten to the new name, so they keep reaching the application.
//
// The port to protect is floodgate.dev/upstream-port (a port name or
// number) when set; otherwise the only TCP port the containers declare, or
// else the one named "http". The sidecar listens on
// floodgate.dev/listen-port when set, otherwise on DefaultListenPort (or
// the next free port). Its admin port, named fg-admin, is DefaultAdminPort
// unless the application uses it.
//
// # Resources
//
// The sidecar's resources default to Options.Resources and can be set per
// pod with the annotations floodgate.dev/sidecar-cpu-request,
// floodgate.dev/sidecar-cpu-limit, floodgate.dev/sidecar-memory-request and
// floodgate.dev/sidecar-memory-limit (Kubernetes quantities such as 100m or
// 128Mi). A limit set without its request lowers the default request to the
// limit when the default would exceed it.
//
// # Failure policy
//
// The webhook's failurePolicy is Fail. Only opted-in pods reach it, so an
// outage of the webhook delays only the pods that asked for a sidecar, and
// an opted-in pod never runs without one. An annotation that asks for
// something impossible (an unknown port name, a listen port that collides
// with an application port, a bad quantity) is rejected with a message
// that names the annotation.
//
// # Idempotency
//
// A pod that already has a container named floodgate-sidecar is returned
// unchanged, so a reinvocation of the webhook (reinvocationPolicy
// IfNeeded) or a second admission adds nothing.
package injection

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/floodgate-dev/floodgate/controllers/policy/compiler"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Annotations read by the injector.
const (
	// AnnotationInject opts a pod in when it is "true".
	AnnotationInject = "floodgate.dev/inject"
	// AnnotationUpstreamPort names the application port to protect, by
	// name or number.
	AnnotationUpstreamPort = "floodgate.dev/upstream-port"
	// AnnotationListenPort is the port number the sidecar listens on.
	AnnotationListenPort = "floodgate.dev/listen-port"
	// AnnotationUpstreamH2C, when "true", makes the sidecar speak HTTP/2
	// without TLS to the application (gRPC services).
	AnnotationUpstreamH2C = "floodgate.dev/upstream-h2c"
	// AnnotationCPURequest, AnnotationCPULimit, AnnotationMemoryRequest and
	// AnnotationMemoryLimit set the sidecar's resources.
	AnnotationCPURequest    = "floodgate.dev/sidecar-cpu-request"
	AnnotationCPULimit      = "floodgate.dev/sidecar-cpu-limit"
	AnnotationMemoryRequest = "floodgate.dev/sidecar-memory-request"
	AnnotationMemoryLimit   = "floodgate.dev/sidecar-memory-limit"
)

// Names of what the injector adds.
const (
	// AdminPortName names the sidecar's admin port (/metrics, /healthz,
	// /readyz, /debug/config).
	AdminPortName = "fg-admin"
	// UnnamedPortName names the sidecar's listen port when the
	// application's port has no name to take over.
	UnnamedPortName = "fg-proxy"
	// PodInfoVolume holds the downward API files.
	PodInfoVolume = "floodgate-podinfo"
	// APIAccessVolume is the sidecar's own service account token.
	APIAccessVolume = "floodgate-api-access"
	// ServiceAccountDir is where in-cluster clients read the token.
	ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	// StoreAuthSecret is the per-namespace copy of the store password,
	// under config.StoreAuthKey.
	StoreAuthSecret = "floodgate-store-auth"
	// StoreAuthVolume mounts StoreAuthSecret into the sidecar, optional,
	// at config.StoreAuthDir: the sidecar reads config.StoreAuthFile for every new
	// connection, so it starts before the manager has mirrored the
	// Secret and follows a rotated password without a restart.
	StoreAuthVolume = "floodgate-store-auth"
	// RenamedPortPrefix prefixes the application port whose name the
	// sidecar takes over.
	RenamedPortPrefix = "app-"
	// LabelInjected marks an injected pod with "true", so that monitoring
	// (the chart's PodMonitor) can select the pods that run a sidecar.
	LabelInjected = "floodgate.dev/injected"
)

// Defaults of Options.
const (
	DefaultListenPort = 15080
	DefaultAdminPort  = 9090
	// maxPortNameLength is the longest port name (an IANA service name).
	maxPortNameLength = 15
	// fallbackAdminPort is where the admin port goes when the
	// application uses DefaultAdminPort.
	fallbackAdminPort = 15090
	// DefaultRunAsUser is the distroless "nonroot" user the sidecar image
	// runs as.
	DefaultRunAsUser = 65532
	// tokenExpiration is the projected token's lifetime; the kubelet
	// refreshes it, and client-go rereads it.
	tokenExpiration = 3607
)

// Options configure the injected sidecar. They come from the manager's
// flags and are the same for every pod.
type Options struct {
	// Image is the sidecar image.
	Image string
	// ImagePullPolicy is the sidecar's pull policy; empty lets the API
	// server default it.
	ImagePullPolicy corev1.PullPolicy
	// Resources are the sidecar's default resources.
	Resources corev1.ResourceRequirements
	// RunAsUser is the sidecar's user and group.
	RunAsUser int64
}

// DefaultOptions returns the options for image with the default resources:
// 50m CPU and 64Mi memory requested, 256Mi memory limit, no CPU limit (a
// throttled proxy adds latency to every request).
func DefaultOptions(image string) Options {
	return Options{
		Image: image,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("50m"),
				corev1.ResourceMemory: resource.MustParse("64Mi"),
			},
			Limits: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("256Mi"),
			},
		},
		RunAsUser: DefaultRunAsUser,
	}
}

// Validate reports every problem with o.
func (o Options) Validate() error {
	var errs []error
	if o.Image == "" {
		errs = append(errs, errors.New("the sidecar image is empty"))
	}
	switch o.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("image pull policy %q is not Always, IfNotPresent or Never", o.ImagePullPolicy))
	}
	if o.RunAsUser <= 0 {
		errs = append(errs, fmt.Errorf("the sidecar must run as a non-root user, got uid %d", o.RunAsUser))
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := o.Resources.Requests[r]
		lim, hasLim := o.Resources.Limits[r]
		if hasReq && hasLim && req.Cmp(lim) > 0 {
			errs = append(errs, fmt.Errorf("the default %s request %s exceeds the limit %s", r, req.String(), lim.String()))
		}
	}
	return errors.Join(errs...)
}

// Mount is a Secret or ConfigMap that a policy of the pod's namespace
// references, mounted read-only into the sidecar at the path the compiled
// document names (compiler.SecretFile, compiler.ConfigMapFile).
type Mount struct {
	// Secret is true for a Secret, false for a ConfigMap.
	Secret bool
	// Name is the object's name.
	Name string
}

// Result says what Inject did.
type Result struct {
	// Injected is false when the pod is not opted in or already has the
	// sidecar.
	Injected bool
	// UpstreamPort is the application port the sidecar proxies to.
	UpstreamPort int32
	// ListenPort is the port the sidecar listens on.
	ListenPort int32
	// AdminPort is the sidecar's admin port.
	AdminPort int32
	// PortName is the name of the sidecar's listen port.
	PortName string
	// RenamedFrom and RenamedTo describe the application port whose name
	// the sidecar took over; empty when none was.
	RenamedFrom, RenamedTo string
}

// AnnotationError is a pod annotation that asks for something impossible.
type AnnotationError struct {
	// Annotation is the annotation's key; empty for a problem of the pod
	// as a whole.
	Annotation string
	// Value is the annotation's value.
	Value string
	// Reason says what is wrong.
	Reason string
}

// Error implements error.
func (e *AnnotationError) Error() string {
	if e.Annotation == "" {
		return e.Reason
	}
	return fmt.Sprintf("annotation %s: %q: %s", e.Annotation, e.Value, e.Reason)
}

// OptedIn reports whether pod asks for the sidecar.
func OptedIn(pod *corev1.Pod) bool { return pod.Annotations[AnnotationInject] == "true" }

// HasSidecar reports whether pod already has the sidecar container.
func HasSidecar(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.InitContainers, isSidecar) || slices.ContainsFunc(pod.Spec.Containers, isSidecar)
}

func isSidecar(c corev1.Container) bool { return c.Name == config.ContainerName }

// Inject returns a copy of pod with the sidecar injected, or pod itself
// when it is not opted in or already has the sidecar. mounts are the
// objects the namespace's policies reference. The error joins one
// *AnnotationError per problem. Inject is pure and does not modify pod.
func Inject(pod *corev1.Pod, mounts []Mount, o Options) (*corev1.Pod, Result, error) {
	if !OptedIn(pod) || HasSidecar(pod) {
		return pod, Result{}, nil
	}
	if err := o.Validate(); err != nil {
		return nil, Result{}, fmt.Errorf("injector options: %w", err)
	}
	out := pod.DeepCopy()
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	out.Labels[LabelInjected] = "true"
	// The sidecar's API access volume projects a service account token,
	// which the API server only accepts with a named service account. The
	// ServiceAccount admission plugin names "default" before webhooks run
	// on most clusters; where it is off, name it here, as it would.
	if out.Spec.ServiceAccountName == "" {
		out.Spec.ServiceAccountName = "default"
	}
	var errs []error
	bad := func(annotation, reason string, args ...any) {
		errs = append(errs, &AnnotationError{Annotation: annotation, Value: out.Annotations[annotation], Reason: fmt.Sprintf(reason, args...)})
	}

	resources := sidecarResources(out.Annotations, o.Resources, bad)
	up, upErr := upstreamPort(out)
	if upErr != nil {
		errs = append(errs, upErr)
	}
	used := usedPorts(out)
	listen := int32(DefaultListenPort)
	if v, ok := out.Annotations[AnnotationListenPort]; ok {
		n, err := parsePort(v)
		switch {
		case err != nil:
			bad(AnnotationListenPort, "%v", err)
		case used[n] != "":
			bad(AnnotationListenPort, "collides with %s; the sidecar needs a port no container uses", used[n])
		default:
			listen = n
		}
	} else {
		listen = freePort(used, DefaultListenPort)
	}
	h2c := false
	if v, ok := out.Annotations[AnnotationUpstreamH2C]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			bad(AnnotationUpstreamH2C, "must be true or false")
		}
		h2c = b
	}
	for _, v := range out.Spec.Volumes {
		if v.Name == PodInfoVolume || v.Name == APIAccessVolume || v.Name == StoreAuthVolume {
			errs = append(errs, &AnnotationError{Reason: fmt.Sprintf("the pod already has a volume named %q, which the floodgate sidecar needs", v.Name)})
		}
	}
	if len(errs) > 0 {
		return nil, Result{}, errors.Join(errs...)
	}

	used[listen] = "the sidecar's listen port"
	admin := int32(DefaultAdminPort)
	if used[admin] != "" {
		admin = freePort(used, fallbackAdminPort)
	}
	res := Result{Injected: true, UpstreamPort: up.number, ListenPort: listen, AdminPort: admin, PortName: UnnamedPortName}
	if up.name != "" {
		renamed, err := takeOver(out, up)
		if err != nil {
			return nil, Result{}, err
		}
		res.PortName, res.RenamedFrom, res.RenamedTo = up.name, up.name, renamed
	}
	if res.PortName == AdminPortName {
		return nil, Result{}, &AnnotationError{Reason: fmt.Sprintf("the application port is named %q, which the sidecar's admin port uses; rename it", AdminPortName)}
	}

	volumes, volumeMounts := sidecarVolumes(out, mounts)
	out.Spec.Volumes = append(out.Spec.Volumes, volumes...)
	c := sidecarContainer(o, res, h2c, resources, volumeMounts)
	out.Spec.InitContainers = append([]corev1.Container{c}, out.Spec.InitContainers...)
	if !slices.ContainsFunc(out.Spec.ReadinessGates, func(g corev1.PodReadinessGate) bool {
		return g.ConditionType == config.ConditionPolicyLoaded
	}) {
		out.Spec.ReadinessGates = append(out.Spec.ReadinessGates, corev1.PodReadinessGate{ConditionType: config.ConditionPolicyLoaded})
	}
	return out, res, nil
}

// portRef is the application port the sidecar protects.
type portRef struct {
	number int32
	name   string
	// container and index locate the declared port; container is -1 when
	// the port is not declared.
	container, index int
}

func (p portRef) String() string {
	if p.name == "" {
		return strconv.Itoa(int(p.number))
	}
	return fmt.Sprintf("%s/%d", p.name, p.number)
}

// upstreamPort picks the application port, as the package documents.
func upstreamPort(pod *corev1.Pod) (portRef, error) {
	var declared []portRef
	for ci, c := range pod.Spec.Containers {
		for pi, p := range c.Ports {
			if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
				declared = append(declared, portRef{number: p.ContainerPort, name: p.Name, container: ci, index: pi})
			}
		}
	}
	describe := func() string {
		s := make([]string, len(declared))
		for i, d := range declared {
			s[i] = pod.Spec.Containers[d.container].Name + ":" + d.String()
		}
		return strings.Join(s, ", ")
	}
	if v, ok := pod.Annotations[AnnotationUpstreamPort]; ok {
		bad := func(reason string) error {
			return &AnnotationError{Annotation: AnnotationUpstreamPort, Value: v, Reason: reason}
		}
		if v != "" && v[0] >= '0' && v[0] <= '9' {
			port, err := parsePort(v)
			if err != nil {
				return portRef{}, bad(err.Error())
			}
			for _, d := range declared {
				if d.number == port {
					return d, nil
				}
			}
			// Containers need not declare the ports they listen on.
			return portRef{number: port, container: -1}, nil
		}
		for _, d := range declared {
			if d.name == v {
				return d, nil
			}
		}
		if len(declared) == 0 {
			return portRef{}, bad("unknown port: no container declares a TCP port")
		}
		return portRef{}, bad(fmt.Sprintf("unknown port: no container declares a TCP port of that name; declared: %s", describe()))
	}
	switch {
	case len(declared) == 1:
		return declared[0], nil
	case len(declared) == 0:
		return portRef{}, &AnnotationError{Reason: fmt.Sprintf(
			"the pod's containers declare no TCP port; set the annotation %s to the port the application listens on", AnnotationUpstreamPort)}
	}
	for _, d := range declared {
		if d.name == "http" {
			return d, nil
		}
	}
	return portRef{}, &AnnotationError{Reason: fmt.Sprintf(
		"the pod's containers declare several TCP ports (%s) and none is named http; set the annotation %s to the name or number of the one to rate-limit",
		describe(), AnnotationUpstreamPort)}
}

// parsePort parses a port number.
func parsePort(v string) (int32, error) {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return 0, errors.New("must be a port number between 1 and 65535")
	}
	return int32(n), nil
}

// usedPorts maps each port number that a container declares to a
// description of it. Every container shares the pod's network namespace,
// so init containers count too.
func usedPorts(pod *corev1.Pod) map[int32]string {
	used := map[int32]string{}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for _, p := range c.Ports {
				if _, ok := used[p.ContainerPort]; ok {
					continue
				}
				desc := fmt.Sprintf("port %d of container %q", p.ContainerPort, c.Name)
				if p.Name != "" {
					desc = fmt.Sprintf("port %d (%s) of container %q", p.ContainerPort, p.Name, c.Name)
				}
				used[p.ContainerPort] = desc
			}
		}
	}
	return used
}

// freePort returns the first port from start that used does not hold.
func freePort(used map[int32]string, start int32) int32 {
	p := start
	for used[p] != "" && p < 65535 {
		p++
	}
	return p
}

// takeOver renames the application's port so that the sidecar can take
// its name, rewrites the container's probes and lifecycle hooks that used
// the old name, and returns the new name.
func takeOver(pod *corev1.Pod, up portRef) (string, error) {
	names := map[string]bool{AdminPortName: true, UnnamedPortName: true}
	shared := false
	for _, c := range pod.Spec.InitContainers {
		for _, p := range c.Ports {
			names[p.Name] = true
			shared = shared || p.Name == up.name
		}
	}
	for ci, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			names[p.Name] = true
			shared = shared || (p.Name == up.name && ci != up.container)
		}
	}
	if shared {
		return "", &AnnotationError{Reason: fmt.Sprintf(
			"port name %q is declared by more than one container; the sidecar cannot take it over", up.name)}
	}
	renamed := ""
	for k := 1; k <= 9 && renamed == ""; k++ {
		prefix := RenamedPortPrefix
		if k > 1 {
			prefix = fmt.Sprintf("app%d-", k)
		}
		cand := strings.TrimRight(truncateName(prefix+up.name, maxPortNameLength), "-")
		if !names[cand] && len(validation.IsValidPortName(cand)) == 0 {
			renamed = cand
		}
	}
	if renamed == "" {
		return "", &AnnotationError{Reason: fmt.Sprintf("cannot find a free name for the application port %q", up.name)}
	}
	c := &pod.Spec.Containers[up.container]
	c.Ports[up.index].Name = renamed
	for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if pr != nil {
			renameHandler(&pr.HTTPGet, &pr.TCPSocket, up.name, renamed)
		}
	}
	if lc := c.Lifecycle; lc != nil {
		for _, h := range []*corev1.LifecycleHandler{lc.PostStart, lc.PreStop} {
			if h != nil {
				renameHandler(&h.HTTPGet, &h.TCPSocket, up.name, renamed)
			}
		}
	}
	return renamed, nil
}

func renameHandler(httpGet **corev1.HTTPGetAction, tcp **corev1.TCPSocketAction, from, to string) {
	if g := *httpGet; g != nil && g.Port.Type == intstr.String && g.Port.StrVal == from {
		g.Port = intstr.FromString(to)
	}
	if t := *tcp; t != nil && t.Port.Type == intstr.String && t.Port.StrVal == from {
		t.Port = intstr.FromString(to)
	}
}

func truncateName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// sidecarResources applies the resource annotations to the defaults.
func sidecarResources(ann map[string]string, defaults corev1.ResourceRequirements, bad func(string, string, ...any)) corev1.ResourceRequirements {
	out := *defaults.DeepCopy()
	if out.Requests == nil {
		out.Requests = corev1.ResourceList{}
	}
	if out.Limits == nil {
		out.Limits = corev1.ResourceList{}
	}
	ok := true
	for _, a := range []struct {
		annotation string
		name       corev1.ResourceName
		limit      bool
	}{
		{AnnotationCPURequest, corev1.ResourceCPU, false},
		{AnnotationCPULimit, corev1.ResourceCPU, true},
		{AnnotationMemoryRequest, corev1.ResourceMemory, false},
		{AnnotationMemoryLimit, corev1.ResourceMemory, true},
	} {
		v, set := ann[a.annotation]
		if !set {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			bad(a.annotation, "not a Kubernetes quantity (such as 100m, 0.5 or 128Mi): %v", err)
			ok = false
			continue
		}
		if q.Sign() <= 0 {
			bad(a.annotation, "must be positive")
			ok = false
			continue
		}
		if a.limit {
			out.Limits[a.name] = q
		} else {
			out.Requests[a.name] = q
		}
	}
	if !ok {
		return out
	}
	for _, r := range []struct {
		name                 corev1.ResourceName
		requestAnn, limitAnn string
	}{
		{corev1.ResourceCPU, AnnotationCPURequest, AnnotationCPULimit},
		{corev1.ResourceMemory, AnnotationMemoryRequest, AnnotationMemoryLimit},
	} {
		req, hasReq := out.Requests[r.name]
		lim, hasLim := out.Limits[r.name]
		if !hasReq || !hasLim || req.Cmp(lim) <= 0 {
			continue
		}
		_, reqSet := ann[r.requestAnn]
		if !reqSet {
			// Only the limit was given: lower the default request to it.
			out.Requests[r.name] = lim
			continue
		}
		bad(r.requestAnn, "the %s request exceeds the limit %s", r.name, lim.String())
	}
	return out
}

// sidecarVolumes returns the volumes to add to the pod and the sidecar's
// mounts.
func sidecarVolumes(pod *corev1.Pod, mounts []Mount) ([]corev1.Volume, []corev1.VolumeMount) {
	volumes := []corev1.Volume{{
		Name: PodInfoVolume,
		VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{{
				Path:     path.Base(config.LabelsFile),
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"},
			}},
		}},
	}, {
		Name: APIAccessVolume,
		VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{
				ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](tokenExpiration)},
			}, {
				ConfigMap: &corev1.ConfigMapProjection{
					LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
					Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
				},
			}, {
				DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
					Path:     "namespace",
					FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"},
				}}},
			}},
		}},
	}}
	volumes = append(volumes, corev1.Volume{
		Name: StoreAuthVolume,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: StoreAuthSecret,
			Items:      []corev1.KeyToPath{{Key: config.StoreAuthKey, Path: config.StoreAuthKey}},
			Optional:   ptr.To(true),
		}},
	})
	vms := []corev1.VolumeMount{
		{Name: PodInfoVolume, MountPath: config.PodInfoDir, ReadOnly: true},
		{Name: APIAccessVolume, MountPath: ServiceAccountDir, ReadOnly: true},
		{Name: StoreAuthVolume, MountPath: config.StoreAuthDir, ReadOnly: true},
	}
	taken := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		taken[v.Name] = true
	}
	seen := map[Mount]bool{}
	sorted := slices.Clone(mounts)
	slices.SortFunc(sorted, func(a, b Mount) int {
		if a.Secret != b.Secret {
			if a.Secret {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, m := range sorted {
		if seen[m] || m.Name == "" {
			continue
		}
		seen[m] = true
		kind, dir := "cm", path.Dir(compiler.ConfigMapFile(m.Name, "k"))
		src := corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: m.Name}, Optional: ptr.To(true),
		}}
		if m.Secret {
			kind, dir = "secret", path.Dir(compiler.SecretFile(m.Name, "k"))
			src = corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: m.Name, Optional: ptr.To(true)}}
		}
		sum := sha256.Sum256([]byte(m.Name))
		name := "floodgate-" + kind + "-" + hex.EncodeToString(sum[:5])
		if taken[name] {
			continue
		}
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: src})
		vms = append(vms, corev1.VolumeMount{Name: name, MountPath: dir, ReadOnly: true})
	}
	return volumes, vms
}

// sidecarContainer builds the sidecar.
func sidecarContainer(o Options, res Result, h2c bool, resources corev1.ResourceRequirements, mounts []corev1.VolumeMount) corev1.Container {
	args := []string{
		fmt.Sprintf("--listen=:%d", res.ListenPort),
		fmt.Sprintf("--admin-listen=:%d", res.AdminPort),
		fmt.Sprintf("--upstream=http://127.0.0.1:%d", res.UpstreamPort),
		"--pod-labels-file=" + config.LabelsFile,
	}
	if h2c {
		args = append(args, "--upstream-h2c")
	}
	fieldEnv := func(name, fieldPath string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: fieldPath},
		}}
	}
	probe := func(p string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: p, Port: intstr.FromString(AdminPortName)}},
			PeriodSeconds:    period,
			TimeoutSeconds:   2,
			FailureThreshold: failures,
		}
	}
	return corev1.Container{
		Name:            config.ContainerName,
		Image:           o.Image,
		ImagePullPolicy: o.ImagePullPolicy,
		Args:            args,
		Env: []corev1.EnvVar{
			{Name: config.EnvKubernetes, Value: "true"},
			fieldEnv(config.EnvPodName, "metadata.name"),
			fieldEnv(config.EnvPodNamespace, "metadata.namespace"),
			{Name: config.EnvRedisPasswordFile, Value: config.StoreAuthFile},
		},
		Ports: []corev1.ContainerPort{
			{Name: res.PortName, ContainerPort: res.ListenPort, Protocol: corev1.ProtocolTCP},
			{Name: AdminPortName, ContainerPort: res.AdminPort, Protocol: corev1.ProtocolTCP},
		},
		Resources:                resources,
		VolumeMounts:             mounts,
		ReadinessProbe:           probe("/readyz", 2, 2),
		LivenessProbe:            probe("/healthz", 10, 3),
		RestartPolicy:            ptr.To(corev1.ContainerRestartPolicyAlways),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To(o.RunAsUser),
			RunAsGroup:               ptr.To(o.RunAsUser),
			ReadOnlyRootFilesystem:   ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			Privileged:               ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}
