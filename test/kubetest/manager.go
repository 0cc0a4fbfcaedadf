package kubetest

import (
	"context"
	"fmt"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ManagerRBAC are the files of config/rbac that give floodgate-manager its
// identity and permissions in the floodgate-system namespace.
var ManagerRBAC = []string{
	"service_account.yaml", "role.yaml", "role_binding.yaml",
	"leader_election_role.yaml", "leader_election_role_binding.yaml", "metrics_auth_role_binding.yaml",
}

// ManagerIdentity applies config/rbac's manager files from the checkout at
// root with k (the floodgate-system namespace must exist) and returns a
// config of admin's server that authenticates as the manager's service
// account, floodgate-system/floodgate-manager, with a token: a manager
// built on it has exactly the permissions the generated roles grant.
func ManagerIdentity(ctx context.Context, k *Kubectl, admin *rest.Config, root string) (*rest.Config, error) {
	for _, f := range ManagerRBAC {
		if _, err := k.Run(ctx, "apply", "-f", filepath.Join(root, "config", "rbac", f)); err != nil {
			return nil, err
		}
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("building a clientset: %w", err)
	}
	seconds := int64(24 * 3600)
	tr, err := cs.CoreV1().ServiceAccounts("floodgate-system").CreateToken(ctx, "floodgate-manager",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("a token for floodgate-manager: %w", err)
	}
	c := rest.AnonymousClientConfig(admin)
	c.BearerToken = tr.Status.Token
	return c, nil
}
