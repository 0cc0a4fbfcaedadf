package envtestsmoke

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
)

var _ = Describe("the local control plane", func() {
	It("stores a namespace and a ConfigMap that the real kubectl reads back", func(ctx SpecContext) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "smoke-" + rand.String(6)}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())

		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "greeting", Namespace: ns.Name},
			Data:       map[string]string{"hello": "floodgate"},
		}
		Expect(k8sClient.Create(ctx, cm)).To(Succeed())

		out, err := kubectl.Run(ctx, "get", "namespace", ns.Name, "-o", "jsonpath={.status.phase}")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("Active"))

		out, err = kubectl.Run(ctx, "-n", ns.Name, "get", "configmap", "greeting", "-o", "jsonpath={.data.hello}")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("floodgate"))
	})

	It("installs config/default with kubectl apply -k", func(ctx SpecContext) {
		out, err := kubectl.Run(ctx, "apply", "-k", "../../config/default")
		Expect(err).NotTo(HaveOccurred(), out)
		DeferCleanup(func(ctx SpecContext) {
			out, err := kubectl.Run(ctx, "delete", "-k", "../../config/default", "--wait=false", "--ignore-not-found")
			Expect(err).NotTo(HaveOccurred(), out)
		})
		for _, obj := range []string{"deployment/floodgate-manager", "service/floodgate-webhook", "serviceaccount/floodgate-manager"} {
			out, err := kubectl.Run(ctx, "-n", "floodgate-system", "get", obj, "-o", "name")
			Expect(err).NotTo(HaveOccurred(), out)
		}
		// The webhook configurations carry the names the manager's flags
		// default to, and call the Service in the install namespace.
		out, err = kubectl.Run(ctx, "get", "mutatingwebhookconfiguration", "floodgate-sidecar-injector",
			"-o", "jsonpath={.webhooks[0].clientConfig.service.namespace}/{.webhooks[0].clientConfig.service.name}")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("floodgate-system/floodgate-webhook"))
		out, err = kubectl.Run(ctx, "get", "validatingwebhookconfiguration", "floodgate-policy-validator",
			"-o", "jsonpath={.webhooks[0].clientConfig.service.namespace}/{.webhooks[0].clientConfig.service.name}")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("floodgate-system/floodgate-webhook"))
		// The pod labels policy reads the injector's configuration.
		for _, b := range []string{"floodgate-pod-labels-injected", "floodgate-pod-labels-store-client"} {
			out, err = kubectl.Run(ctx, "get", "validatingadmissionpolicybinding", b, "-o", "jsonpath={.spec.policyName} {.spec.paramRef.name}")
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(out).To(Equal("floodgate-pod-labels floodgate-sidecar-injector"))
		}
		for _, crd := range []string{"ratelimitpolicies.ratelimit.floodgate.dev", "counterstores.ratelimit.floodgate.dev"} {
			out, err := kubectl.Run(ctx, "wait", "--for=condition=Established", "--timeout=30s", "crd/"+crd)
			Expect(err).NotTo(HaveOccurred(), out)
		}
		// The manager's Deployment mounts a writable /tmp for the
		// self-managed webhook certificate and exposes the webhook port.
		out, err = kubectl.Run(ctx, "-n", "floodgate-system", "get", "deployment", "floodgate-manager",
			"-o", "jsonpath={.spec.template.spec.containers[0].ports[*].containerPort} {.spec.template.spec.containers[0].volumeMounts[*].mountPath}")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("9443"))
		Expect(out).To(ContainSubstring("/tmp"))
		// A managed store's NetworkPolicy admits the manager by a label.
		out, err = kubectl.Run(ctx, "-n", "floodgate-system", "get", "deployment", "floodgate-manager",
			"-o", `jsonpath={.spec.template.metadata.labels.ratelimit\.floodgate\.dev/store-client}`)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("true"))
	})

	It("reports the server version the binaries were stamped with", func(ctx SpecContext) {
		out, err := kubectl.Run(ctx, "version", "-o", "json")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(`"gitVersion": "v1.37.`))
		Expect(strings.Count(out, `"gitVersion"`)).To(Equal(2), "client and server versions: %s", out)
	})
})
