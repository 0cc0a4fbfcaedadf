package k8sloop

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/floodgate-dev/floodgate/controllers/injection"
	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/kubesource"
	"github.com/floodgate-dev/floodgate/sidecar/runner"
)

// podIdentity returns a config that authenticates as pod does on a node:
// with a token of its service account bound to the pod (TokenRequest with
// the pod as bound object, what the kubelet mounts), whose user info names
// the pod (authentication.kubernetes.io/pod-name). envtest runs no
// ServiceAccount controller, so the pod's service account is created here
// when missing.
func podIdentity(ctx context.Context, pod *corev1.Pod) *rest.Config {
	GinkgoHelper()
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	err := k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: sa}})
	Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
	var current corev1.Pod
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), &current)).To(Succeed())
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	tr, err := cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: current.Name, UID: current.UID},
		},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	c := rest.AnonymousClientConfig(cfg)
	c.BearerToken = tr.Status.Token
	return c
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// sidecar is an in-process floodgate-sidecar started as the injected
// container would be: its args and environment, the pod's labels file,
// the pod's identity; only the listen addresses and the upstream are moved
// to loopback, and counts kept in memory.
type sidecar struct {
	*runner.Runner
	url    string
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

func startSidecar(ctx context.Context, pod *corev1.Pod, upstream string, grace time.Duration) *sidecar {
	sc := sidecars(pod)
	Expect(sc).To(HaveLen(1))
	c := sc[0]

	dir := GinkgoT().TempDir()
	labelsFile := filepath.Join(dir, "labels")
	keys := make([]string, 0, len(pod.Labels))
	for k := range pod.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var lines []string
	for _, k := range keys {
		lines = append(lines, k+"="+strconv.Quote(pod.Labels[k]))
	}
	Expect(os.WriteFile(labelsFile, []byte(strings.Join(lines, "\n")), 0o600)).To(Succeed())

	var args []string
	for _, a := range c.Args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch name {
		case "listen", "admin-listen", "upstream", "pod-labels-file":
			continue
		}
		args = append(args, a)
	}
	args = append(args, "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0", "--upstream="+upstream,
		"--pod-labels-file="+labelsFile, "--store=memory", "--drain-timeout=1s")
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = pod.Name
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env[e.Name] = pod.Namespace
		case e.ValueFrom.SecretKeyRef != nil:
			var s corev1.Secret
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: e.ValueFrom.SecretKeyRef.Name}, &s)).To(Succeed())
			env[e.Name] = string(s.Data[e.ValueFrom.SecretKeyRef.Key])
		}
	}
	var rc runner.Config
	fs := flag.NewFlagSet("floodgate-sidecar", flag.ContinueOnError)
	Expect(rc.Parse(fs, args, func(k string) (string, bool) { v, ok := env[k]; return v, ok })).To(Succeed())
	Expect(rc.Kubernetes).To(BeTrue(), "the injected environment selects Kubernetes mode")
	Expect(rc.Namespace).To(Equal(pod.Namespace))
	Expect(rc.PodName).To(Equal(pod.Name))
	// The state directory is the pod's emptyDir; here, one of the test's.
	Expect(rc.StateDir).To(Equal(config.StateDir))
	rc.StateDir = GinkgoT().TempDir()

	cs, err := kubernetes.NewForConfig(podIdentity(ctx, pod))
	Expect(err).NotTo(HaveOccurred())
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(logs, GinkgoWriter), &slog.HandlerOptions{Level: slog.LevelDebug}))
	src, err := kubesource.New(kubesource.Options{Client: cs, Namespace: rc.Namespace, PodName: rc.PodName, Log: log, DeleteGrace: grace})
	Expect(err).NotTo(HaveOccurred())
	r, err := runner.New(rc, log, src)
	Expect(err).NotTo(HaveOccurred())
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &sidecar{Runner: r, url: "http://" + r.ProxyAddr(), logs: logs, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- r.Run(runCtx) }()
	DeferCleanup(func() {
		s.cancel()
		Eventually(s.done, 20*time.Second).Should(Receive(BeNil()))
	})
	return s
}

// get sends one request through the sidecar with X-Client: key and
// returns the status code.
func (s *sidecar) get(key string) int {
	req, err := http.NewRequest(http.MethodGet, s.url+"/api/items", nil)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("X-Client", key)
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	_, _ = io.Copy(io.Discard, resp.Body)
	Expect(resp.Body.Close()).To(Succeed())
	return resp.StatusCode
}

// codes sends n requests with key and returns their status codes.
func (s *sidecar) codes(key string, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = s.get(key)
	}
	return out
}

// limited returns n OKs followed by one 429: the answers to n+1 requests
// of one key under a limit of n.
func limited(n int) []int {
	out := make([]int, n+1)
	for i := range n {
		out[i] = http.StatusOK
	}
	out[n] = http.StatusTooManyRequests
	return out
}

// counter reads a counter of the sidecar's registry by name suffix.
func (s *sidecar) counter(suffix string) float64 {
	mfs, err := s.Registry().Gather()
	Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, mf := range mfs {
		if strings.HasSuffix(mf.GetName(), suffix) {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// newUpstream is the application behind the sidecar.
func newUpstream() *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprint(w, "ok")
	}))
	DeferCleanup(srv.Close)
	return srv
}

// injectedPod creates an annotated pod and returns it as stored.
func injectedPod(ctx context.Context, ns, name string) *corev1.Pod {
	pod := appPod(ns, name, true)
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	Expect(sidecars(pod)).To(HaveLen(1))
	Expect(pod.Annotations).To(HaveKeyWithValue(injection.AnnotationInject, "true"))
	return pod
}
