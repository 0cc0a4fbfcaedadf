// Package admit validates floodgate's custom resources offline exactly as
// a create through the API server would, with floodgate's validating
// webhook installed: it runs the API server's own code on the CRDs that
// config/crd/bases holds, and the webhook's own validation.
//
// The steps, in the API server's order, and what each reuses:
//
//  1. Strict decoding (kubectl apply sends fieldValidation=Strict):
//     duplicate fields (apimachinery's strict JSON serializer) and unknown
//     fields (the CR handler's pruning and metadata coercion, from
//     apiextensions-apiserver's schema/pruning and schema/objectmeta),
//     answered 400 BadRequest in the handler's words.
//  2. Defaulting from the structural schema (schema/defaulting).
//  3. The registry's BeforeCreate (apiserver's registry/rest) with the CR
//     strategy of apiextensions-apiserver (registry/customresource): object
//     metadata, the OpenAPI schema, embedded resources, list-type
//     invariants and the CEL rules (x-kubernetes-validations), answered
//     422 Invalid.
//  4. For a RateLimitPolicy, floodgate's validating webhook
//     (controllers/admission.Validate), its rejection wrapped as the API
//     server wraps a webhook's (admission/plugin/webhook/errors).
//
// What it cannot see: anything that needs the cluster. The webhook's
// warnings (a storeRef to a CounterStore that does not exist, a namespace
// already using another store) and an update's checks against the stored
// object are not made.
package admit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"

	apiextensionshelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/crdserverscheme"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured/unstructuredscheme"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	serializerjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	webhookerrors "k8s.io/apiserver/pkg/admission/plugin/webhook/errors"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/admission"
)

// WebhookName is the name of floodgate's validating webhook for
// RateLimitPolicies, as config/webhook/manifests.yaml registers it; the API
// server names it in every rejection.
const WebhookName = "validate.ratelimitpolicy.floodgate.dev"

// ClusterWebhookName is the name of floodgate's validating webhook for
// ClusterRateLimitPolicies.
const ClusterWebhookName = "validate.clusterratelimitpolicy.floodgate.dev"

// LastAppliedAnnotation is the annotation kubectl apply adds to what it
// creates; it counts towards the metadata's size limit.
const LastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// Validator validates the custom resources of a set of CRDs. It is safe for
// concurrent use.
type Validator struct {
	kinds map[schema.GroupVersionKind]*kind
}

// kind is what the API server builds to serve one version of a CRD.
type kind struct {
	gvk        schema.GroupVersionKind
	plural     string
	namespaced bool
	structural *structuralschema.Structural
	strategy   rest.RESTCreateStrategy
}

// FromFS reads every *.yaml file of dir in fsys as a CRD.
func FromFS(fsys fs.FS, dir string) (*Validator, error) {
	names, err := fs.Glob(fsys, path.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	crds := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(names))
	for _, n := range names {
		data, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(data, &crd); err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		crds = append(crds, &crd)
	}
	return New(crds...)
}

// New builds a Validator for the served versions of crds, as the API
// server's CR handler builds its serving info.
func New(crds ...*apiextensionsv1.CustomResourceDefinition) (*Validator, error) {
	v := &Validator{kinds: map[schema.GroupVersionKind]*kind{}}
	for _, crd := range crds {
		for _, ver := range crd.Spec.Versions {
			if !ver.Served {
				continue
			}
			k, err := newKind(crd, ver)
			if err != nil {
				return nil, fmt.Errorf("CRD %s, version %s: %w", crd.Name, ver.Name, err)
			}
			v.kinds[k.gvk] = k
		}
	}
	return v, nil
}

