package injection

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/floodgate-dev/floodgate/sidecar/config"
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
	StoreAuthSecret = config.StoreAuthSecret
	// StoreAuthVolume mounts StoreAuthSecret into the sidecar, optional,
	// at config.StoreAuthDir: the sidecar reads config.StoreAuthFile for every new
	// connection, so it starts before the manager has mirrored the
	// Secret and follows a rotated password without a restart.
	StoreAuthVolume = "floodgate-store-auth"
	// StateVolume is the sidecar's emptyDir, mounted at config.StateDir:
	// the last config it applied, kept across its container's restarts.
	StateVolume = "floodgate-state"
	// RenamedPortPrefix prefixes the application port whose name the
	// sidecar takes over.
	RenamedPortPrefix = "app-"
	// LabelInjected marks an injected pod with "true", so that monitoring
	// (the chart's PodMonitor) can select the pods that run a sidecar, and
	// a managed store's NetworkPolicy admit them. The
	// ValidatingAdmissionPolicy floodgate-pod-labels (config/webhook, the
	// Helm chart) refuses it on any pod this injector did not write it on,
	// and on a running pod.
	LabelInjected = "floodgate.dev/injected"
)

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
// when it is not opted in or already has the sidecar Inject writes. mounts
// are the objects the namespace's policies reference. An opted-in pod with
// a floodgate-sidecar container that is not the injector's (VerifySidecar)
// is an error. The error joins one *AnnotationError per problem. Inject is
// pure and does not modify pod.
func Inject(pod *corev1.Pod, mounts []Mount, o Options) (*corev1.Pod, Result, error) {
	if !OptedIn(pod) {
		return pod, Result{}, nil
	}
	if err := o.Validate(); err != nil {
		return nil, Result{}, fmt.Errorf("injector options: %w", err)
	}
	if HasSidecar(pod) {
		if err := VerifySidecar(pod, mounts, o); err != nil {
			return nil, Result{}, err
		}
		return pod, Result{}, nil
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
		if v.Name == PodInfoVolume || v.Name == APIAccessVolume || v.Name == StoreAuthVolume || v.Name == StateVolume {
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
