package k8sloop

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/app"
	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/kubesource"
	"github.com/floodgate-dev/floodgate/sidecar/runner"
)

// hostAddress is an IPv4 address of this machine that is not loopback:
// the API server's pod proxy refuses loopback pod IPs.
func hostAddress() string {
	addrs, err := net.InterfaceAddrs()
	Expect(err).NotTo(HaveOccurred())
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	Fail("this machine has no non-loopback IPv4 address for the pod proxy to reach")
	return ""
}

// sidecarPod creates a pod of app=api with a floodgate-sidecar container
// whose admin port is adminPort, and sets its status as a kubelet would:
// Running, Ready, at ip.
func sidecarPod(ctx context.Context, ns, name, ip string, adminPort int32) {
	pod := appPod(ns, name, false)
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
		Name: config.ContainerName, Image: sidecarImage,
		Ports: []corev1.ContainerPort{{Name: injection.AdminPortName, ContainerPort: adminPort}},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	})
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
	Expect(k8sClient.Status().Update(ctx, pod)).To(Succeed())
}

// statusReport is the part of kubectl floodgate status's JSON that the
// test reads.
type statusReport struct {
	Policies []struct {
		Name       string
		Revision   string
		Targeted   int32
		Enforcing  int32
		Conditions []struct{ Type, Status string }
		Store      struct {
			Name  string
			Found bool
			Ready string
		}
		Pods []struct {
			Name            string
			Enforces, Stale bool
			MetricsRevision string
			MetricsError    string
			Rules           []struct {
				Rule                                         string
				Allowed, Denied, RecentAllowed, RecentDenied float64
			}
		}
		Rules []struct {
			Rule                 string
			Denied, RecentDenied float64
		}
	}
	Problems []string
}