func newKind(crd *apiextensionsv1.CustomResourceDefinition, ver apiextensionsv1.CustomResourceDefinitionVersion) (*kind, error) {
	val, err := apiextensionshelpers.GetSchemaForVersion(crd, ver.Name)
	if err != nil {
		return nil, err
	}
	if val == nil || val.OpenAPIV3Schema == nil {
		return nil, errors.New("no schema")
	}
	internal := &apiextensionsinternal.CustomResourceValidation{}
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(val, internal, nil); err != nil {
		return nil, fmt.Errorf("converting the schema: %w", err)
	}
	s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
	if err != nil {
		return nil, fmt.Errorf("structural schema: %w", err)
	}
	s = s.DeepCopy()
	if err := structuraldefaulting.PruneDefaults(s); err != nil {
		return nil, fmt.Errorf("pruning defaults: %w", err)
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(internal.OpenAPIV3Schema)
	if err != nil {
		return nil, err
	}
	sub, err := apiextensionshelpers.GetSubresourcesForVersion(crd, ver.Name)
	if err != nil {
		return nil, err
	}
	var statusSpec *apiextensionsinternal.CustomResourceSubresourceStatus
	var statusValidator apiservervalidation.SchemaValidator
	if sub != nil && sub.Status != nil {
		statusSpec = &apiextensionsinternal.CustomResourceSubresourceStatus{}
		if err := apiextensionsv1.Convert_v1_CustomResourceSubresourceStatus_To_apiextensions_CustomResourceSubresourceStatus(sub.Status, statusSpec, nil); err != nil {
			return nil, err
		}
		if st, ok := internal.OpenAPIV3Schema.Properties["status"]; ok {
			if statusValidator, _, err = apiservervalidation.NewSchemaValidator(&st); err != nil {
				return nil, err
			}
		}
	}
	var scaleSpec *apiextensionsinternal.CustomResourceSubresourceScale
	if sub != nil && sub.Scale != nil {
		scaleSpec = &apiextensionsinternal.CustomResourceSubresourceScale{}
		if err := apiextensionsv1.Convert_v1_CustomResourceSubresourceScale_To_apiextensions_CustomResourceSubresourceScale(sub.Scale, scaleSpec, nil); err != nil {
			return nil, err
		}
	}
	gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: ver.Name, Kind: crd.Spec.Names.Kind}
	namespaced := crd.Spec.Scope == apiextensionsv1.NamespaceScoped
	strategy := customresource.NewStrategy(crdserverscheme.NewUnstructuredObjectTyper(), namespaced, gvk,
		validator, statusValidator, s, statusSpec, scaleSpec, ver.SelectableFields)
	return &kind{gvk: gvk, plural: crd.Spec.Names.Plural, namespaced: namespaced, structural: s, strategy: strategy}, nil
}

// Known reports whether gvk is one of the validator's kinds.
func (v *Validator) Known(gvk schema.GroupVersionKind) bool { return v.kinds[gvk] != nil }

// Groups returns the API groups of the validator's kinds.
func (v *Validator) Groups() map[string]bool {
	g := map[string]bool{}
	for gvk := range v.kinds {
		g[gvk.Group] = true
	}
	return g
}

// Resource returns the resource name of a kind, as kubectl prints it
// ("ratelimitpolicy.ratelimit.floodgate.dev").
func (v *Validator) Resource(gvk schema.GroupVersionKind) string {
	if k := v.kinds[gvk]; k != nil {
		return schema.GroupKind{Group: gvk.Group, Kind: k.gvk.Kind}.String()
	}
	return gvk.GroupKind().String()
}

// Namespaced reports whether a kind is namespaced.
func (v *Validator) Namespaced(gvk schema.GroupVersionKind) bool {
	k := v.kinds[gvk]
	return k != nil && k.namespaced
}

// ErrUnknownKind is returned, wrapped, for an object whose kind the
// validator does not serve.
var ErrUnknownKind = errors.New("no matches for kind")

