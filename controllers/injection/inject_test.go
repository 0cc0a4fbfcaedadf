package injection

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/floodgate-dev/floodgate/controllers/counterstore"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

const image = "registry.example/floodgate-sidecar:v1"

func opts() Options { return DefaultOptions(image) }

// appPod is an opted-in pod whose one container serves "http" on 8080.
func appPod(annotations ...string) *corev1.Pod {
	ann := map[string]string{AnnotationInject: "true"}
	for i := 0; i+1 < len(annotations); i += 2 {
		ann[annotations[i]] = annotations[i+1]
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "api-0", Namespace: "shop", Labels: map[string]string{"app": "api"}, Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "app",
			Image: "registry.example/app:1",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		}}},
	}
}

func sidecarOf(t *testing.T, pod *corev1.Pod) corev1.Container {
	t.Helper()
	var found []corev1.Container
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if c.Name == config.ContainerName {
				found = append(found, c)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("the pod has %d sidecar containers, want exactly 1", len(found))
	}
	return found[0]
}

func mustInject(t *testing.T, pod *corev1.Pod, mounts ...Mount) (*corev1.Pod, Result) {
	t.Helper()
	out, res, err := Inject(pod, mounts, opts())
	if err != nil {
		t.Fatalf("Inject: %v", err)
	}
	return out, res
}

func TestInjectLeavesOtherPodsAlone(t *testing.T) {
	t.Parallel()
	for name, pod := range map[string]*corev1.Pod{
		"no annotation":    {Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}}},
		"annotation false": appPod(AnnotationInject, "false"),
		"annotation True":  appPod(AnnotationInject, "True"),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, res, err := Inject(pod, nil, opts())
			if err != nil || res.Injected || out != pod {
				t.Errorf("Inject = (%p, %+v, %v), want the same pod back, not injected", out, res, err)
			}
		})
	}
}

