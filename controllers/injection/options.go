package injection

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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
