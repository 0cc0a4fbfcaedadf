package injection

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// sidecarContainer builds the sidecar.
func sidecarContainer(o Options, res Result, h2c bool, resources corev1.ResourceRequirements, mounts []corev1.VolumeMount) corev1.Container {
	args := []string{
		fmt.Sprintf("--listen=:%d", res.ListenPort),
		fmt.Sprintf("--admin-listen=:%d", res.AdminPort),
		fmt.Sprintf("--upstream=http://127.0.0.1:%d", res.UpstreamPort),
		"--pod-labels-file=" + config.LabelsFile,
		"--state-dir=" + config.StateDir,
	}
	if h2c {
		args = append(args, "--upstream-h2c")
	}
	fieldEnv := func(name, fieldPath string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: fieldPath},
		}}
	}
	probe := func(p string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: p, Port: intstr.FromString(AdminPortName)}},
			PeriodSeconds:    period,
			TimeoutSeconds:   2,
			FailureThreshold: failures,
		}
	}
	return corev1.Container{
		Name:            config.ContainerName,
		Image:           o.Image,
		ImagePullPolicy: o.ImagePullPolicy,
		Args:            args,
		Env: []corev1.EnvVar{
			{Name: config.EnvKubernetes, Value: "true"},
			fieldEnv(config.EnvPodName, "metadata.name"),
			fieldEnv(config.EnvPodNamespace, "metadata.namespace"),
			{Name: config.EnvRedisPasswordFile, Value: config.StoreAuthFile},
			{Name: config.EnvRedisUsernameFile, Value: config.StoreAuthUserFile},
		},
		Ports: []corev1.ContainerPort{
			{Name: res.PortName, ContainerPort: res.ListenPort, Protocol: corev1.ProtocolTCP},
			{Name: AdminPortName, ContainerPort: res.AdminPort, Protocol: corev1.ProtocolTCP},
		},
		Resources:                resources,
		VolumeMounts:             mounts,
		ReadinessProbe:           probe("/readyz", 2, 2),
		LivenessProbe:            probe("/healthz", 10, 3),
		RestartPolicy:            ptr.To(corev1.ContainerRestartPolicyAlways),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To(o.RunAsUser),
			RunAsGroup:               ptr.To(o.RunAsUser),
			ReadOnlyRootFilesystem:   ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			Privileged:               ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}
