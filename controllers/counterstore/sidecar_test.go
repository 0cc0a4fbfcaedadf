package counterstore_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/kubesource"
	"github.com/floodgate-dev/floodgate/sidecar/runner"
)

// sidecar is an in-process floodgate-sidecar in Kubernetes mode: it
// watches its namespace's policies ConfigMap and counts in the store the
// ConfigMap names, with the password the test gives it as a file (what the
// injected volume holds).
type sidecar struct {
	*runner.Runner
	url    string
	cancel context.CancelFunc
	done   chan error
}

// startSidecar runs a sidecar for a pod of ns, which it creates, with
// args added to the sidecar's own.
func startSidecar(ctx context.Context, ns, pod string, creds map[string]string, args ...string) *sidecar {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod, Labels: map[string]string{"app": "api"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	})).To(Succeed())
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprint(w, "ok") }))
	DeferCleanup(upstream.Close)

	dir := GinkgoT().TempDir()
	labels := filepath.Join(dir, "labels")
	Expect(os.WriteFile(labels, []byte(`app="api"`), 0o600)).To(Succeed())
	all := []string{"--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0", "--upstream=" + upstream.URL,
		"--pod-labels-file=" + labels, "--drain-timeout=1s"}
	for name, value := range creds {
		file := filepath.Join(dir, name)
		Expect(os.WriteFile(file, []byte(value), 0o600)).To(Succeed())
		all = append(all, "--redis-"+name+"-file="+file)
	}
	all = append(all, args...)
	env := map[string]string{config.EnvKubernetes: "true", config.EnvPodNamespace: ns, config.EnvPodName: pod}
	var rc runner.Config
	Expect(rc.Parse(flag.NewFlagSet("floodgate-sidecar", flag.ContinueOnError), all,
		func(k string) (string, bool) { v, ok := env[k]; return v, ok })).To(Succeed())

	cs, err := kubernetes.NewForConfig(restConfig)
	Expect(err).NotTo(HaveOccurred())
	log := slog.New(slog.NewJSONHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelInfo})).With("pod", pod)
	src, err := kubesource.New(kubesource.Options{Client: cs, Namespace: ns, PodName: pod, Log: log})
	Expect(err).NotTo(HaveOccurred())
	r, err := runner.New(rc, log, src)
	Expect(err).NotTo(HaveOccurred())
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &sidecar{Runner: r, url: "http://" + r.ProxyAddr(), cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- r.Run(runCtx) }()
	DeferCleanup(func() {
		s.cancel()
		Eventually(s.done, 20*time.Second).Should(Receive(BeNil()))
	})
	Eventually(s.Ready).WithTimeout(30 * time.Second).Should(BeTrue())
	return s
}

// get sends one request with X-API-Key: key and returns the status code.
func (s *sidecar) get(key string) int {
	GinkgoHelper()
	req, err := http.NewRequest(http.MethodGet, s.url+"/api/items", nil)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	_, _ = io.Copy(io.Discard, resp.Body)
	Expect(resp.Body.Close()).To(Succeed())
	return resp.StatusCode
}

// shared reports whether two sidecars count key together in the store: a
// fail-closed rule of 2 per hour admits it once through each and denies
// the third request. Any store failure answers 503 instead.
func shared(a, b *sidecar, key string) []int {
	return []int{a.get(key), b.get(key), a.get(key)}
}
