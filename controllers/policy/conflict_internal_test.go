package policy

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestOnlyConflicts(t *testing.T) {
	t.Parallel()
	gr := schema.GroupResource{Group: "ratelimit.floodgate.dev", Resource: "ratelimitpolicies"}
	conflict := apierrors.NewConflict(gr, "api", errors.New("the object has been modified"))
	timeout := apierrors.NewServerTimeout(gr, "update", 1)
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"a conflict", conflict, true},
		{"a wrapped conflict", fmt.Errorf("update the status of api: %w", conflict), true},
		{"conflicts joined", errors.Join(conflict, fmt.Errorf("apply: %w", conflict)), true},
		{"a conflict joined with a timeout", errors.Join(conflict, timeout), false},
		{"a wrapped join with a timeout", fmt.Errorf("status: %w", errors.Join(conflict, timeout)), false},
		{"a timeout", timeout, false},
		{"a plain error", errors.New("boom"), false},
	} {
		if got := onlyConflicts(tc.err); got != tc.want {
			t.Errorf("%s: onlyConflicts = %v, want %v", tc.name, got, tc.want)
		}
	}
}