var _ = Describe("kubectl floodgate status", func() {
	It("shows which pods enforce which revision, the store, and the sidecars' recent denials", func(ctx SpecContext) {
		bin := buildPlugin(ctx)
		ns := newNamespace(ctx)
		store := newStore(ctx, "status-password")
		p := validPolicy(ns, "api", store)
		p.Spec.Rules[0].Limit = v1alpha1.Limit{Requests: 3, Per: metav1.Duration{Duration: time.Hour}}
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		ip := hostAddress()

		By("running a sidecar for api-0 whose admin port the API server's pod proxy reaches")
		upstream := newUpstream()
		var rc runner.Config
		fs := flag.NewFlagSet("floodgate-sidecar", flag.ContinueOnError)
		Expect(rc.Parse(fs, []string{"--kubernetes", "--namespace", ns, "--pod-name", "api-0",
			"--listen", "127.0.0.1:0", "--admin-listen", net.JoinHostPort(ip, "0"), "--upstream", upstream.URL,
			"--pod-labels", "app=api", "--store", "memory", "--drain-timeout", "1s"}, func(string) (string, bool) { return "", false })).To(Succeed())
		cs, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		log := slog.New(slog.NewJSONHandler(GinkgoWriter, nil))
		src, err := kubesource.New(kubesource.Options{Client: cs, Namespace: ns, PodName: "api-0", Log: log})
		Expect(err).NotTo(HaveOccurred())
		r, err := runner.New(rc, log, src)
		Expect(err).NotTo(HaveOccurred())
		// The pod's admin port is a forwarder to the sidecar's, which
		// orders the window's events: it tells the spec when the plugin's
		// first scrape has been answered, the denials the window must
		// count are sent after it, and every later scrape is answered only
		// once they have been (sent), however long sending them took.
		scraped, sent := make(chan struct{}), make(chan struct{})
		var scrapes atomic.Int32
		admin := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: r.AdminAddr()})
		fwd := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != "/metrics" {
				admin.ServeHTTP(w, req)
				return
			}
			first := scrapes.Add(1) == 1
			if !first {
				select {
				case <-sent:
				case <-req.Context().Done():
					return
				}
			}
			admin.ServeHTTP(w, req)
			if first {
				close(scraped)
			}
		})}
		fwdLn, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		Expect(err).NotTo(HaveOccurred())
		go func() { _ = fwd.Serve(fwdLn) }()
		DeferCleanup(func() { _ = fwd.Close() })
		sidecarPod(ctx, ns, "api-0", ip, int32(fwdLn.Addr().(*net.TCPAddr).Port))
		runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan error, 1)
		go func() { done <- r.Run(runCtx) }()
		DeferCleanup(func() {
			cancel()
			Eventually(done, 20*time.Second).Should(Receive(BeNil()))
		})

		By("adding api-1, whose sidecar reports an older revision and serves no metrics")
		closed, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		Expect(err).NotTo(HaveOccurred())
		closedPort := closed.Addr().(*net.TCPAddr).Port
		Expect(closed.Close()).To(Succeed())
		sidecarPod(ctx, ns, "api-1", ip, int32(closedPort))
		var stale corev1.Pod
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "api-1"}, &stale)).To(Succeed())
		stale.Status.Conditions = append(stale.Status.Conditions, corev1.PodCondition{
			Type: config.ConditionPolicyLoaded, Status: corev1.ConditionTrue, Reason: config.ReasonLoaded,
			Message: "sha256:0123456789abcdef", LastTransitionTime: metav1.Now(),
		})
		Expect(k8sClient.Status().Update(ctx, &stale)).To(Succeed())

		rev := settledRevision(ctx, ns, "api", "api-0", "api-1")
		Eventually(func() string {
			if c := loadedCondition(ctx, ns, "api-0"); c != nil {
				return c.Message
			}
			return ""
		}, 30*time.Second, 50*time.Millisecond).Should(Equal(rev), "api-0's sidecar loads the settled revision")

		send := func(n int) {
			for range n {
				req, err := http.NewRequest(http.MethodGet, "http://"+r.ProxyAddr()+"/api/items", nil)
				Expect(err).NotTo(HaveOccurred())
				req.Header.Set("X-Client", "k")
				resp, err := http.DefaultClient.Do(req)
				Expect(err).NotTo(HaveOccurred())
				_, _ = io.Copy(io.Discard, resp.Body)
				Expect(resp.Body.Close()).To(Succeed())
			}
		}
		send(5) // 3 allowed, 2 denied

		By("running kubectl floodgate status while more requests are denied")
		go func() {
			defer GinkgoRecover()
			defer close(sent)
			select {
			case <-scraped:
				send(4)
			case <-ctx.Done():
			}
		}()
		out, code := runPlugin(ctx, bin, "status", "api", "-n", ns, "--kubeconfig", kubectl.Kubeconfig, "-o", "json", "--window", "3s")
		Expect(scraped).To(BeClosed(), "the plugin scraped api-0's sidecar through its admin port:\n%s", out)
		Eventually(sent).Should(BeClosed())
		Expect(code).To(Equal(app.ExitFindings), "a stale pod is a problem:\n%s", out)
		var rep statusReport
		Expect(json.Unmarshal([]byte(out), &rep)).To(Succeed(), out)
		Expect(rep.Policies).To(HaveLen(1))
		ps := rep.Policies[0]
		Expect(ps.Revision).To(Equal(rev))
		Expect(ps.Targeted).To(Equal(int32(2)))
		Expect(ps.Enforcing).To(Equal(int32(1)))
		Expect(ps.Store.Name).To(Equal(store))
		Expect(ps.Store.Found).To(BeTrue())
		Expect(ps.Store.Ready).To(Equal("True"))
		Expect(ps.Pods).To(HaveLen(2))
		for _, pod := range ps.Pods {
			switch pod.Name {
			case "api-0":
				Expect(pod.Enforces).To(BeTrue())
				Expect(pod.Stale).To(BeFalse())
				Expect(pod.MetricsError).To(BeEmpty())
				Expect(pod.MetricsRevision).To(Equal(rev), "the revision the sidecar's metrics report")
				Expect(pod.Rules).To(HaveLen(1))
				Expect(pod.Rules[0].Rule).To(Equal("per-client"))
				Expect(pod.Rules[0].Allowed).To(Equal(3.0))
				Expect(pod.Rules[0].Denied).To(Equal(6.0))
				Expect(pod.Rules[0].RecentDenied).To(Equal(4.0), "the denials during the window")
			case "api-1":
				Expect(pod.Enforces).To(BeFalse())
				Expect(pod.Stale).To(BeTrue())
				Expect(pod.MetricsError).To(ContainSubstring("pod proxy"))
			default:
				Fail("unexpected pod " + pod.Name)
			}
		}
		Expect(ps.Rules).To(HaveLen(1))
		Expect(ps.Rules[0].RecentDenied).To(Equal(4.0))
		Expect(rep.Problems).To(ContainElement(ContainSubstring("pod api-1 is stale: enforces sha256:0123456789abcdef, not revision " + rev)))

		text, code := runPlugin(ctx, bin, "status", "api", "-n", ns, "--kubeconfig", kubectl.Kubeconfig, "--window", "0")
		Expect(code).To(Equal(app.ExitFindings))
		Expect(text).To(ContainSubstring("sha256:0123456789abcdef (stale)"))
		Expect(text).To(MatchRegexp(`per-client\s+3\s+6\s+0\s+0`))
		AddReportEntry("kubectl floodgate status", text)
		GinkgoWriter.Print(text)
	})
})
