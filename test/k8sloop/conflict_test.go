package k8sloop

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
)

// conflictRate is the share, in per mille, of the manager's writes that
// fail with 409 Conflict (0: none); conflicts and writes count them.
var conflictRate, conflicts, writes atomic.Int64

// conflict answers one write: a 409 at conflictRate, or nil.
func conflict(obj client.Object) error {
	writes.Add(1)
	if rate := conflictRate.Load(); rate > 0 && rand.Int64N(1000) < rate {
		conflicts.Add(1)
		return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("any").GroupResource(), obj.GetName(),
			errors.New("the object has been modified (injected by the test)"))
	}
	return nil
}

// conflicting builds the manager's client: the real one, with 409s
// injected into its updates, status updates and applies while conflictRate
// is set.
func conflicting(cfg *rest.Config, opts client.Options) (client.Client, error) {
	c, err := client.NewWithWatch(cfg, opts)
	if err != nil {
		return nil, err
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if err := conflict(obj); err != nil {
				return err
			}
			return c.Update(ctx, obj, opts...)
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			if err := conflict(&corev1.ConfigMap{}); err != nil {
				return err
			}
			return c.Apply(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if err := conflict(obj); err != nil {
				return err
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	}), nil
}

// reconciles returns the manager's reconciles so far, by controller, from
// controller-runtime's registry.
func reconciles() map[string]float64 {
	GinkgoHelper()
	mfs, err := crmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[label(m, "controller")] += m.GetCounter().GetValue()
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func sum(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

var _ = Describe("the manager under API server faults", func() {
	It("converges through an API server restart and injected 409 Conflicts, without a hot loop", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		store := newStore(ctx, "s3cret")
		Expect(k8sClient.Create(ctx, validPolicy(ns, "api", store))).To(Succeed())
		converged := func(requests int64) func(g Gomega) {
			return func(g Gomega) {
				p := getPolicy(ctx, ns, "api")
				g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
				c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionAccepted)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(BeEquivalentTo("True"))
				g.Expect(c.ObservedGeneration).To(Equal(p.Generation))
				doc, err := configMap(ctx, ns)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(doc.Policies).To(HaveLen(1))
				g.Expect(doc.Policies[0].Rules[0].Limit.Requests).To(Equal(requests))
			}
		}
		Eventually(converged(100)).Should(Succeed())

		By("injecting 409 Conflict into a quarter of the manager's writes")
		conflictRate.Store(250)
		DeferCleanup(func() { conflictRate.Store(0) })

		By("killing the API server while a change is pending, and restarting it 5 s later")
		updatePolicy(ctx, ns, "api", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Limit.Requests = 50 })
		killAPIServer()
		time.Sleep(5 * time.Second)
		Expect(testEnv.ControlPlane.APIServer.Start()).To(Succeed())
		restarted := time.Now()

		By("converging, observedGeneration included")
		Eventually(converged(50)).WithTimeout(recovery).WithPolling(200 * time.Millisecond).Should(Succeed())
		AddReportEntry("API server restarted, 25% of writes answered 409 -> the policy converged", time.Since(restarted).Round(time.Millisecond).String())
		managerFollows(ctx)

		By("settling: with nothing to do, the manager does not retry in a loop")
		updatePolicy(ctx, ns, "api", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Limit.Requests = 40 })
		Eventually(converged(40)).WithTimeout(60 * time.Second).Should(Succeed())
		// Quiet is measured over windows that start as the manager
		// converges: the retries of its last conflicts, backed off, land
		// in them and are counted. A hot loop fills every window; the
		// reconciles a recovery brings (the informers' relists after the
		// restart, the markers of managerFollows) end, and the window
		// after them must be quiet.
		const quiet = 10 * time.Second
		windows := 0
		Eventually(func(g Gomega) {
			windows++
			r0, w0, c0 := reconciles(), writes.Load(), conflicts.Load()
			time.Sleep(quiet) // the measurement window
			r1, w1, c1 := reconciles(), writes.Load(), conflicts.Load()
			perController := map[string]float64{}
			for k, v := range r1 {
				perController[k] = v - r0[k]
			}
			AddReportEntry(fmt.Sprintf("reconciles over %v of quiet with 25%% of writes answered 409, window %d", quiet, windows),
				fmt.Sprintf("%.0f reconciles %v, %d writes, %d of them 409", sum(r1)-sum(r0), perController, w1-w0, c1-c0))
			// A hot loop reconciles hundreds of times a second; the work
			// queue's backoff and the periodic resyncs allow a handful.
			g.Expect(sum(r1)-sum(r0)).To(BeNumerically("<=", 50), "reconciles in %v of quiet: %v", quiet, perController)
			g.Expect(w1-w0).To(BeNumerically("<=", 30), "writes in %v of quiet", quiet)
		}).WithTimeout(recovery + quiet).WithPolling(time.Millisecond).Should(Succeed())
		Consistently(converged(40)).WithTimeout(2 * time.Second).Should(Succeed())
	})
})