// Create validates obj, a JSON document, as the API server would on a
// create in namespace (for a namespaced kind whose object names none),
// sent by kubectl apply. It returns nil when the create would be
// admitted, the API server's *apierrors.StatusError when it would not, or
// another error when the request could not even be made (ErrUnknownKind).
// The defaulted object, as it would be stored, is returned when valid.
func (v *Validator) Create(obj []byte, namespace string) (*unstructured.Unstructured, error) {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(obj, &tm); err != nil {
		return nil, fmt.Errorf("reading apiVersion and kind: %w", err)
	}
	gvk := tm.GroupVersionKind()
	k := v.kinds[gvk]
	if k == nil {
		return nil, fmt.Errorf("%w %q in version %q", ErrUnknownKind, gvk.Kind, gvk.GroupVersion().String())
	}
	body, err := withLastApplied(obj)
	if err != nil {
		return nil, err
	}

	// 1. Strict decoding.
	dec := serializerjson.NewSerializerWithOptions(serializerjson.DefaultMetaFactory,
		unstructuredscheme.NewUnstructuredCreator(), unstructuredscheme.NewUnstructuredObjectTyper(),
		serializerjson.SerializerOptions{Strict: true})
	decoded, _, err := dec.Decode(body, &gvk, &unstructured.Unstructured{})
	var strict []error
	if err != nil {
		se, ok := runtime.AsStrictDecodingError(err)
		if !ok || decoded == nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("%s in version %q cannot be handled as a %s: %v", gvk.Kind, gvk.Version, gvk.Kind, err))
		}
		strict = se.Errors()
	}
	u, ok := decoded.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("decoded a %T", decoded)
	}
	unknown, err := k.coerce(u)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("%s in version %q cannot be handled as a %s: %v", gvk.Kind, gvk.Version, gvk.Kind, err))
	}
	for _, p := range unknown {
		strict = append(strict, fmt.Errorf(`unknown field "%s"`, p))
	}
	if len(strict) > 0 {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("%s in version %q cannot be handled as a %s: %v",
			gvk.Kind, gvk.Version, gvk.Kind, runtime.NewStrictDecodingError(strict)))
	}

	// 2. Defaulting.
	structuraldefaulting.Default(u.Object, k.structural)

	// 3. The registry: metadata, schema, CEL.
	ns := ""
	if k.namespaced {
		ns = u.GetNamespace()
		if ns == "" {
			ns = namespace
		}
	}
	ctx := genericapirequest.WithNamespace(context.Background(), ns)
	rest.WipeObjectMetaSystemFields(u)
	if err := rest.EnsureObjectNamespaceMatchesRequestNamespace(ns, u); err != nil {
		return nil, err
	}
	rest.FillObjectMetaSystemFields(u)
	if err := rest.BeforeCreate(k.strategy, ctx, u); err != nil {
		return nil, err
	}

	// 4. floodgate's validating webhooks.
	switch gvk.GroupKind() {
	case v1alpha1.GroupVersion.WithKind("RateLimitPolicy").GroupKind():
		var p v1alpha1.RateLimitPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
			return nil, fmt.Errorf("reading the object as the webhook does: %w", err)
		}
		if errs := admission.Validate(&p); len(errs) > 0 {
			st := apierrors.NewInvalid(gvk.GroupKind(), p.Name, errs).Status()
			return nil, webhookerrors.ToStatusErr(WebhookName, &st)
		}
	case v1alpha1.GroupVersion.WithKind("ClusterRateLimitPolicy").GroupKind():
		var p v1alpha1.ClusterRateLimitPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
			return nil, fmt.Errorf("reading the object as the webhook does: %w", err)
		}
		if errs := admission.ValidateCluster(&p); len(errs) > 0 {
			st := apierrors.NewInvalid(gvk.GroupKind(), p.Name, errs).Status()
			return nil, webhookerrors.ToStatusErr(ClusterWebhookName, &st)
		}
	}
	return u, nil
}

// coerce is the CR handler's schema coercion of a decoded request body
// (apiextensions-apiserver's unstructuredSchemaCoercer.apply, with
// field validation Strict): it prunes what the schema does not declare
// and returns the pruned paths.
func (k *kind) coerce(u *unstructured.Unstructured) ([]string, error) {
	kindName, foundKind, err := unstructured.NestedString(u.Object, "kind")
	if err != nil {
		return nil, err
	}
	apiVersion, foundAPIVersion, err := unstructured.NestedString(u.Object, "apiVersion")
	if err != nil {
		return nil, err
	}
	objectMeta, foundObjectMeta, unknown, err := schemaobjectmeta.GetObjectMetaWithOptions(u.Object, schemaobjectmeta.ObjectMetaOptions{ReturnUnknownFieldPaths: true})
	if err != nil {
		return nil, err
	}
	unknown = append(unknown, structuralpruning.PruneWithOptions(u.Object, k.structural, true,
		structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})...)
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, k.structural)
	// CoerceWithOptions returns a *field.Error: nil must not become a
	// non-nil error interface.
	ferr, paths := schemaobjectmeta.CoerceWithOptions(nil, u.Object, k.structural, false, schemaobjectmeta.CoerceOptions{ReturnUnknownFieldPaths: true})
	if ferr != nil {
		return nil, ferr
	}
	unknown = append(unknown, paths...)
	if foundKind {
		u.SetKind(kindName)
	}
	if foundAPIVersion {
		u.SetAPIVersion(apiVersion)
	}
	if foundObjectMeta {
		if err := schemaobjectmeta.SetObjectMeta(u.Object, objectMeta); err != nil {
			return nil, err
		}
	}
	return unknown, nil
}

// withLastApplied adds the annotation kubectl apply adds on create: the
// object as given.
func withLastApplied(obj []byte) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(obj, &m); err != nil {
		return nil, fmt.Errorf("the object is not a JSON object: %w", err)
	}
	meta, _ := m["metadata"].(map[string]any)
	if meta == nil {
		return obj, nil
	}
	ann, _ := meta["annotations"].(map[string]any)
	if _, set := meta["annotations"]; set && ann == nil {
		return obj, nil
	}
	if ann == nil {
		ann = map[string]any{}
	}
	// kubectl records the object with its own annotation removed, as
	// compact JSON followed by a newline.
	delete(ann, LastAppliedAnnotation)
	orig, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	ann[LastAppliedAnnotation] = string(orig) + "\n"
	meta["annotations"] = ann
	return json.Marshal(m)
}
