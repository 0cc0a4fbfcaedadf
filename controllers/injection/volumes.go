package injection

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/floodgate-dev/floodgate/controllers/policy/compiler"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Mount is a Secret or ConfigMap that a policy of the pod's namespace
// references, mounted read-only into the sidecar at the path the compiled
// document names (compiler.SecretFile, compiler.ConfigMapFile).
type Mount struct {
	// Secret is true for a Secret, false for a ConfigMap.
	Secret bool
	// Name is the object's name.
	Name string
}

// stateSizeLimit bounds the state emptyDir: twice the largest config
// document, for the atomic replace.
const stateSizeLimit = "8Mi"

// sidecarVolumes returns the volumes to add to the pod and the sidecar's
// mounts.
func sidecarVolumes(pod *corev1.Pod, mounts []Mount) ([]corev1.Volume, []corev1.VolumeMount) {
	volumes := []corev1.Volume{{
		Name: PodInfoVolume,
		VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{{
				Path:     path.Base(config.LabelsFile),
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"},
			}},
		}},
	}, {
		Name: APIAccessVolume,
		VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{
				ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](tokenExpiration)},
			}, {
				ConfigMap: &corev1.ConfigMapProjection{
					LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
					Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
				},
			}, {
				DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
					Path:     "namespace",
					FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"},
				}}},
			}},
		}},
	}}
	volumes = append(volumes, corev1.Volume{
		Name: StoreAuthVolume,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: StoreAuthSecret,
			Items: []corev1.KeyToPath{
				{Key: config.StoreAuthKey, Path: config.StoreAuthKey},
				{Key: config.StoreAuthUserKey, Path: config.StoreAuthUserKey},
				{Key: config.StoreCAKey, Path: config.StoreCAKey},
			},
			Optional: ptr.To(true),
		}},
	})
	// The sidecar's own state: small (one config document), in memory so
	// that it never touches the node's disk, bounded.
	volumes = append(volumes, corev1.Volume{
		Name: StateVolume,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			Medium:    corev1.StorageMediumMemory,
			SizeLimit: ptr.To(resource.MustParse(stateSizeLimit)),
		}},
	})
	vms := []corev1.VolumeMount{
		{Name: PodInfoVolume, MountPath: config.PodInfoDir, ReadOnly: true},
		{Name: APIAccessVolume, MountPath: ServiceAccountDir, ReadOnly: true},
		{Name: StoreAuthVolume, MountPath: config.StoreAuthDir, ReadOnly: true},
		{Name: StateVolume, MountPath: config.StateDir},
	}
	taken := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		taken[v.Name] = true
	}
	seen := map[Mount]bool{}
	sorted := slices.Clone(mounts)
	slices.SortFunc(sorted, func(a, b Mount) int {
		if a.Secret != b.Secret {
			if a.Secret {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, m := range sorted {
		if seen[m] || m.Name == "" {
			continue
		}
		seen[m] = true
		kind, dir := "cm", path.Dir(compiler.ConfigMapFile(m.Name, "k"))
		src := corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: m.Name}, Optional: ptr.To(true),
		}}
		if m.Secret {
			kind, dir = "secret", path.Dir(compiler.SecretFile(m.Name, "k"))
			src = corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: m.Name, Optional: ptr.To(true)}}
		}
		sum := sha256.Sum256([]byte(m.Name))
		name := "floodgate-" + kind + "-" + hex.EncodeToString(sum[:5])
		if taken[name] {
			continue
		}
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: src})
		vms = append(vms, corev1.VolumeMount{Name: name, MountPath: dir, ReadOnly: true})
	}
	return volumes, vms
}