func TestInjectBuildsTheSidecar(t *testing.T) {
	t.Parallel()
	in := appPod()
	in.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "registry.example/migrate:1"}}
	orig := in.DeepCopy()
	out, res := mustInject(t, in)

	if !equality.Semantic.DeepEqual(in, orig) {
		t.Error("Inject modified its input")
	}
	if want := (Result{Injected: true, UpstreamPort: 8080, ListenPort: DefaultListenPort, AdminPort: DefaultAdminPort,
		PortName: "http", RenamedFrom: "http", RenamedTo: "app-http"}); res != want {
		t.Errorf("Result = %+v, want %+v", res, want)
	}
	if got := out.Spec.InitContainers[0].Name; got != config.ContainerName {
		t.Errorf("first init container is %q, want the sidecar, so that it starts before everything else", got)
	}
	if got := out.Labels[LabelInjected]; got != "true" {
		t.Errorf("label %s = %q, want \"true\" so that the PodMonitor finds the pod", LabelInjected, got)
	}
	for k, v := range orig.Labels {
		if out.Labels[k] != v {
			t.Errorf("label %s = %q, want the pod's own %q kept", k, out.Labels[k], v)
		}
	}
	if got := out.Spec.InitContainers[1].Name; got != "migrate" {
		t.Errorf("second init container is %q, want the pod's own", got)
	}
	c := sidecarOf(t, out)
	if c.Image != image {
		t.Errorf("image %q, want %q", c.Image, image)
	}
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("the sidecar is not a native sidecar (restartPolicy Always)")
	}
	wantArgs := []string{"--listen=:15080", "--admin-listen=:9090", "--upstream=http://127.0.0.1:8080", "--pod-labels-file=/etc/floodgate/podinfo/labels",
		"--state-dir=/var/run/floodgate/state"}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("args %q, want %q", c.Args, wantArgs)
	}
	wantPorts := []corev1.ContainerPort{
		{Name: "http", ContainerPort: 15080, Protocol: corev1.ProtocolTCP},
		{Name: AdminPortName, ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
	}
	if !equality.Semantic.DeepEqual(c.Ports, wantPorts) {
		t.Errorf("sidecar ports %+v, want %+v", c.Ports, wantPorts)
	}
	if got := out.Spec.Containers[0].Ports; len(got) != 1 || got[0].Name != "app-http" || got[0].ContainerPort != 8080 {
		t.Errorf("app ports %+v, want app-http/8080", got)
	}

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if env["FLOODGATE_KUBERNETES"].Value != "true" {
		t.Error("FLOODGATE_KUBERNETES is not true")
	}
	for name, field := range map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"} {
		if e := env[name]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != field {
			t.Errorf("%s is not the downward API's %s: %+v", name, field, e)
		}
	}
	if e, ok := env["FLOODGATE_REDIS_PASSWORD"]; ok {
		t.Errorf("the store password is in the environment (%+v): it could not follow a rotation", e)
	}
	if got, want := env["FLOODGATE_REDIS_PASSWORD_FILE"].Value, config.StoreAuthFile; got != want {
		t.Errorf("FLOODGATE_REDIS_PASSWORD_FILE = %q, want %q", got, want)
	}

	sc := c.SecurityContext
	if sc == nil || !*sc.RunAsNonRoot || *sc.RunAsUser != DefaultRunAsUser || !*sc.ReadOnlyRootFilesystem ||
		*sc.AllowPrivilegeEscalation || *sc.Privileged || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		len(sc.Capabilities.Add) != 0 || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("security context is not restricted: %+v", sc)
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.ReadinessProbe.HTTPGet.Port != intstr.FromString(AdminPortName) {
		t.Errorf("readiness probe %+v, want /readyz on %s", c.ReadinessProbe.HTTPGet, AdminPortName)
	}
	if got := c.Resources.Requests[corev1.ResourceMemory]; got.Cmp(resource.MustParse("64Mi")) != 0 {
		t.Errorf("memory request %s, want the default 64Mi", got.String())
	}

	if got := out.Spec.ServiceAccountName; got != "default" {
		t.Errorf("service account %q, want default: the projected token needs a named service account", got)
	}
	named := appPod()
	named.Spec.ServiceAccountName = "api"
	if out, _ := mustInject(t, named); out.Spec.ServiceAccountName != "api" {
		t.Errorf("service account %q, want the pod's own", out.Spec.ServiceAccountName)
	}
	if !slices.Contains(out.Spec.ReadinessGates, corev1.PodReadinessGate{ConditionType: config.ConditionPolicyLoaded}) {
		t.Errorf("readiness gates %+v lack %s", out.Spec.ReadinessGates, config.ConditionPolicyLoaded)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
		// Only the sidecar's own state is written.
		if !m.ReadOnly && m.Name != StateVolume {
			t.Errorf("mount %s is writable", m.Name)
		}
	}
	if mounts[PodInfoVolume] != config.PodInfoDir || mounts[APIAccessVolume] != ServiceAccountDir || mounts[StoreAuthVolume] != config.StoreAuthDir ||
		mounts[StateVolume] != config.StateDir {
		t.Errorf("mounts %v", mounts)
	}
	// The last good config survives a restart of the sidecar's container
	// in an emptyDir of its own, in memory and bounded.
	var state *corev1.Volume
	for i := range out.Spec.Volumes {
		if out.Spec.Volumes[i].Name == StateVolume {
			state = &out.Spec.Volumes[i]
		}
	}
	if state == nil || state.EmptyDir == nil || state.EmptyDir.Medium != corev1.StorageMediumMemory || state.EmptyDir.SizeLimit == nil {
		t.Errorf("state volume %+v, want a bounded in-memory emptyDir", state)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range out.Spec.Volumes {
		vols[v.Name] = v
	}
	if v := vols[PodInfoVolume]; v.DownwardAPI == nil || v.DownwardAPI.Items[0].Path != "labels" ||
		v.DownwardAPI.Items[0].FieldRef.FieldPath != "metadata.labels" {
		t.Errorf("podinfo volume %+v is not the labels file", v)
	}
	if v := vols[APIAccessVolume]; v.Projected == nil || v.Projected.Sources[0].ServiceAccountToken == nil {
		t.Errorf("api access volume %+v has no service account token", v)
	}
	// Optional: the pod starts before the manager mirrors the Secret.
	if v := vols[StoreAuthVolume]; v.Secret == nil || v.Secret.SecretName != StoreAuthSecret || v.Secret.Optional == nil || !*v.Secret.Optional ||
		len(v.Secret.Items) != 3 || v.Secret.Items[0] != (corev1.KeyToPath{Key: config.StoreAuthKey, Path: config.StoreAuthKey}) ||
		v.Secret.Items[1] != (corev1.KeyToPath{Key: config.StoreAuthUserKey, Path: config.StoreAuthUserKey}) ||
		v.Secret.Items[2] != (corev1.KeyToPath{Key: config.StoreCAKey, Path: config.StoreCAKey}) {
		t.Errorf("store auth volume %+v is not the optional Secret %s with its %s, %s and %s keys", v, StoreAuthSecret, config.StoreAuthKey, config.StoreAuthUserKey, config.StoreCAKey)
	}
	// The compiled config's store.tls.caFile is that key's file.
	if got := path.Join(mounts[StoreAuthVolume], config.StoreCAKey); got != config.StoreCAFile {
		t.Errorf("the sidecar has the CA bundle at %s, the compiled config names %s", got, config.StoreCAFile)
	}
}

