package helmchart

import (
	"path"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/test/helmchart/helmtest"
)

// TestRateLimitServiceMountsTheStoreCredentials: the central rate-limit
// service's replicas read what the manager mirrors into
// floodgate-ratelimit-store-auth where the compiled document and the
// sidecar's variables expect it, as injected sidecars do: the password,
// a managed store's user and an external store's TLS CA bundle
// (config.StoreCAFile, the document's store.tls.caFile).
func TestRateLimitServiceMountsTheStoreCredentials(t *testing.T) {
	t.Parallel()
	objs := helmtest.Manifest(t, "-f", "testdata/values/ratelimit-service.yaml")
	var d appsv1.Deployment
	fromUnstructured(t, objs.Get(t, "Deployment", "floodgate-ratelimit"), &d)
	var vol *corev1.Volume
	for i, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == config.RateLimitServiceStoreAuthSecret {
			vol = &d.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatalf("no volume of the Secret %s in %+v", config.RateLimitServiceStoreAuthSecret, d.Spec.Template.Spec.Volumes)
	}
	if vol.Secret.Optional == nil || !*vol.Secret.Optional {
		t.Errorf("the credentials volume is not optional: the replicas start before the manager mirrors the Secret")
	}
	files := map[string]bool{}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name != vol.Name {
				continue
			}
			for _, it := range vol.Secret.Items {
				files[path.Join(m.MountPath, it.Path)] = it.Key == it.Path
			}
		}
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		for name, want := range map[string]string{config.EnvRedisPasswordFile: config.StoreAuthFile, config.EnvRedisUsernameFile: config.StoreAuthUserFile} {
			if env[name] != want {
				t.Errorf("container %s: %s = %q, want %q", c.Name, name, env[name], want)
			}
		}
	}
	for _, f := range []string{config.StoreAuthFile, config.StoreAuthUserFile, config.StoreCAFile} {
		if !files[f] {
			t.Errorf("the replicas have no %s from the key of the same name (they have %v)", f, files)
		}
	}
}
