// Package statusupdate writes the status of floodgate's custom resources
// the one way its controllers do: each reconcile computes the whole status
// from what it observed (level-based, conditions set with
// meta.SetStatusCondition and their ObservedGeneration), and Write sends
// it with an update of the status subresource under the manager's field
// owner, or sends nothing when nothing changed.
//
// An update replaces the whole status, so a field at its zero value is
// stored as such (a patch computed from the typed object would leave out a
// zero the API server never had), and it carries the resourceVersion the
// status was computed from: a status computed from a copy that has gone
// stale, perhaps for an older generation, is refused with a conflict and
// computed again, instead of overwriting a newer object.
package statusupdate

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Write updates the status of obj, a copy of before whose status the
// caller set, under fieldOwner. It writes nothing when obj equals before.
// An object deleted meanwhile is no error: it has no status left to
// write. A conflict is returned, for the caller to retry.
func Write(ctx context.Context, c client.StatusClient, before, obj client.Object, fieldOwner string) error {
	if equality.Semantic.DeepEqual(before, obj) {
		return nil
	}
	err := c.Status().Update(ctx, obj, client.FieldOwner(fieldOwner))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
