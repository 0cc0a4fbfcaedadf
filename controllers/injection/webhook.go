package injection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/internal/message"
)

// Path is where the webhook server serves the injector.
const Path = "/mutate-v1-pod"

// SystemNamespaces are never injected, whatever the webhook configuration
// says.
var SystemNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// The webhook configuration. The namespaceSelector's last value is the
// manager's namespace; the Helm chart and config/webhook set it to the
// namespace they install into.
//
// +kubebuilder:webhook:path=/mutate-v1-pod,mutating=true,failurePolicy=fail,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=inject.floodgate.dev,admissionReviewVersions=v1,reinvocationPolicy=IfNeeded,serviceName=floodgate-webhook,serviceNamespace=floodgate-system,timeoutSeconds=10,patch=`{"matchConditions":[{"name":"opted-in","expression":"has(object.metadata.annotations) && 'floodgate.dev/inject' in object.metadata.annotations && object.metadata.annotations['floodgate.dev/inject'] == 'true'"}],"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["kube-system","kube-public","kube-node-lease","floodgate-system"]}]}}`

// +kubebuilder:rbac:groups=ratelimit.floodgate.dev,resources=ratelimitpolicies,verbs=get;list;watch

// Injector is the admission handler. Its fields are set before it is
// registered and not changed afterwards; Handle is safe for concurrent use.
type Injector struct {
	// Options configure the sidecar.
	Options Options
	// Reader lists the RateLimitPolicies of the pod's namespace, whose
	// JWT key references are mounted into the sidecar. The manager's
	// cached client.
	Reader client.Reader
	// ManagerNamespace is the manager's own namespace, never injected.
	ManagerNamespace string
	// Decoder decodes the admitted pods.
	Decoder admission.Decoder
}

var _ admission.Handler = (*Injector)(nil)

// Setup validates the options and registers the injector at Path on mgr's
// webhook server.
func Setup(mgr ctrl.Manager, o Options, managerNamespace string) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("sidecar injector: %w", err)
	}
	if managerNamespace == "" {
		return errors.New("sidecar injector: the manager namespace is empty")
	}
	mgr.GetWebhookServer().Register(Path, &webhook.Admission{Handler: &Injector{
		Options:          o,
		Reader:           mgr.GetClient(),
		ManagerNamespace: managerNamespace,
		Decoder:          admission.NewDecoder(mgr.GetScheme()),
	}})
	return nil
}

// Handle injects the sidecar into an opted-in pod.
func (in *Injector) Handle(ctx context.Context, req admission.Request) admission.Response {
	log := logf.FromContext(ctx).WithValues("namespace", req.Namespace, "name", req.Name)
	var pod corev1.Pod
	if err := in.Decoder.Decode(req, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode the pod: %w", err))
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	switch {
	case !OptedIn(&pod):
		return admission.Allowed("not opted in to floodgate injection")
	case slices.Contains(SystemNamespaces, ns) || ns == in.ManagerNamespace:
		return admission.Allowed("floodgate never injects namespace " + ns)
	}
	mounts, err := in.mounts(ctx, ns, pod.Labels)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	had := HasSidecar(&pod)
	out, res, err := Inject(&pod, mounts, in.Options)
	if err != nil {
		var msgs []string
		for _, e := range message.Unjoin(err) {
			msgs = append(msgs, e.Error())
		}
		log.V(1).Info("rejecting a pod that asks for an impossible sidecar", "reason", strings.Join(msgs, "; "))
		return admission.Denied("floodgate sidecar injection: " + strings.Join(msgs, "; "))
	}
	if had {
		return admission.Allowed("the floodgate sidecar is already injected")
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("marshal the injected pod: %w", err))
	}
	log.V(1).Info("injecting the floodgate sidecar", "upstreamPort", res.UpstreamPort, "listenPort", res.ListenPort,
		"portName", res.PortName, "renamedTo", res.RenamedTo)
	return admission.PatchResponseFromRaw(req.Object.Raw, raw)
}

// mounts returns the JWT key objects of the namespace's policies that
// select a pod with podLabels.
func (in *Injector) mounts(ctx context.Context, ns string, podLabels map[string]string) ([]Mount, error) {
	if in.Reader == nil {
		return nil, nil
	}
	var policies v1alpha1.RateLimitPolicyList
	if err := in.Reader.List(ctx, &policies, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("list the RateLimitPolicies of namespace %s: %w", ns, err)
	}
	var out []Mount
	for i := range policies.Items {
		p := &policies.Items[i]
		j := p.Spec.JWT
		if j == nil || p.GatewayEnforced() {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(podLabels)) {
			continue
		}
		if j.HMACSecretRef != nil {
			out = append(out, Mount{Secret: true, Name: j.HMACSecretRef.Name})
		}
		if j.JWKSConfigMapRef != nil {
			out = append(out, Mount{Name: j.JWKSConfigMapRef.Name})
		}
	}
	return out, nil
}
