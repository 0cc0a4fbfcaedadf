package injection

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// VerifySidecar checks that pod's floodgate-sidecar container is the one
// Inject writes, and not a look-alike: the same image, arguments,
// environment, volume mounts (and the sources of the volumes they mount),
// ports, restart policy and security settings, for the ports its arguments
// name, the pod's resource annotations and the namespace's key mounts. It
// returns an *AnnotationError that lists the differences. Fields the API
// server defaults (pull policy, probe thresholds, volume modes) are not
// compared, so a pod the injector wrote passes after defaulting, as on a
// reinvocation of the webhook.
func VerifySidecar(pod *corev1.Pod, mounts []Mount, o Options) error {
	if slices.ContainsFunc(pod.Spec.Containers, isSidecar) {
		return lookAlike("it is a regular container; floodgate's sidecar is an init container with restartPolicy Always")
	}
	i := slices.IndexFunc(pod.Spec.InitContainers, isSidecar)
	if i < 0 {
		return nil
	}
	c := &pod.Spec.InitContainers[i]
	res, h2c, err := sidecarArgs(c.Args)
	if err != nil {
		return lookAlike(err.Error())
	}
	if len(c.Ports) == 0 {
		return lookAlike("it declares no listen port")
	}
	res.PortName = c.Ports[0].Name

	// The volumes the injector adds are the ones the sidecar mounts: take
	// them out, and work out what the injector would add to the rest.
	mounted := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounted[m.Name] = true
	}
	base := pod.DeepCopy()
	base.Spec.Volumes = slices.DeleteFunc(base.Spec.Volumes, func(v corev1.Volume) bool { return mounted[v.Name] })
	wantVolumes, wantMounts := sidecarVolumes(base, mounts)
	resources := sidecarResources(pod.Annotations, o.Resources, func(string, string, ...any) {})
	want := sidecarContainer(o, res, h2c, resources, wantMounts)

	var diffs []string
	differ := func(what string, got, want any) {
		diffs = append(diffs, fmt.Sprintf("its %s %v differ from the injector's %v", what, got, want))
	}
	if c.Image != want.Image {
		diffs = append(diffs, fmt.Sprintf("its image %q is not the injector's %q", c.Image, want.Image))
	}
	if !slices.Equal(c.Args, want.Args) {
		differ("arguments", c.Args, want.Args)
	}
	if len(c.Command) > 0 {
		differ("command", c.Command, "(none)")
	}
	if !reflect.DeepEqual(c.Env, want.Env) || len(c.EnvFrom) > 0 {
		diffs = append(diffs, "its environment differs from the injector's")
	}
	if !reflect.DeepEqual(c.VolumeMounts, want.VolumeMounts) {
		differ("volume mounts", mountNames(c.VolumeMounts), mountNames(want.VolumeMounts))
	}
	for _, wv := range wantVolumes {
		j := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == wv.Name })
		if j < 0 || !reflect.DeepEqual(undefaulted(pod.Spec.Volumes[j]), undefaulted(wv)) {
			diffs = append(diffs, fmt.Sprintf("its volume %q is not the one the injector writes", wv.Name))
		}
	}
	if !reflect.DeepEqual(ports(c.Ports), ports(want.Ports)) {
		differ("ports", ports(c.Ports), ports(want.Ports))
	}
	if !reflect.DeepEqual(c.RestartPolicy, want.RestartPolicy) {
		diffs = append(diffs, "its restart policy is not Always")
	}
	if !restricted(c.SecurityContext, want.SecurityContext) {
		diffs = append(diffs, "its security context is not the injector's")
	}
	if !reflect.DeepEqual(c.Resources, want.Resources) {
		diffs = append(diffs, "its resources are not those the pod's annotations and the injector's defaults give")
	}
	if len(diffs) > 0 {
		return lookAlike(strings.Join(diffs, "; "))
	}
	return nil
}

func lookAlike(why string) error {
	return &AnnotationError{Reason: "the pod already has a container named floodgate-sidecar that is not the one floodgate injects (" + why +
		"); remove it and let the injector add the sidecar"}
}

// sidecarArgs reads the ports and the h2c switch out of the arguments the
// injector writes, which must come in its order.
func sidecarArgs(args []string) (res Result, h2c bool, err error) {
	want := []string{"--listen=:", "--admin-listen=:", "--upstream=http://127.0.0.1:"}
	if len(args) < len(want)+1 {
		return res, false, fmt.Errorf("its arguments %q are not the injector's", args)
	}
	ports := make([]int32, len(want))
	for i, prefix := range want {
		v, ok := strings.CutPrefix(args[i], prefix)
		n, perr := strconv.ParseUint(v, 10, 16)
		if !ok || perr != nil || n == 0 {
			return res, false, fmt.Errorf("its argument %d, %q, is not the injector's %s<port>", i, args[i], prefix)
		}
		ports[i] = int32(n)
	}
	h2c = slices.Contains(args, "--upstream-h2c")
	return Result{ListenPort: ports[0], AdminPort: ports[1], UpstreamPort: ports[2]}, h2c, nil
}

func mountNames(ms []corev1.VolumeMount) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name + ":" + m.MountPath
	}
	return out
}

// ports keeps what the injector sets of each port.
func ports(ps []corev1.ContainerPort) []corev1.ContainerPort {
	out := make([]corev1.ContainerPort, len(ps))
	for i, p := range ps {
		out[i] = corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol, HostPort: p.HostPort, HostIP: p.HostIP}
		if out[i].Protocol == "" {
			out[i].Protocol = corev1.ProtocolTCP
		}
	}
	return out
}

// undefaulted returns v without the modes the API server fills in.
func undefaulted(v corev1.Volume) corev1.Volume {
	v = *v.DeepCopy()
	switch {
	case v.Secret != nil:
		v.Secret.DefaultMode = nil
	case v.ConfigMap != nil:
		v.ConfigMap.DefaultMode = nil
	case v.DownwardAPI != nil:
		v.DownwardAPI.DefaultMode = nil
	case v.Projected != nil:
		v.Projected.DefaultMode = nil
	}
	return v
}

// restricted reports whether got grants no more than want: the settings
// the injector makes for the restricted profile, all present.
func restricted(got, want *corev1.SecurityContext) bool {
	if got == nil || want == nil {
		return got == want
	}
	if ptr.Deref(got.Privileged, true) || ptr.Deref(got.AllowPrivilegeEscalation, true) ||
		!ptr.Deref(got.ReadOnlyRootFilesystem, false) || !ptr.Deref(got.RunAsNonRoot, false) ||
		!reflect.DeepEqual(got.RunAsUser, want.RunAsUser) || !reflect.DeepEqual(got.RunAsGroup, want.RunAsGroup) ||
		!reflect.DeepEqual(got.Capabilities, want.Capabilities) || !reflect.DeepEqual(got.SeccompProfile, want.SeccompProfile) ||
		got.SELinuxOptions != nil || got.WindowsOptions != nil || got.AppArmorProfile != nil {
		return false
	}
	return true
}