func TestInjectIsIdempotent(t *testing.T) {
	t.Parallel()
	once, _ := mustInject(t, appPod())
	twice, res, err := Inject(once, nil, opts())
	if err != nil || res.Injected || twice != once {
		t.Fatalf("second Inject = (%+v, %v), want the pod back unchanged", res, err)
	}
	// A pod the user wrote with a floodgate-sidecar container of its own
	// is not: it would pose as the sidecar.
	own := appPod()
	own.Spec.Containers = append(own.Spec.Containers, corev1.Container{Name: config.ContainerName, Image: "mine"})
	if _, _, err := Inject(own, nil, opts()); err == nil || !strings.Contains(err.Error(), "not the one floodgate injects") {
		t.Errorf("Inject on a pod with its own sidecar container: %v, want it rejected", err)
	}
	// The readiness gate is not added twice.
	gated := appPod()
	gated.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: config.ConditionPolicyLoaded}}
	out, _ := mustInject(t, gated)
	if n := len(out.Spec.ReadinessGates); n != 1 {
		t.Errorf("%d readiness gates, want 1", n)
	}
}

func TestInjectRewritesProbesThatNameTheTakenPort(t *testing.T) {
	t.Parallel()
	in := appPod()
	app := &in.Spec.Containers[0]
	app.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}}
	app.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}}}
	app.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(8080)}}}
	app.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("http")}}}
	out, _ := mustInject(t, in)
	got := out.Spec.Containers[0]
	if p := got.ReadinessProbe.HTTPGet.Port; p != intstr.FromString("app-http") {
		t.Errorf("readiness probe port %v, want app-http", p.String())
	}
	if p := got.LivenessProbe.TCPSocket.Port; p != intstr.FromString("app-http") {
		t.Errorf("liveness probe port %v, want app-http", p.String())
	}
	if p := got.StartupProbe.HTTPGet.Port; p != intstr.FromInt32(8080) {
		t.Errorf("numeric startup probe port changed to %v", p.String())
	}
	if p := got.Lifecycle.PreStop.HTTPGet.Port; p != intstr.FromString("app-http") {
		t.Errorf("preStop port %v, want app-http", p.String())
	}
}

