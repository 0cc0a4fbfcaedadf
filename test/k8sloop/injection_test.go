package k8sloop

import (
	"encoding/json"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

func intstrName(name string) intstr.IntOrString { return intstr.FromString(name) }

// sidecars returns the containers named floodgate-sidecar of a pod.
func sidecars(pod *corev1.Pod) []corev1.Container {
	var out []corev1.Container
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if c.Name == config.ContainerName {
				out = append(out, c)
			}
		}
	}
	return out
}

var _ = Describe("the sidecar injector", func() {
	It("gives an annotated pod exactly one sidecar, which the restricted Pod Security profile admits", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		manifest, err := yaml.Marshal(appPod(ns, "api-0", true))
		Expect(err).NotTo(HaveOccurred())
		out, err := kubectl.RunWithInput(ctx, manifest, "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring("pod/api-0 created"))

		var pod corev1.Pod
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "api-0"}, &pod)).To(Succeed())
		sc := sidecars(&pod)
		Expect(sc).To(HaveLen(1), "exactly one sidecar")
		Expect(pod.Spec.InitContainers[0].Name).To(Equal(config.ContainerName), "a native sidecar, first of the init containers")
		c := sc[0]
		Expect(c.Image).To(Equal(sidecarImage))
		Expect(c.RestartPolicy).To(HaveValue(Equal(corev1.ContainerRestartPolicyAlways)))
		Expect(c.Args).To(Equal([]string{"--listen=:15080", "--admin-listen=:9090", "--upstream=http://127.0.0.1:8080",
			"--pod-labels-file=/etc/floodgate/podinfo/labels", "--state-dir=/var/run/floodgate/state"}))
		Expect(c.Ports).To(ConsistOf(
			corev1.ContainerPort{Name: "http", ContainerPort: 15080, Protocol: corev1.ProtocolTCP},
			corev1.ContainerPort{Name: "fg-admin", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
		))
		By("taking over the port name, so Services that target http reach the sidecar")
		Expect(pod.Spec.Containers[0].Ports).To(Equal([]corev1.ContainerPort{{Name: "app-http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}))
		Expect(pod.Spec.Containers[0].ReadinessProbe.HTTPGet.Port).To(Equal(intstr.FromString("app-http")),
			"the application's probe follows its renamed port")
		Expect(pod.Spec.ReadinessGates).To(ContainElement(corev1.PodReadinessGate{ConditionType: config.ConditionPolicyLoaded}))
		sec := c.SecurityContext
		Expect(sec.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(sec.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
		Expect(sec.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(sec.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
		Expect(sec.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
		env := map[string]corev1.EnvVar{}
		for _, e := range c.Env {
			env[e.Name] = e
		}
		Expect(env["POD_NAME"].ValueFrom.FieldRef.FieldPath).To(Equal("metadata.name"))
		Expect(env["POD_NAMESPACE"].ValueFrom.FieldRef.FieldPath).To(Equal("metadata.namespace"))
		Expect(env).NotTo(HaveKey("FLOODGATE_REDIS_PASSWORD"), "the password comes from a file that follows rotations")
		Expect(env["FLOODGATE_REDIS_PASSWORD_FILE"].Value).To(Equal("/etc/floodgate/store-auth/password"))
		Expect(env["FLOODGATE_REDIS_USERNAME_FILE"].Value).To(Equal("/etc/floodgate/store-auth/username"))
		Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: injection.PodInfoVolume, MountPath: "/etc/floodgate/podinfo", ReadOnly: true}))
		Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: injection.StoreAuthVolume, MountPath: "/etc/floodgate/store-auth", ReadOnly: true}))

		By("showing the sidecar to kubectl")
		names, err := kubectl.Run(ctx, "get", "pod", "api-0", "-n", ns, "-o", "jsonpath={.spec.initContainers[*].name} {.spec.containers[*].name}")
		Expect(err).NotTo(HaveOccurred())
		Expect(names).To(Equal("floodgate-sidecar app"))

		By("adding no second sidecar when the injected pod is admitted again")
		again := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "api-1", Namespace: ns, Labels: pod.Labels, Annotations: pod.Annotations},
			Spec:       *pod.Spec.DeepCopy(),
		}
		Expect(k8sClient.Create(ctx, again)).To(Succeed())
		Expect(sidecars(again)).To(HaveLen(1))
		Expect(equality.Semantic.DeepEqual(again.Spec.InitContainers, pod.Spec.InitContainers)).To(BeTrue(), "the second admission changed nothing")
		Expect(again.Spec.Containers[0].Ports[0].Name).To(Equal("app-http"), "no second rename")
	})

	It("leaves un-annotated pods, kube-system pods and the manager's namespace alone", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		for _, tc := range []struct {
			ns, name  string
			annotated bool
		}{
			{ns, "plain", false},
			{"kube-system", "system-" + strings.ToLower(ns), true},
			{managerNamespace, "manager-" + strings.ToLower(ns), true},
		} {
			pod := appPod(tc.ns, tc.name, tc.annotated)
			want := pod.Spec.DeepCopy()
			Expect(k8sClient.Create(ctx, pod)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pod))).To(Succeed()) })
			Expect(sidecars(pod)).To(BeEmpty(), "pod %s/%s got a sidecar", tc.ns, tc.name)
			Expect(pod.Spec.Containers[0].Ports[0].Name).To(Equal("http"))
			Expect(pod.Spec.ReadinessGates).To(BeEmpty())
			Expect(pod.Spec.Containers[0].Ports).To(HaveLen(len(want.Containers[0].Ports)))
		}
	})

	It("rejects pods whose annotations ask for something impossible, naming the annotation", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		cases := []struct {
			annotations map[string]string
			want        string
		}{
			{map[string]string{injection.AnnotationListenPort: "8080"},
				`annotation floodgate.dev/listen-port: "8080": collides with port 8080 (http) of container "app"`},
			{map[string]string{injection.AnnotationUpstreamPort: "grpc"},
				`annotation floodgate.dev/upstream-port: "grpc": unknown port: no container declares a TCP port of that name; declared: app:http/8080`},
			{map[string]string{injection.AnnotationMemoryLimit: "lots"},
				`annotation floodgate.dev/sidecar-memory-limit: "lots": not a Kubernetes quantity`},
			{map[string]string{injection.AnnotationCPURequest: "2", injection.AnnotationCPULimit: "1"},
				`annotation floodgate.dev/sidecar-cpu-request: "2": the cpu request exceeds the limit 1`},
		}
		for i, tc := range cases {
			pod := appPod(ns, "bad-"+string(rune('a'+i)), true)
			for k, v := range tc.annotations {
				pod.Annotations[k] = v
			}
			manifest, err := json.Marshal(pod)
			Expect(err).NotTo(HaveOccurred())
			out, err := kubectl.RunWithInput(ctx, manifest, "apply", "-f", "-")
			Expect(err).To(HaveOccurred(), "kubectl accepted %v", tc.annotations)
			Expect(out).To(ContainSubstring(`admission webhook "inject.floodgate.dev" denied the request: floodgate sidecar injection: ` + tc.want))
			AddReportEntry("injection rejection", out)
		}
	})
})
