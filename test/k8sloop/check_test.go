package k8sloop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/app"
	"github.com/floodgate-dev/floodgate/test/policycases"
)

// buildPlugin builds kubectl-floodgate into the spec's temporary
// directory and returns its path.
func buildPlugin(ctx context.Context) string {
	path := filepath.Join(GinkgoT().TempDir(), "kubectl-floodgate")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", path, "../../cmd/kubectl-floodgate").CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build kubectl-floodgate: %s", out)
	return path
}

// runPlugin runs kubectl-floodgate and returns its stdout and exit code.
func runPlugin(ctx context.Context, bin string, args ...string) (string, int) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), 0
	case errors.As(err, &exit):
		Expect(exit.ExitCode()).NotTo(Equal(app.ExitError), "kubectl-floodgate %v could not run: %s", args, stderr.String())
		return stdout.String(), exit.ExitCode()
	}
	Fail(fmt.Sprintf("kubectl-floodgate %v: %v", args, err))
	return "", 0
}

// dryRunCreate sends a manifest to the API server as kubectl apply creates
// it (field validation Strict), without storing it, and returns the
// server's error.
func dryRunCreate(ctx context.Context, ns string, manifest []byte) error {
	var u unstructured.Unstructured
	Expect(yaml.Unmarshal(manifest, &u.Object)).To(Succeed())
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	m, err := mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version)
	Expect(err).NotTo(HaveOccurred())
	dyn, err := dynamic.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if u.GetNamespace() == "" {
			u.SetNamespace(ns)
		}
		ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	_, err = ri.Create(ctx, &u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict})
	return err
}

var _ = Describe("kubectl floodgate check", func() {
	It("gives the verdict and the message of a real apply, for config/samples and every bad-policy case", func(ctx SpecContext) {
		bin := buildPlugin(ctx)
		ns := newNamespace(ctx)
		dir := GinkgoT().TempDir()
		files, err := filepath.Glob(filepath.Join("..", "..", "config", "samples", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(files).NotTo(BeEmpty())
		bad := append(append(append([]policycases.Bad(nil), policycases.Schema...), policycases.ClusterSchema...), policycases.Webhook...)
		for i, b := range bad {
			f := filepath.Join(dir, fmt.Sprintf("bad-%02d.yaml", i))
			Expect(os.WriteFile(f, []byte("# "+b.Name+"\n"+policycases.Manifest(b)), 0o600)).To(Succeed())
			files = append(files, f)
		}

		var report strings.Builder
		valid, invalid := 0, 0
		for _, f := range files {
			data, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())

			By("checking " + f + " offline")
			out, code := runPlugin(ctx, bin, "check", "-n", ns, "-o", "json", f)
			var rep app.CheckReport
			Expect(json.Unmarshal([]byte(out), &rep)).To(Succeed(), out)
			Expect(rep.Results).To(HaveLen(1), f)
			r := rep.Results[0]

			By("asking the API server, with the webhook, in a dry run")
			apiErr := dryRunCreate(ctx, ns, data)

			By("applying it for real with kubectl")
			kout, kerr := kubectl.Run(ctx, "apply", "-n", ns, "-f", f)

			Expect(r.Valid).To(Equal(kerr == nil), "%s: check says valid=%v, kubectl apply said:\n%s", f, r.Valid, kout)
			Expect(r.Valid).To(Equal(apiErr == nil), "%s: check says valid=%v, the API server said: %v", f, r.Valid, apiErr)
			if r.Valid {
				valid++
				Expect(code).To(Equal(app.ExitOK), f)
				_, err := kubectl.Run(ctx, "delete", "-n", ns, "-f", f)
				Expect(err).NotTo(HaveOccurred())
				fmt.Fprintf(&report, "%s: valid (%s)\n", filepath.Base(f), kout)
				continue
			}
			invalid++
			Expect(code).To(Equal(app.ExitFindings), f)
			Expect(r.Message).To(Equal(kout), "%s: the message differs from kubectl apply's:\ncheck:   %q\nkubectl: %q", f, r.Message, kout)
			var se apierrors.APIStatus
			Expect(errors.As(apiErr, &se)).To(BeTrue(), "%s: %v", f, apiErr)
			want := se.Status()
			Expect(r.Status).NotTo(BeNil())
			Expect(r.Status.Code).To(Equal(want.Code), f)
			Expect(r.Status.Reason).To(Equal(want.Reason), f)
			Expect(r.Status.Message).To(Equal(want.Message), f)
			Expect(r.Status.Details).To(Equal(want.Details), f)
			fmt.Fprintf(&report, "%s: invalid, as kubectl apply printed:\n  %s\n", filepath.Base(f), strings.ReplaceAll(kout, "\n", "\n  "))
		}
		Expect(valid).To(Equal(6), "the samples are valid")
		Expect(invalid).To(Equal(len(bad)))
		AddReportEntry("kubectl floodgate check against kubectl apply", report.String())
		GinkgoWriter.Print(report.String())
	})
})
