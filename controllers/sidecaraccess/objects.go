package sidecaraccess

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"

	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Names and labels of the objects this controller writes in each
// namespace.
const (
	// RoleName names the sidecars' Role and RoleBinding.
	RoleName = "floodgate-sidecar"
	// SecretName is the mirrored store password (injection.StoreAuthSecret).
	SecretName = injection.StoreAuthSecret
	// PasswordKey is the password's key in SecretName.
	PasswordKey = config.StoreAuthKey
	// UsernameKey is the store user's key in SecretName, when the store
	// gives the sidecars a user of their own.
	UsernameKey = config.StoreAuthUserKey
	// CAKey is the external store's TLS CA bundle's key in SecretName,
	// when its CounterStore names one (tls.caSecretRef).
	CAKey = config.StoreCAKey

	// ManagedByLabel and ComponentLabel mark the objects as this
	// controller's; the manager's cache watches only objects that carry
	// ManagedByLabel.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "floodgate-manager"
	ComponentLabel = "app.kubernetes.io/component"
	ComponentValue = "sidecar-access"
	// StoreAnnotation names the CounterStore whose password a mirrored
	// Secret holds.
	StoreAnnotation = "ratelimit.floodgate.dev/counterstore"
)

// Labels are the labels of every object this controller writes.
func Labels() map[string]string {
	return map[string]string{ManagedByLabel: ManagedByValue, ComponentLabel: ComponentValue}
}

// Rules are what a sidecar may do in its namespace: read the one ConfigMap
// it watches, and read and patch pod status to report its condition.
// RBAC cannot narrow pods/status to the sidecar's own pod; the
// ValidatingAdmissionPolicy floodgate-sidecar-pod-status does (config/rbac,
// and the Helm chart): in a namespace with this Role, a service account of
// the namespace may patch only the status of the pod its token is bound
// to, and only the floodgate.dev/policy-loaded condition in it.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{
		APIGroups:     []string{""},
		Resources:     []string{"configmaps"},
		ResourceNames: []string{config.ConfigMapName},
		Verbs:         []string{"get", "list", "watch"},
	}, {
		APIGroups: []string{""},
		Resources: []string{"pods/status"},
		Verbs:     []string{"get", "patch"},
	}}
}

// Subjects are the service accounts of the pods that run, or will run, a
// sidecar in namespace ns (the names given, sorted and without
// duplicates): a sidecar runs with its pod's own service account. Other
// service accounts of the namespace get nothing.
func Subjects(ns string, serviceAccounts []string) []rbacv1.Subject {
	names := slices.Sorted(slices.Values(serviceAccounts))
	names = slices.Compact(names)
	out := make([]rbacv1.Subject, 0, len(names))
	for _, n := range names {
		if n == "" {
			continue
		}
		out = append(out, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: n, Namespace: ns})
	}
	return out
}

// ServiceAccounts returns the service accounts pods run with ("default"
// for a pod that names none, as the ServiceAccount admission plugin and
// the injector name it).
func ServiceAccounts(pods []corev1.Pod) []string {
	out := make([]string, 0, len(pods))
	for i := range pods {
		sa := pods[i].Spec.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		out = append(out, sa)
	}
	return out
}

// DesiredRole is the sidecars' Role in ns.
func DesiredRole(ns string) *rbacv1ac.RoleApplyConfiguration {
	r := rbacv1ac.Role(RoleName, ns).WithLabels(Labels())
	for _, rule := range Rules() {
		r.WithRules(rbacv1ac.PolicyRule().WithAPIGroups(rule.APIGroups...).WithResources(rule.Resources...).
			WithResourceNames(rule.ResourceNames...).WithVerbs(rule.Verbs...))
	}
	return r
}

// DesiredRoleBinding binds the Role to the service accounts of ns that
// run sidecars (Subjects).
func DesiredRoleBinding(ns string, serviceAccounts []string) *rbacv1ac.RoleBindingApplyConfiguration {
	b := rbacv1ac.RoleBinding(RoleName, ns).WithLabels(Labels()).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(RoleName))
	for _, s := range Subjects(ns, serviceAccounts) {
		b.WithSubjects(rbacv1ac.Subject().WithKind(s.Kind).WithName(s.Name).WithNamespace(s.Namespace))
	}
	return b
}

// Credentials are what the sidecars of a namespace authenticate to their
// store with.
type Credentials struct {
	// Username is the Redis ACL user; empty for the default user.
	Username string
	// Password is the user's password; empty for a store without one.
	Password []byte
	// CA is the PEM bundle that verifies an external store's TLS
	// certificates; empty for the system roots or no TLS.
	CA []byte
}

// Data returns the Secret data that holds c: the password under
// PasswordKey, for an ACL user its name under UsernameKey, and a CA
// bundle under CAKey.
func (c Credentials) Data() map[string][]byte {
	d := map[string][]byte{PasswordKey: c.Password}
	if c.Username != "" {
		d[UsernameKey] = []byte(c.Username)
	}
	if len(c.CA) > 0 {
		d[CAKey] = c.CA
	}
	return d
}

// DesiredSecret is the mirrored store credentials of ns.
func DesiredSecret(ns, store string, c Credentials) *corev1ac.SecretApplyConfiguration {
	return corev1ac.Secret(SecretName, ns).WithLabels(Labels()).
		WithAnnotations(map[string]string{StoreAnnotation: store}).
		WithType(corev1.SecretTypeOpaque).
		WithData(c.Data())
}

// roleUpToDate reports whether r already is DesiredRole.
func roleUpToDate(r *rbacv1.Role) bool {
	return r.DeletionTimestamp == nil && hasLabels(r.Labels) && slices.EqualFunc(r.Rules, Rules(), func(a, b rbacv1.PolicyRule) bool {
		return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) &&
			slices.Equal(a.ResourceNames, b.ResourceNames) && slices.Equal(a.Verbs, b.Verbs) && len(a.NonResourceURLs) == 0
	})
}

// bindingUpToDate reports whether b already is DesiredRoleBinding.
func bindingUpToDate(b *rbacv1.RoleBinding, serviceAccounts []string) bool {
	return b.DeletionTimestamp == nil && hasLabels(b.Labels) && roleRefOK(b) &&
		slices.Equal(b.Subjects, Subjects(b.Namespace, serviceAccounts))
}

// roleRefOK reports whether b refers to the Role; a roleRef cannot be
// changed, only deleted with its binding.
func roleRefOK(b *rbacv1.RoleBinding) bool {
	return b.RoleRef == rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: RoleName}
}

// secretUpToDate reports whether s already is DesiredSecret.
func secretUpToDate(s *corev1.Secret, store string, c Credentials) bool {
	return s.DeletionTimestamp == nil && hasLabels(s.Labels) && s.Annotations[StoreAnnotation] == store &&
		s.Type == corev1.SecretTypeOpaque && len(s.StringData) == 0 &&
		maps.EqualFunc(s.Data, c.Data(), slices.Equal)
}

func hasLabels(l map[string]string) bool {
	for k, v := range Labels() {
		if l[k] != v {
			return false
		}
	}
	return true
}

// ours reports whether an object carries this controller's labels, so
// that it may delete it.
func ours(l map[string]string) bool { return hasLabels(l) }