func TestInjectChoosesPorts(t *testing.T) {
	t.Parallel()
	multi := func(annotations ...string) *corev1.Pod {
		p := appPod(annotations...)
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9100}, {Name: "web", ContainerPort: 8080}}
		return p
	}
	unnamed := appPod()
	unnamed.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 3000}}
	withHTTP := appPod()
	withHTTP.Spec.Containers[0].Ports = append(withHTTP.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "grpc", ContainerPort: 9000})
	adminTaken := appPod()
	adminTaken.Spec.Containers = append(adminTaken.Spec.Containers, corev1.Container{Name: "prom", Ports: []corev1.ContainerPort{{Name: "prom", ContainerPort: 9090}}})
	listenTaken := appPod()
	listenTaken.Spec.Containers = append(listenTaken.Spec.Containers, corev1.Container{Name: "x", Ports: []corev1.ContainerPort{{Name: "x", ContainerPort: 15080}}})
	udp := appPod()
	udp.Spec.Containers[0].Ports = append(udp.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP})
	prefixTaken := appPod()
	prefixTaken.Spec.Containers[0].Ports = append(prefixTaken.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "app-http", ContainerPort: 8081})
	longName := appPod()
	longName.Spec.Containers[0].Ports[0].Name = "metrics-backend"

	tests := []struct {
		name string
		pod  *corev1.Pod
		want Result
	}{
		{"upstream by name", multi(AnnotationUpstreamPort, "web"),
			Result{UpstreamPort: 8080, ListenPort: 15080, AdminPort: 9090, PortName: "web", RenamedFrom: "web", RenamedTo: "app-web"}},
		{"upstream by declared number", multi(AnnotationUpstreamPort, "9100"),
			Result{UpstreamPort: 9100, ListenPort: 15080, AdminPort: 9090, PortName: "metrics", RenamedFrom: "metrics", RenamedTo: "app-metrics"}},
		{"upstream by undeclared number", appPod(AnnotationUpstreamPort, "7000"),
			Result{UpstreamPort: 7000, ListenPort: 15080, AdminPort: 9090, PortName: UnnamedPortName}},
		{"the only port, unnamed", unnamed,
			Result{UpstreamPort: 3000, ListenPort: 15080, AdminPort: 9090, PortName: UnnamedPortName}},
		{"several ports, one named http", withHTTP,
			Result{UpstreamPort: 8080, ListenPort: 15080, AdminPort: 9090, PortName: "http", RenamedFrom: "http", RenamedTo: "app-http"}},
		{"UDP ports do not count", udp,
			Result{UpstreamPort: 8080, ListenPort: 15080, AdminPort: 9090, PortName: "http", RenamedFrom: "http", RenamedTo: "app-http"}},
		{"explicit listen port", appPod(AnnotationListenPort, "8000"),
			Result{UpstreamPort: 8080, ListenPort: 8000, AdminPort: 9090, PortName: "http", RenamedFrom: "http", RenamedTo: "app-http"}},
		{"listen port 9090 moves the admin port", appPod(AnnotationListenPort, "9090"),
			Result{UpstreamPort: 8080, ListenPort: 9090, AdminPort: 15090, PortName: "http", RenamedFrom: "http", RenamedTo: "app-http"}},
		{"the application uses 9090", adminTaken,
			Result{UpstreamPort: 8080, ListenPort: 15080, AdminPort: 15090, PortName: "http", RenamedFrom: "http", RenamedTo: "app-http"}},
		{"the default listen port is taken", listenTaken,
			Result{UpstreamPort: 8080, ListenPort: 15081, AdminPort: 9090, PortName: "http", RenamedFrom: "http", RenamedTo: "app-http"}},
		{"the renamed port's name is taken", prefixTaken,
			Result{UpstreamPort: 8080, ListenPort: 15080, AdminPort: 9090, PortName: "http", RenamedFrom: "http", RenamedTo: "app2-http"}},
		{"a long name is cut to 15 characters", longName,
			Result{UpstreamPort: 8080, ListenPort: 15080, AdminPort: 9090, PortName: "metrics-backend", RenamedFrom: "metrics-backend", RenamedTo: "app-metrics-bac"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, res := mustInject(t, tt.pod)
			tt.want.Injected = true
			if res != tt.want {
				t.Errorf("Result = %+v, want %+v", res, tt.want)
			}
			c := sidecarOf(t, out)
			if c.Ports[0].Name != tt.want.PortName || c.Ports[0].ContainerPort != tt.want.ListenPort || c.Ports[1].ContainerPort != tt.want.AdminPort {
				t.Errorf("sidecar ports %+v do not match %+v", c.Ports, tt.want)
			}
		})
	}
}

