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

	It("reports the server version the binaries were stamped with", func(ctx SpecContext) {
		out, err := kubectl.Run(ctx, "version", "-o", "json")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(`"gitVersion": "v1.37.`))
		Expect(strings.Count(out, `"gitVersion"`)).To(Equal(2), "client and server versions: %s", out)
	})
})
