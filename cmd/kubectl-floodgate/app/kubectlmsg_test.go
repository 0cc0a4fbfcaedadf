package app

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestKubectlMessage(t *testing.T) {
	t.Parallel()
	gk := schema.GroupKind{Group: "ratelimit.floodgate.dev", Kind: "RateLimitPolicy"}
	one := apierrors.NewInvalid(gk, "bad", field.ErrorList{field.Invalid(field.NewPath("spec", "rules").Index(0), 0, "too small")})
	two := apierrors.NewInvalid(gk, "bad", field.ErrorList{
		field.Required(field.NewPath("spec", "a"), "needed"),
		field.Required(field.NewPath("spec", "a"), "needed"), // kubectl prints a repeated cause once
		field.Invalid(field.NewPath("spec", "b"), "x", "wrong"),
	})
	bare := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Reason: metav1.StatusReasonInvalid, Message: "no details"}}
	for _, tt := range []struct {
		err  error
		want string
	}{
		{one, `The RateLimitPolicy "bad" is invalid: spec.rules[0]: Invalid value: 0: too small`},
		{two, "The RateLimitPolicy \"bad\" is invalid: \n* spec.a: Required value: needed\n* spec.b: Invalid value: \"x\": wrong"},
		{bare, `The request is invalid: error when creating "f.yaml": no details`},
		{apierrors.NewBadRequest("cannot be handled"), `Error from server (BadRequest): error when creating "f.yaml": cannot be handled`},
		{errors.New("plain"), "plain"},
	} {
		if got := kubectlMessage(tt.err, "f.yaml"); got != tt.want {
			t.Errorf("kubectlMessage(%v) =\n%q\nwant\n%q", tt.err, got, tt.want)
		}
	}
}