func TestInjectRejectsImpossibleRequests(t *testing.T) {
	t.Parallel()
	noPorts := appPod()
	noPorts.Spec.Containers[0].Ports = nil
	several := appPod()
	several.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "a", ContainerPort: 1}, {Name: "b", ContainerPort: 2}}
	volume := appPod()
	volume.Spec.Volumes = []corev1.Volume{{Name: PodInfoVolume}}
	shared := appPod()
	shared.Spec.Containers = append(shared.Spec.Containers, corev1.Container{Name: "other", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8081}}})
	admin := appPod()
	admin.Spec.Containers[0].Ports[0].Name = AdminPortName

	tests := []struct {
		name string
		pod  *corev1.Pod
		want []string
	}{
		{"unknown port name", appPod(AnnotationUpstreamPort, "web"),
			[]string{`annotation floodgate.dev/upstream-port: "web": unknown port`, `app:http/8080`}},
		{"port out of range", appPod(AnnotationUpstreamPort, "70000"),
			[]string{`annotation floodgate.dev/upstream-port: "70000": must be a port number between 1 and 65535`}},
		{"listen port collides with the application", appPod(AnnotationListenPort, "8080"),
			[]string{`annotation floodgate.dev/listen-port: "8080": collides with port 8080 (http) of container "app"`}},
		{"listen port not a number", appPod(AnnotationListenPort, "http"),
			[]string{`annotation floodgate.dev/listen-port: "http": must be a port number`}},
		{"bad quantity", appPod(AnnotationCPURequest, "lots"),
			[]string{`annotation floodgate.dev/sidecar-cpu-request: "lots": not a Kubernetes quantity`}},
		{"negative quantity", appPod(AnnotationMemoryLimit, "-1Mi"),
			[]string{`annotation floodgate.dev/sidecar-memory-limit: "-1Mi": must be positive`}},
		{"request above limit", appPod(AnnotationMemoryRequest, "1Gi", AnnotationMemoryLimit, "128Mi"),
			[]string{`annotation floodgate.dev/sidecar-memory-request: "1Gi": the memory request exceeds the limit 128Mi`}},
		{"bad h2c flag", appPod(AnnotationUpstreamH2C, "yes please"),
			[]string{`annotation floodgate.dev/upstream-h2c: "yes please": must be true or false`}},
		{"no port declared", noPorts, []string{"declare no TCP port", AnnotationUpstreamPort}},
		{"several ports, none http", several, []string{"several TCP ports (app:a/1, app:b/2)", AnnotationUpstreamPort}},
		{"volume name taken", volume, []string{`already has a volume named "floodgate-podinfo"`}},
		{"port name in two containers", shared, []string{`port name "http" is declared by more than one container`}},
		{"port named like the admin port", admin, []string{`named "fg-admin"`}},
		{"every problem at once", appPod(AnnotationListenPort, "8080", AnnotationCPULimit, "x", AnnotationUpstreamPort, "nope"),
			[]string{"listen-port", "sidecar-cpu-limit", "upstream-port"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, _, err := Inject(tt.pod, nil, opts())
			if err == nil {
				t.Fatalf("Inject accepted the pod; sidecar %+v", sidecarOf(t, out))
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			var ae *AnnotationError
			if !errors.As(err, &ae) {
				t.Errorf("error %v is not an *AnnotationError", err)
			}
		})
	}
}

func TestInjectResources(t *testing.T) {
	t.Parallel()
	out, _ := mustInject(t, appPod(AnnotationCPURequest, "200m", AnnotationCPULimit, "1", AnnotationMemoryRequest, "100Mi", AnnotationMemoryLimit, "300Mi"))
	r := sidecarOf(t, out).Resources
	for _, c := range []struct {
		got  resource.Quantity
		want string
	}{
		{r.Requests[corev1.ResourceCPU], "200m"}, {r.Limits[corev1.ResourceCPU], "1"},
		{r.Requests[corev1.ResourceMemory], "100Mi"}, {r.Limits[corev1.ResourceMemory], "300Mi"},
	} {
		if c.got.Cmp(resource.MustParse(c.want)) != 0 {
			t.Errorf("resource %s, want %s", c.got.String(), c.want)
		}
	}

	// A limit below the default request lowers the request.
	out, _ = mustInject(t, appPod(AnnotationMemoryLimit, "32Mi"))
	r = sidecarOf(t, out).Resources
	if got := r.Requests[corev1.ResourceMemory]; got.Cmp(resource.MustParse("32Mi")) != 0 {
		t.Errorf("memory request %s, want 32Mi, lowered to the limit", got.String())
	}
	if _, ok := r.Limits[corev1.ResourceCPU]; ok {
		t.Error("a CPU limit appeared without being asked for")
	}
}

func TestInjectMountsPolicyKeys(t *testing.T) {
	t.Parallel()
	out, _ := mustInject(t, appPod(), Mount{Secret: true, Name: "jwt-hmac"}, Mount{Name: "jwks"}, Mount{Secret: true, Name: "jwt-hmac"})
	c := sidecarOf(t, out)
	paths := map[string]string{}
	for _, m := range c.VolumeMounts {
		paths[m.MountPath] = m.Name
	}
	vols := map[string]corev1.Volume{}
	for _, v := range out.Spec.Volumes {
		vols[v.Name] = v
	}
	sv, ok := vols[paths["/var/run/floodgate/secrets/jwt-hmac"]]
	if !ok || sv.Secret == nil || sv.Secret.SecretName != "jwt-hmac" || !*sv.Secret.Optional {
		t.Errorf("no optional Secret volume for jwt-hmac at the compiler's path: %+v", sv)
	}
	cv, ok := vols[paths["/var/run/floodgate/configmaps/jwks"]]
	if !ok || cv.ConfigMap == nil || cv.ConfigMap.Name != "jwks" || !*cv.ConfigMap.Optional {
		t.Errorf("no optional ConfigMap volume for jwks at the compiler's path: %+v", cv)
	}
	if n := len(out.Spec.Volumes); n != 6 {
		t.Errorf("%d volumes, want 6 (podinfo, api access, store auth, state, one Secret, one ConfigMap; duplicates merged)", n)
	}
}

