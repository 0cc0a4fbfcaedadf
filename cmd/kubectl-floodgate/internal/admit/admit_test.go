package admit

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/config/crd"
)

func validator(t *testing.T) *Validator {
	t.Helper()
	v, err := FromFS(crd.Bases, "bases")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func create(t *testing.T, v *Validator, doc string) (*unstructured.Unstructured, error) {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return v.Create(j, "shop")
}

const policy = `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: p}
spec:
  podSelector: {}
  rules:
  - name: r
    key: [{clientIP: {}}]
`

const clusterPolicy = `apiVersion: ratelimit.floodgate.dev/v1alpha1
kind: ClusterRateLimitPolicy
metadata: {name: floor}
spec:
  namespaceSelector: {}
  podSelector: {}
  defaults:
    rules:
    - name: per-ip
      key: [{clientIP: {}}]
      limit: {requests: 1000, per: 1s}
`

// The agreement with a real API server is tested against envtest in
// test/k8sloop; these are the offline cases that name each step.
func TestCreate(t *testing.T) {
	t.Parallel()
	v := validator(t)
	for _, tt := range []struct {
		name, doc string
		reason    metav1.StatusReason
		message   string
	}{
		{"unknown field: strict decoding", policy + "    limit: {requests: 1, per: 1s}\n    limt: {}\n", metav1.StatusReasonBadRequest,
			`RateLimitPolicy in version "v1alpha1" cannot be handled as a RateLimitPolicy: strict decoding error: unknown field "spec.rules[0].limt"`},
		{"schema", policy + "    limit: {requests: 0, per: 1s}\n", metav1.StatusReasonInvalid,
			`RateLimitPolicy.ratelimit.floodgate.dev "p" is invalid: spec.rules[0].limit.requests: Invalid value: 0: spec.rules[0].limit.requests in body should be greater than or equal to 1`},
		{"CEL", policy + "    limit: {requests: 1, per: 500ms}\n", metav1.StatusReasonInvalid,
			`spec.rules[0].limit.per: Invalid value: "500ms": must be between 1s and 366d (8784h)`},
		{"the webhook", policy + "    limit: {requests: 1, per: 1.0000005s}\n", metav1.StatusReasonInvalid,
			`admission webhook "validate.ratelimitpolicy.floodgate.dev" denied the request: RateLimitPolicy.ratelimit.floodgate.dev "p" is invalid: spec.rules[0].limit.per: Invalid value: "1.0000005s": must be a whole number of microseconds`},
		{"the webhook: CEL", policy + "    match: {when: [\"request.method\"]}\n    limit: {requests: 1, per: 1s}\n", metav1.StatusReasonInvalid,
			`admission webhook "validate.ratelimitpolicy.floodgate.dev" denied the request: RateLimitPolicy.ratelimit.floodgate.dev "p" is invalid: spec.rules[0].match.when[0]: Invalid value: "request.method": must be a condition (of type bool), but is of type string`},
		{"schema: a network with host bits", policy + "    match: {sourceCIDRs: [10.1.2.3/8]}\n    limit: {requests: 1, per: 1s}\n", metav1.StatusReasonInvalid,
			`spec.rules[0].match.sourceCIDRs[0]`},
		{"the cluster webhook: CEL cost", clusterPolicy + "      match: {when: [\"request.headers.all(a, request.headers.all(b, a != b))\"]}\n", metav1.StatusReasonInvalid,
			`admission webhook "validate.clusterratelimitpolicy.floodgate.dev" denied the request: ClusterRateLimitPolicy.ratelimit.floodgate.dev "floor" is invalid: spec.defaults.rules[0].match.when[0]: Invalid value: "request.headers.all(a, request.headers.all(b, a != b))": its estimated worst-case cost`},
		{"metadata", strings.Replace(policy, "{name: p}", "{name: Not_A_Name}", 1) + "    limit: {requests: 1, per: 1s}\n", metav1.StatusReasonInvalid,
			`metadata.name: Invalid value: "Not_A_Name"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := create(t, v, tt.doc)
			var se *apierrors.StatusError
			if !errors.As(err, &se) {
				t.Fatalf("error %v, want a status error", err)
			}
			if got := se.Status().Reason; got != tt.reason {
				t.Errorf("reason %q, want %q", got, tt.reason)
			}
			if !strings.Contains(se.Status().Message, tt.message) {
				t.Errorf("message\n%s\ndoes not contain\n%s", se.Status().Message, tt.message)
			}
		})
	}
}

func TestCreateDefaultsAsTheServerDoes(t *testing.T) {
	t.Parallel()
	u, err := create(t, validator(t), policy+"    limit: {requests: 1, per: 1s}\n")
	if err != nil {
		t.Fatal(err)
	}
	rule := u.Object["spec"].(map[string]any)["rules"].([]any)[0].(map[string]any)
	for k, want := range map[string]string{"onMissingKey": "Shared", "failureMode": "Open", "mode": "Enforce"} {
		if got := rule[k]; got != want {
			t.Errorf("%s = %v, want the default %q", k, got, want)
		}
	}
	if got := rule["limit"].(map[string]any)["algorithm"]; got != "TokenBucket" {
		t.Errorf("algorithm = %v, want the default TokenBucket", got)
	}
	if u.GetNamespace() != "shop" {
		t.Errorf("namespace %q, want the request's", u.GetNamespace())
	}
}

func TestCreateBeforeTheServer(t *testing.T) {
	t.Parallel()
	v := validator(t)
	_, err := create(t, v, strings.Replace(policy, "v1alpha1", "v9", 1))
	if !errors.Is(err, ErrUnknownKind) {
		t.Errorf("an unknown version: %v, want ErrUnknownKind", err)
	}
	_, err = create(t, v, strings.Replace(policy, "{name: p}", "{name: p, namespace: other}", 1)+"    limit: {requests: 1, per: 1s}\n")
	if err != nil {
		t.Errorf("a policy naming its namespace: %v", err)
	}
	if !v.Known(schema.GroupVersionKind{Group: "ratelimit.floodgate.dev", Version: "v1alpha1", Kind: "CounterStore"}) || v.Namespaced(schema.GroupVersionKind{Group: "ratelimit.floodgate.dev", Version: "v1alpha1", Kind: "CounterStore"}) {
		t.Error("CounterStore: want known and cluster-scoped")
	}
}
