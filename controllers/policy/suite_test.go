package policy_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/watch"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/cmd/floodgate-manager/app"
	"github.com/floodgate-dev/floodgate/controllers/podlimits"
	"github.com/floodgate-dev/floodgate/controllers/policy"
	"github.com/floodgate-dev/floodgate/test/kubetest"
)

var (
	testEnv *envtest.Environment
	// k8sClient talks to the API server directly, bypassing the
	// manager's cache, so tests see what is stored.
	k8sClient client.Client
	kubectl   *kubetest.Kubectl
	// calls records the controller's API calls and injects faults.
	calls       = newRecorder()
	stopManager context.CancelFunc
	managerDone = make(chan error, 1)
)

func init() {
	SetDefaultEventuallyTimeout(timeout)
	SetDefaultEventuallyPollingInterval(poll)
}

func TestPolicyController(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "policy controller suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is unset: run the tests with `make test`, which builds kube-apiserver, etcd and kubectl "+
			"and points KUBEBUILDER_ASSETS at them (hack/envtest-assets.sh)")

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred())

	scheme, err := app.NewScheme()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	kubectl, err = kubetest.NewKubectl(testEnv, GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())

	// The manager is built as floodgate-manager builds it (same scheme and
	// cache options), except that the reconciler's client goes through an
	// interceptor that records calls and injects API errors.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  app.CacheOptions("floodgate-system"),
	})
	Expect(err).NotTo(HaveOccurred())
	r := &policy.Reconciler{
		Client:    interceptor.NewClient(withoutWatch{mgr.GetClient()}, calls.funcs()),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder(app.Name),
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopManager = cancel
	Expect(r.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	Expect((&policy.ClusterReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr)).To(Succeed())
	Expect((&podlimits.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder(app.Name)}).SetupWithManager(mgr)).To(Succeed())
	go func() {
		defer GinkgoRecover()
		managerDone <- mgr.Start(ctx)
	}()
})

var _ = AfterSuite(func() {
	if stopManager != nil {
		stopManager()
		Eventually(managerDone, 30*time.Second).Should(Receive(BeNil()))
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// withoutWatch lets the manager's client, which has no Watch, be wrapped by
// the interceptor, which wants one. The reconciler never watches.
type withoutWatch struct{ client.Client }

func (withoutWatch) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errors.New("the reconciler's client does not watch")
}

// recorder counts the controller's API calls per namespace and can make
// some of them fail. It is safe for concurrent use.
type recorder struct {
	mu sync.Mutex
	// reconciles holds the start time of each reconcile, which begins
	// with a List of the namespace's policies.
	reconciles map[string][]time.Time
	// cmWrites counts ConfigMap applies and deletes that reached the API
	// server (or were failed on purpose).
	cmWrites map[string]int
	// failApplies makes this many ConfigMap applies fail in the namespace.
	failApplies map[string]int
	// failedApplies holds the time of each apply failed on purpose.
	failedApplies map[string][]time.Time
	// podsRead holds the names of the pods a reconcile has listed.
	podsRead map[string]map[string]bool
}

func newRecorder() *recorder {
	return &recorder{
		reconciles:    map[string][]time.Time{},
		cmWrites:      map[string]int{},
		failApplies:   map[string]int{},
		failedApplies: map[string][]time.Time{},
		podsRead:      map[string]map[string]bool{},
	}
}

func (r *recorder) funcs() interceptor.Funcs {
	return interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			lo := (&client.ListOptions{}).ApplyOptions(opts)
			if _, ok := list.(*v1alpha1.RateLimitPolicyList); ok {
				r.mu.Lock()
				r.reconciles[lo.Namespace] = append(r.reconciles[lo.Namespace], time.Now())
				r.mu.Unlock()
			}
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			if pods, ok := list.(*corev1.PodList); ok {
				r.mu.Lock()
				if r.podsRead[lo.Namespace] == nil {
					r.podsRead[lo.Namespace] = map[string]bool{}
				}
				for _, p := range pods.Items {
					r.podsRead[lo.Namespace][p.Name] = true
				}
				r.mu.Unlock()
			}
			return nil
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			cm, ok := obj.(*corev1ac.ConfigMapApplyConfiguration)
			if !ok || cm.Namespace == nil {
				return c.Apply(ctx, obj, opts...)
			}
			ns := *cm.Namespace
			r.mu.Lock()
			r.cmWrites[ns]++
			fail := r.failApplies[ns] > 0
			if fail {
				r.failApplies[ns]--
				r.failedApplies[ns] = append(r.failedApplies[ns], time.Now())
			}
			r.mu.Unlock()
			if fail {
				return apierrors.NewServerTimeout(schema.GroupResource{Resource: "configmaps"}, "apply", 1)
			}
			return c.Apply(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if _, ok := obj.(*corev1.ConfigMap); ok {
				r.mu.Lock()
				r.cmWrites[obj.GetNamespace()]++
				r.mu.Unlock()
			}
			return c.Delete(ctx, obj, opts...)
		},
	}
}

func (r *recorder) reconcileTimes(ns string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.reconciles[ns]...)
}

func (r *recorder) reconcileCount(ns string) int { return len(r.reconcileTimes(ns)) }

// failedApplyTimes returns when the ConfigMap applies failed on purpose
// were made.
func (r *recorder) failedApplyTimes(ns string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.failedApplies[ns]...)
}

// readPod reports whether a reconcile has listed the pod ns/name.
func (r *recorder) readPod(ns, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.podsRead[ns][name]
}

func (r *recorder) writes(ns string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmWrites[ns]
}

func (r *recorder) setFailApplies(ns string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failApplies[ns] = n
}

// newNamespace creates a namespace for one spec and deletes it afterwards.
func newNamespace(ctx context.Context) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rlp-" + rand.String(8)}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, ns))).To(Succeed())
	})
	return ns.Name
}