func TestInjectH2C(t *testing.T) {
	t.Parallel()
	out, _ := mustInject(t, appPod(AnnotationUpstreamH2C, "true"))
	if !slices.Contains(sidecarOf(t, out).Args, "--upstream-h2c") {
		t.Error("--upstream-h2c missing")
	}
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	if err := opts().Validate(); err != nil {
		t.Fatalf("default options: %v", err)
	}
	bad := Options{ImagePullPolicy: "Sometimes", RunAsUser: 0, Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
	}}
	err := bad.Validate()
	for _, w := range []string{"image is empty", "Sometimes", "non-root", "cpu request 2 exceeds the limit 1"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate() = %v, want it to mention %q", err, w)
		}
	}
	if _, _, err := Inject(appPod(), nil, bad); err == nil {
		t.Error("Inject accepted invalid options")
	}
}

// TestLookAlikeSidecarIsRejected tampers with an injected pod in every way
// that could make a container pose as floodgate's sidecar: each is
// rejected, naming what differs, while the injector's own pod passes, also
// with the fields the API server defaults filled in.
func TestLookAlikeSidecarIsRejected(t *testing.T) {
	t.Parallel()
	mounts := []Mount{{Secret: true, Name: "jwt-key"}, {Name: "jwks"}}
	base := appPod()
	base.Annotations[AnnotationMemoryLimit] = "300Mi"
	injected, _, err := Inject(base, mounts, opts())
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifySidecar(injected, mounts, opts()); err != nil {
		t.Fatalf("the injector's own pod: %v", err)
	}
	// What the API server adds before admission.
	defaulted := injected.DeepCopy()
	sc := &defaulted.Spec.InitContainers[0]
	sc.ImagePullPolicy = corev1.PullIfNotPresent
	sc.TerminationMessagePath = "/dev/termination-log"
	sc.ReadinessProbe.SuccessThreshold = 1
	sc.ReadinessProbe.HTTPGet.Scheme = corev1.URISchemeHTTP
	for i := range defaulted.Spec.Volumes {
		v := &defaulted.Spec.Volumes[i]
		switch {
		case v.Secret != nil:
			v.Secret.DefaultMode = ptr.To[int32](0o644)
		case v.ConfigMap != nil:
			v.ConfigMap.DefaultMode = ptr.To[int32](0o644)
		case v.Projected != nil:
			v.Projected.DefaultMode = ptr.To[int32](0o644)
		case v.DownwardAPI != nil:
			v.DownwardAPI.DefaultMode = ptr.To[int32](0o644)
		}
	}
	if out, res, err := Inject(defaulted, mounts, opts()); err != nil || res.Injected || out != defaulted {
		t.Fatalf("a defaulted injected pod: (%+v, %v), want it admitted unchanged", res, err)
	}

	for _, tc := range []struct {
		name   string
		tamper func(p *corev1.Pod)
		want   string
	}{
		{"another image", func(p *corev1.Pod) { p.Spec.InitContainers[0].Image = "evil/sidecar:1" }, `image "evil/sidecar:1"`},
		{"a command", func(p *corev1.Pod) { p.Spec.InitContainers[0].Command = []string{"sh", "-c", "sleep inf"} }, "command"},
		{"an extra argument", func(p *corev1.Pod) {
			p.Spec.InitContainers[0].Args = append(p.Spec.InitContainers[0].Args, "--store=memory")
		}, "arguments"},
		{"another upstream", func(p *corev1.Pod) { p.Spec.InitContainers[0].Args[2] = "--upstream=http://evil.example:80" }, "argument 2"},
		{"an environment variable", func(p *corev1.Pod) {
			c := &p.Spec.InitContainers[0]
			c.Env = append(c.Env, corev1.EnvVar{Name: "FLOODGATE_STORE", Value: "memory"})
		}, "environment"},
		{"env from a Secret", func(p *corev1.Pod) {
			c := &p.Spec.InitContainers[0]
			c.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "db"}}}}
		}, "environment"},
		{"an extra mount", func(p *corev1.Pod) {
			c := &p.Spec.InitContainers[0]
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "db", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db"}}})
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "db", MountPath: "/db"})
		}, "volume mounts"},
		{"the store password from another Secret", func(p *corev1.Pod) {
			for i := range p.Spec.Volumes {
				if p.Spec.Volumes[i].Name == StoreAuthVolume {
					p.Spec.Volumes[i].Secret.SecretName = "admin-password"
				}
			}
		}, `volume "floodgate-store-auth"`},
		{"a writable root file system", func(p *corev1.Pod) {
			p.Spec.InitContainers[0].SecurityContext.ReadOnlyRootFilesystem = ptr.To(false)
		}, "security context"},
		{"privileged", func(p *corev1.Pod) { p.Spec.InitContainers[0].SecurityContext.Privileged = ptr.To(true) }, "security context"},
		{"no restart policy", func(p *corev1.Pod) { p.Spec.InitContainers[0].RestartPolicy = nil }, "restart policy"},
		{"a host port", func(p *corev1.Pod) { p.Spec.InitContainers[0].Ports[0].HostPort = 80 }, "ports"},
		{"other resources", func(p *corev1.Pod) {
			p.Spec.InitContainers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("8Gi")
		}, "resources"},
		{"a regular container", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, p.Spec.InitContainers[0])
			p.Spec.InitContainers = p.Spec.InitContainers[1:]
		}, "regular container"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := defaulted.DeepCopy()
			tc.tamper(p)
			_, _, err := Inject(p, mounts, opts())
			var ae *AnnotationError
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), "not the one floodgate injects") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Inject = %v, want a rejection naming %q", err, tc.want)
			}
		})
	}
	// Not opted in: not looked at.
	plain := defaulted.DeepCopy()
	delete(plain.Annotations, AnnotationInject)
	plain.Spec.InitContainers[0].Image = "evil/sidecar:1"
	if out, _, err := Inject(plain, mounts, opts()); err != nil || out != plain {
		t.Errorf("a pod that is not opted in: %v, want it left alone", err)
	}
}

