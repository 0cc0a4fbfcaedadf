package k8sloop

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/controllers/webhookcert"
)

var netDialer = net.Dialer{Timeout: 5 * time.Second}

// servedCertificate is the certificate the webhook server presents now.
func servedCertificate() (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&netDialer, "tcp", webhookAddr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the certificate, trusts nothing
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// caBundles returns the CAs of the two webhook configurations' caBundles.
func caBundles(ctx context.Context) ([]*x509.Certificate, []*x509.Certificate) {
	var m admissionregistrationv1.MutatingWebhookConfiguration
	Expect(k8sClient.Get(ctx, client.ObjectKey{Name: injectorConfig}, &m)).To(Succeed())
	var v admissionregistrationv1.ValidatingWebhookConfiguration
	Expect(k8sClient.Get(ctx, client.ObjectKey{Name: validatorConfig}, &v)).To(Succeed())
	return parsePEM(m.Webhooks[0].ClientConfig.CABundle), parsePEM(v.Webhooks[0].ClientConfig.CABundle)
}

func parsePEM(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		c, err := x509.ParseCertificate(b.Bytes)
		Expect(err).NotTo(HaveOccurred())
		out = append(out, c)
	}
}

var _ = Describe("the self-managed webhook certificate", func() {
	It("rotates the whole chain on request while admissions keep succeeding", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		before, err := servedCertificate()
		Expect(err).NotTo(HaveOccurred())
		mb, vb := caBundles(ctx)
		Expect(mb).To(HaveLen(1))
		Expect(vb).To(Equal(mb))
		Expect(before.CheckSignatureFrom(mb[0])).To(Succeed(), "the served certificate is signed by the caBundle's CA")
		oldCA := mb[0]

		By("hammering both webhooks from several clients")
		hammerCtx, stopHammer := context.WithCancel(ctx)
		var ok, failed atomic.Int64
		var mu sync.Mutex
		var failures []string
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for i := 0; hammerCtx.Err() == nil; i++ {
					var err error
					if (w+i)%2 == 0 {
						err = k8sClient.Create(hammerCtx, validPolicy(ns, "h-"+strconv.Itoa(w)+"-"+strconv.Itoa(i), "default"), client.DryRunAll)
					} else {
						pod := appPod(ns, "h-"+strconv.Itoa(w)+"-"+strconv.Itoa(i), true)
						if err = k8sClient.Create(hammerCtx, pod, client.DryRunAll); err == nil && len(sidecars(pod)) != 1 {
							err = fmt.Errorf("pod admitted with %d sidecars", len(sidecars(pod)))
						}
					}
					switch {
					case hammerCtx.Err() != nil:
					case err != nil:
						failed.Add(1)
						mu.Lock()
						failures = append(failures, err.Error())
						mu.Unlock()
					default:
						ok.Add(1)
					}
				}
			}()
		}

		By("asking for a rotation")
		started := time.Now()
		var s corev1.Secret
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: certSecret}, &s)).To(Succeed())
		s.Annotations[webhookcert.AnnotationRotate] = started.UTC().Format(time.RFC3339Nano)
		Expect(k8sClient.Update(ctx, &s)).To(Succeed())

		By("publishing the new CA next to the old one first")
		var newCA *x509.Certificate
		Eventually(func(g Gomega) {
			m, v := caBundles(ctx)
			g.Expect(m).To(HaveLen(2))
			g.Expect(v).To(Equal(m))
			g.Expect(m[1].Equal(oldCA)).To(BeTrue())
			newCA = m[0]
		}).Should(Succeed())
		served, err := servedCertificate()
		Expect(err).NotTo(HaveOccurred())
		Expect(served.CheckSignatureFrom(oldCA)).To(Succeed(), "the new CA signs nothing before it has propagated")

		By("serving a certificate of the new CA after the propagation period")
		Eventually(func(g Gomega) {
			c, err := servedCertificate()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.CheckSignatureFrom(newCA)).To(Succeed())
		}).WithTimeout(3 * propagation).WithPolling(100 * time.Millisecond).Should(Succeed())
		switched := time.Since(started)

		By("dropping the old CA after another propagation period")
		Eventually(func(g Gomega) {
			m, v := caBundles(ctx)
			g.Expect(m).To(HaveLen(1))
			g.Expect(m[0].Equal(newCA)).To(BeTrue())
			g.Expect(v).To(Equal(m))
		}).WithTimeout(3 * propagation).Should(Succeed())
		done := time.Since(started)

		// Keep hammering until the final chain alone has admitted some.
		onFinal := ok.Load()
		Eventually(ok.Load).Should(BeNumerically(">=", onFinal+20), "admissions through the final chain")
		stopHammer()
		wg.Wait()
		AddReportEntry("forced webhook certificate rotation under load",
			fmt.Sprintf("new serving certificate after %v, old CA dropped after %v; %d admissions succeeded, %d failed",
				switched.Round(time.Millisecond), done.Round(time.Millisecond), ok.Load(), failed.Load()))
		Expect(failures).To(BeEmpty(), "admissions failed during the rotation")
		Expect(ok.Load()).To(BeNumerically(">", 50), "the hammer admitted too little to prove anything")

		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: certSecret}, &s)).To(Succeed())
		Expect(s.Annotations[webhookcert.AnnotationRotated]).To(Equal(s.Annotations[webhookcert.AnnotationRotate]), "the request is marked handled")
	})
})
