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
// RBAC cannot narrow pods/status to the sidecar's own pod; the sidecar
// only ever names its own (from the downward API), and a compromised
// sidecar could at worst write status conditions of its namespace's pods.
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

// Subject is the group of every service account of namespace ns: a pod's
// sidecar runs with the pod's own service account, whichever it is.
func Subject(ns string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts:" + ns}
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

// DesiredRoleBinding binds the Role to every service account of ns.
func DesiredRoleBinding(ns string) *rbacv1ac.RoleBindingApplyConfiguration {
	s := Subject(ns)
	return rbacv1ac.RoleBinding(RoleName, ns).WithLabels(Labels()).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(RoleName)).
		WithSubjects(rbacv1ac.Subject().WithKind(s.Kind).WithAPIGroup(s.APIGroup).WithName(s.Name))
}

// DesiredSecret is the mirrored store password of ns.
func DesiredSecret(ns, store string, password []byte) *corev1ac.SecretApplyConfiguration {
	return corev1ac.Secret(SecretName, ns).WithLabels(Labels()).
		WithAnnotations(map[string]string{StoreAnnotation: store}).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{PasswordKey: password})
}

// roleUpToDate reports whether r already is DesiredRole.
func roleUpToDate(r *rbacv1.Role) bool {
	return r.DeletionTimestamp == nil && hasLabels(r.Labels) && slices.EqualFunc(r.Rules, Rules(), func(a, b rbacv1.PolicyRule) bool {
		return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) &&
			slices.Equal(a.ResourceNames, b.ResourceNames) && slices.Equal(a.Verbs, b.Verbs) && len(a.NonResourceURLs) == 0
	})
}

// bindingUpToDate reports whether b already is DesiredRoleBinding.
func bindingUpToDate(b *rbacv1.RoleBinding) bool {
	return b.DeletionTimestamp == nil && hasLabels(b.Labels) && roleRefOK(b) &&
		slices.Equal(b.Subjects, []rbacv1.Subject{Subject(b.Namespace)})
}

// roleRefOK reports whether b refers to the Role; a roleRef cannot be
// changed, only deleted with its binding.
func roleRefOK(b *rbacv1.RoleBinding) bool {
	return b.RoleRef == rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: RoleName}
}

// secretUpToDate reports whether s already is DesiredSecret.
func secretUpToDate(s *corev1.Secret, store string, password []byte) bool {
	return s.DeletionTimestamp == nil && hasLabels(s.Labels) && s.Annotations[StoreAnnotation] == store &&
		s.Type == corev1.SecretTypeOpaque && len(s.StringData) == 0 &&
		maps.EqualFunc(s.Data, map[string][]byte{PasswordKey: password}, slices.Equal)
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