// TestPodLabelsPolicyKnowsTheInjector pins the names that the
// ValidatingAdmissionPolicy floodgate-pod-labels (config/webhook, copied
// into the Helm chart) reads to tell an injected pod: what Inject writes
// and where the webhook never runs. A renamed constant must be renamed
// there too, or every injected pod would be refused.
func TestPodLabelsPolicyKnowsTheInjector(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "webhook", "pod_labels_policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	policy := string(raw)
	quoted := make([]string, len(SystemNamespaces))
	for i, ns := range SystemNamespaces {
		quoted[i] = "'" + ns + "'"
	}
	for what, want := range map[string]string{
		"the label":                        "'" + LabelInjected + "' in object.metadata.labels",
		"its value":                        "object.metadata.labels['" + LabelInjected + "'] != 'true'",
		"the opt-in annotation":            "object.metadata.annotations['" + AnnotationInject + "'] == 'true'",
		"the sidecar container":            "object.spec.initContainers.exists(c, c.name == '" + config.ContainerName + "')",
		"the webhook's name":               "w.name == 'inject.floodgate.dev'",
		"the namespaces never injected":    "request.namespace in [" + strings.Join(quoted, ", ") + "]",
		"the injector's default config":    "name: floodgate-sidecar-injector",
		"the label the binding selects":    "key: " + LabelInjected,
		"the store's trusted client label": "'" + counterstore.StoreClientLabel + "' in object.metadata.labels",
	} {
		if !strings.Contains(policy, want) {
			t.Errorf("config/webhook/pod_labels_policy.yaml does not check %s: no %q", what, want)
		}
	}
	pod, _, err := Inject(appPod(), nil, opts())
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelInjected] != "true" || pod.Spec.InitContainers[0].Name != config.ContainerName {
		t.Errorf("Inject wrote label %q and first init container %q, which the policy does not admit", pod.Labels[LabelInjected], pod.Spec.InitContainers[0].Name)
	}
}
