package statusupdate_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/floodgate-dev/floodgate/api/v1alpha1"
	"github.com/floodgate-dev/floodgate/controllers/internal/statusupdate"
)

const owner = "floodgate-manager"

var k8s client.Client

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is unset: run the tests with `make test`, which builds kube-apiserver, etcd and kubectl")
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop envtest:", err)
		}
	}()
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// store creates a CounterStore and returns it as stored.
func store(t *testing.T, name string) *v1alpha1.CounterStore {
	t.Helper()
	cs := &v1alpha1.CounterStore{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.CounterStoreSpec{External: &v1alpha1.ExternalStore{Addresses: []v1alpha1.HostPort{"10.0.0.1:6379"}}},
	}
	if err := k8s.Create(t.Context(), cs); err != nil {
		t.Fatal(err)
	}
	return cs
}

func ready(cs *v1alpha1.CounterStore, status metav1.ConditionStatus, slots int32) *v1alpha1.CounterStore {
	next := cs.DeepCopy()
	next.Status.ObservedGeneration = cs.Generation
	next.Status.SlotsCovered = slots
	meta.SetStatusCondition(&next.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: status, Reason: "Test", Message: "set by the test", ObservedGeneration: cs.Generation,
	})
	return next
}

func get(ctx context.Context, t *testing.T, name string) *v1alpha1.CounterStore {
	t.Helper()
	var cs v1alpha1.CounterStore
	if err := k8s.Get(ctx, client.ObjectKey{Name: name}, &cs); err != nil {
		t.Fatal(err)
	}
	return &cs
}

// TestWrite checks that a changed status is written whole under the field
// owner, zero values included; that an unchanged one is not written at
// all; that a stale copy is refused; and that a deleted object is no
// error.
func TestWrite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cs := store(t, "statusupdate")

	next := ready(cs, metav1.ConditionFalse, 0)
	if err := statusupdate.Write(ctx, k8s, cs, next, owner); err != nil {
		t.Fatal(err)
	}
	got := get(ctx, t, cs.Name)
	if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("status after Write = %+v, want Ready False", got.Status)
	}
	// The zero is stored, not left out: printer columns and clients that
	// read the raw object see 0.
	var raw unstructured.Unstructured
	raw.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("CounterStore"))
	if err := k8s.Get(ctx, client.ObjectKey{Name: cs.Name}, &raw); err != nil {
		t.Fatal(err)
	}
	if v, found, err := unstructured.NestedInt64(raw.Object, "status", "slotsCovered"); !found || err != nil || v != 0 {
		t.Errorf("stored status.slotsCovered = %d, found %v, %v; want a stored 0", v, found, err)
	}
	var managed bool
	for _, f := range got.ManagedFields {
		managed = managed || (f.Manager == owner && f.Subresource == "status")
	}
	if !managed {
		t.Errorf("managedFields %+v has no status entry of %s", got.ManagedFields, owner)
	}

	// Nothing changed: no write, the resourceVersion stays.
	if err := statusupdate.Write(ctx, k8s, got, got.DeepCopy(), owner); err != nil {
		t.Fatal(err)
	}
	if again := get(ctx, t, cs.Name); again.ResourceVersion != got.ResourceVersion {
		t.Errorf("an unchanged status was written: resourceVersion %s -> %s", got.ResourceVersion, again.ResourceVersion)
	}

	// A status computed from a copy older than the stored object is
	// refused, and the stored status stays.
	stale := cs // the resourceVersion from before the first Write
	if err := statusupdate.Write(ctx, k8s, stale, ready(stale, metav1.ConditionTrue, 16384), owner); !apierrors.IsConflict(err) {
		t.Errorf("Write from a stale copy = %v, want a conflict", err)
	}
	if again := get(ctx, t, cs.Name); again.Status.SlotsCovered != 0 {
		t.Errorf("the stale Write changed the status: %+v", again.Status)
	}

	if err := k8s.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	if err := statusupdate.Write(ctx, k8s, got, ready(got, metav1.ConditionTrue, 1), owner); err != nil {
		t.Errorf("Write of a deleted object = %v, want nil", err)
	}
}
