package injection

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// portRef is the application port the sidecar protects.
type portRef struct {
	number int32
	name   string
	// container and index locate the declared port; container is -1 when
	// the port is not declared.
	container, index int
}

func (p portRef) String() string {
	if p.name == "" {
		return strconv.Itoa(int(p.number))
	}
	return fmt.Sprintf("%s/%d", p.name, p.number)
}

// upstreamPort picks the application port, as the package documents.
func upstreamPort(pod *corev1.Pod) (portRef, error) {
	var declared []portRef
	for ci, c := range pod.Spec.Containers {
		for pi, p := range c.Ports {
			if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
				declared = append(declared, portRef{number: p.ContainerPort, name: p.Name, container: ci, index: pi})
			}
		}
	}
	describe := func() string {
		s := make([]string, len(declared))
		for i, d := range declared {
			s[i] = pod.Spec.Containers[d.container].Name + ":" + d.String()
		}
		return strings.Join(s, ", ")
	}
	if v, ok := pod.Annotations[AnnotationUpstreamPort]; ok {
		bad := func(reason string) error {
			return &AnnotationError{Annotation: AnnotationUpstreamPort, Value: v, Reason: reason}
		}
		if v != "" && v[0] >= '0' && v[0] <= '9' {
			port, err := parsePort(v)
			if err != nil {
				return portRef{}, bad(err.Error())
			}
			for _, d := range declared {
				if d.number == port {
					return d, nil
				}
			}
			// Containers need not declare the ports they listen on.
			return portRef{number: port, container: -1}, nil
		}
		for _, d := range declared {
			if d.name == v {
				return d, nil
			}
		}
		if len(declared) == 0 {
			return portRef{}, bad("unknown port: no container declares a TCP port")
		}
		return portRef{}, bad(fmt.Sprintf("unknown port: no container declares a TCP port of that name; declared: %s", describe()))
	}
	switch {
	case len(declared) == 1:
		return declared[0], nil
	case len(declared) == 0:
		return portRef{}, &AnnotationError{Reason: fmt.Sprintf(
			"the pod's containers declare no TCP port; set the annotation %s to the port the application listens on", AnnotationUpstreamPort)}
	}
	for _, d := range declared {
		if d.name == "http" {
			return d, nil
		}
	}
	return portRef{}, &AnnotationError{Reason: fmt.Sprintf(
		"the pod's containers declare several TCP ports (%s) and none is named http; set the annotation %s to the name or number of the one to rate-limit",
		describe(), AnnotationUpstreamPort)}
}

// parsePort parses a port number.
func parsePort(v string) (int32, error) {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return 0, errors.New("must be a port number between 1 and 65535")
	}
	return int32(n), nil
}

// usedPorts maps each port number that a container declares to a
// description of it. Every container shares the pod's network namespace,
// so init containers count too.
func usedPorts(pod *corev1.Pod) map[int32]string {
	used := map[int32]string{}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for _, p := range c.Ports {
				if _, ok := used[p.ContainerPort]; ok {
					continue
				}
				desc := fmt.Sprintf("port %d of container %q", p.ContainerPort, c.Name)
				if p.Name != "" {
					desc = fmt.Sprintf("port %d (%s) of container %q", p.ContainerPort, p.Name, c.Name)
				}
				used[p.ContainerPort] = desc
			}
		}
	}
	return used
}

// freePort returns the first port from start that used does not hold.
func freePort(used map[int32]string, start int32) int32 {
	p := start
	for used[p] != "" && p < 65535 {
		p++
	}
	return p
}

// takeOver renames the application's port so that the sidecar can take
// its name, rewrites the container's probes and lifecycle hooks that used
// the old name, and returns the new name.
func takeOver(pod *corev1.Pod, up portRef) (string, error) {
	names := map[string]bool{AdminPortName: true, UnnamedPortName: true}
	shared := false
	for _, c := range pod.Spec.InitContainers {
		for _, p := range c.Ports {
			names[p.Name] = true
			shared = shared || p.Name == up.name
		}
	}
	for ci, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			names[p.Name] = true
			shared = shared || (p.Name == up.name && ci != up.container)
		}
	}
	if shared {
		return "", &AnnotationError{Reason: fmt.Sprintf(
			"port name %q is declared by more than one container; the sidecar cannot take it over", up.name)}
	}
	renamed := ""
	for k := 1; k <= 9 && renamed == ""; k++ {
		prefix := RenamedPortPrefix
		if k > 1 {
			prefix = fmt.Sprintf("app%d-", k)
		}
		cand := strings.TrimRight(truncateName(prefix+up.name, maxPortNameLength), "-")
		if !names[cand] && len(validation.IsValidPortName(cand)) == 0 {
			renamed = cand
		}
	}
	if renamed == "" {
		return "", &AnnotationError{Reason: fmt.Sprintf("cannot find a free name for the application port %q", up.name)}
	}
	c := &pod.Spec.Containers[up.container]
	c.Ports[up.index].Name = renamed
	for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if pr != nil {
			renameHandler(&pr.HTTPGet, &pr.TCPSocket, up.name, renamed)
		}
	}
	if lc := c.Lifecycle; lc != nil {
		for _, h := range []*corev1.LifecycleHandler{lc.PostStart, lc.PreStop} {
			if h != nil {
				renameHandler(&h.HTTPGet, &h.TCPSocket, up.name, renamed)
			}
		}
	}
	return renamed, nil
}

func renameHandler(httpGet **corev1.HTTPGetAction, tcp **corev1.TCPSocketAction, from, to string) {
	if g := *httpGet; g != nil && g.Port.Type == intstr.String && g.Port.StrVal == from {
		g.Port = intstr.FromString(to)
	}
	if t := *tcp; t != nil && t.Port.Type == intstr.String && t.Port.StrVal == from {
		t.Port = intstr.FromString(to)
	}
}

func truncateName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
