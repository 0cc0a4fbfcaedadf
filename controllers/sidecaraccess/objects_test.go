package sidecaraccess

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRulesAreLeastPrivilege(t *testing.T) {
	t.Parallel()
	rules := Rules()
	if len(rules) != 2 {
		t.Fatalf("%d rules, want 2", len(rules))
	}
	cm := rules[0]
	if !slices.Equal(cm.Resources, []string{"configmaps"}) || !slices.Equal(cm.ResourceNames, []string{"floodgate-policies"}) ||
		!slices.Equal(cm.Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("ConfigMap rule %+v, want get/list/watch on floodgate-policies only", cm)
	}
	st := rules[1]
	if !slices.Equal(st.Resources, []string{"pods/status"}) || !slices.Equal(st.Verbs, []string{"get", "patch"}) {
		t.Errorf("pod status rule %+v, want get/patch on pods/status", st)
	}
	for _, r := range rules {
		if slices.Contains(r.Resources, "secrets") || slices.Contains(r.Verbs, "*") || slices.Contains(r.Resources, "*") {
			t.Errorf("rule %+v is broader than the sidecar needs", r)
		}
	}
}

func TestDesiredObjects(t *testing.T) {
	t.Parallel()
	role := DesiredRole("shop")
	if *role.Name != RoleName || *role.Namespace != "shop" || len(role.Rules) != 2 ||
		!slices.Equal(role.Rules[0].ResourceNames, []string{"floodgate-policies"}) {
		t.Errorf("DesiredRole = %+v", role)
	}
	b := DesiredRoleBinding("shop")
	if *b.RoleRef.Name != RoleName || *b.RoleRef.Kind != "Role" || len(b.Subjects) != 1 ||
		*b.Subjects[0].Kind != rbacv1.GroupKind || *b.Subjects[0].Name != "system:serviceaccounts:shop" {
		t.Errorf("DesiredRoleBinding = %+v", b)
	}
	s := DesiredSecret("shop", "default", []byte("pw"))
	if *s.Name != SecretName || string(s.Data[PasswordKey]) != "pw" || s.Annotations[StoreAnnotation] != "default" {
		t.Errorf("DesiredSecret = %+v", s)
	}
}

func TestUpToDate(t *testing.T) {
	t.Parallel()
	meta := metav1.ObjectMeta{Name: RoleName, Namespace: "shop", Labels: Labels()}
	role := &rbacv1.Role{ObjectMeta: meta, Rules: Rules()}
	if !roleUpToDate(role) {
		t.Error("the desired Role is not up to date")
	}
	wider := role.DeepCopy()
	wider.Rules[0].ResourceNames = nil
	if roleUpToDate(wider) {
		t.Error("a Role widened to every ConfigMap counts as up to date")
	}
	unlabelled := role.DeepCopy()
	unlabelled.Labels = nil
	if roleUpToDate(unlabelled) {
		t.Error("a Role without the labels counts as up to date")
	}

	binding := &rbacv1.RoleBinding{ObjectMeta: meta, Subjects: []rbacv1.Subject{Subject("shop")},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: RoleName}}
	if !bindingUpToDate(binding) {
		t.Error("the desired RoleBinding is not up to date")
	}
	extra := binding.DeepCopy()
	extra.Subjects = append(extra.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, Name: "mallory"})
	if bindingUpToDate(extra) {
		t.Error("a RoleBinding with an extra subject counts as up to date")
	}
	foreign := binding.DeepCopy()
	foreign.RoleRef.Kind = "ClusterRole"
	if roleRefOK(foreign) || bindingUpToDate(foreign) {
		t.Error("a RoleBinding to a ClusterRole counts as up to date")
	}

	sm := metav1.ObjectMeta{Name: SecretName, Namespace: "shop", Labels: Labels(), Annotations: map[string]string{StoreAnnotation: "default"}}
	secret := &corev1.Secret{ObjectMeta: sm, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{PasswordKey: []byte("pw")}}
	if !secretUpToDate(secret, "default", []byte("pw")) {
		t.Error("the desired Secret is not up to date")
	}
	if secretUpToDate(secret, "default", []byte("new")) || secretUpToDate(secret, "other", []byte("pw")) {
		t.Error("a Secret with another password or store counts as up to date")
	}
	empty := &corev1.Secret{ObjectMeta: sm, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{PasswordKey: nil}}
	if !secretUpToDate(empty, "default", []byte{}) {
		t.Error("an empty password read back as nil is not up to date")
	}
}
