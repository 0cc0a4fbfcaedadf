package sidecaraccess

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/floodgate-dev/floodgate/sidecar/config"
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
	b := DesiredRoleBinding("shop", []string{"web", "api", "web"})
	if *b.RoleRef.Name != RoleName || *b.RoleRef.Kind != "Role" || len(b.Subjects) != 2 ||
		*b.Subjects[0].Kind != rbacv1.ServiceAccountKind || *b.Subjects[0].Name != "api" || *b.Subjects[0].Namespace != "shop" ||
		*b.Subjects[1].Name != "web" {
		t.Errorf("DesiredRoleBinding = %+v, want the service accounts api and web of shop", b)
	}
	if got := ServiceAccounts([]corev1.Pod{{Spec: corev1.PodSpec{ServiceAccountName: "api"}}, {}}); !slices.Equal(got, []string{"api", "default"}) {
		t.Errorf("ServiceAccounts = %v, want api and default (a pod that names none)", got)
	}
	s := DesiredSecret("shop", "default", Credentials{Password: []byte("pw")})
	if *s.Name != SecretName || string(s.Data[PasswordKey]) != "pw" || len(s.Data) != 1 || s.Annotations[StoreAnnotation] != "default" {
		t.Errorf("DesiredSecret = %+v", s)
	}
	s = DesiredSecret("shop", "default", Credentials{Username: "floodgate-sidecar", Password: []byte("pw")})
	if string(s.Data[UsernameKey]) != "floodgate-sidecar" || string(s.Data[PasswordKey]) != "pw" {
		t.Errorf("DesiredSecret with a user = %+v", s)
	}
	s = DesiredSecret("shop", "default", Credentials{Password: []byte("pw"), CA: []byte("PEM")})
	if string(s.Data[CAKey]) != "PEM" || CAKey != config.StoreCAKey || len(s.Data) != 2 {
		t.Errorf("DesiredSecret with a CA bundle = %+v, want it under %q, the key the injected volume mounts", s, config.StoreCAKey)
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

	sas := []string{"api"}
	binding := &rbacv1.RoleBinding{ObjectMeta: meta, Subjects: Subjects("shop", sas),
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: RoleName}}
	if !bindingUpToDate(binding, sas) {
		t.Error("the desired RoleBinding is not up to date")
	}
	if bindingUpToDate(binding, []string{"api", "web"}) {
		t.Error("a RoleBinding without a new pod's service account counts as up to date")
	}
	extra := binding.DeepCopy()
	extra.Subjects = append(extra.Subjects, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts:shop"})
	if bindingUpToDate(extra, sas) {
		t.Error("a RoleBinding with an extra subject (the whole namespace) counts as up to date")
	}
	foreign := binding.DeepCopy()
	foreign.RoleRef.Kind = "ClusterRole"
	if roleRefOK(foreign) || bindingUpToDate(foreign, sas) {
		t.Error("a RoleBinding to a ClusterRole counts as up to date")
	}

	sm := metav1.ObjectMeta{Name: SecretName, Namespace: "shop", Labels: Labels(), Annotations: map[string]string{StoreAnnotation: "default"}}
	secret := &corev1.Secret{ObjectMeta: sm, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{PasswordKey: []byte("pw")}}
	if !secretUpToDate(secret, "default", Credentials{Password: []byte("pw")}) {
		t.Error("the desired Secret is not up to date")
	}
	if secretUpToDate(secret, "default", Credentials{Password: []byte("new")}) || secretUpToDate(secret, "other", Credentials{Password: []byte("pw")}) ||
		secretUpToDate(secret, "default", Credentials{Username: "floodgate-sidecar", Password: []byte("pw")}) {
		t.Error("a Secret with another password, user or store counts as up to date")
	}
	empty := &corev1.Secret{ObjectMeta: sm, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{PasswordKey: nil}}
	if !secretUpToDate(empty, "default", Credentials{Password: []byte{}}) {
		t.Error("an empty password read back as nil is not up to date")
	}
}
