package app

import (
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubectlMessage is what kubectl apply prints when creating one object
// from source fails with err (k8s.io/kubectl's cmdutil.AddSourceToErr
// and checkErr): for a 422 Invalid answer "The Kind "name" is invalid: "
// and its causes, one per line when there are several; for another status
// "Error from server (Reason): error when creating "source": message".
// The text ends without a newline.
func kubectlMessage(err error, source string) string {
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		return err.Error()
	}
	st := se.Status()
	if st.Reason == metav1.StatusReasonInvalid {
		d := st.Details
		s := "The request is invalid"
		if d == nil {
			if st.Message != "" {
				s += ": error when creating " + fmt.Sprintf("%q", source) + ": " + st.Message
			}
			return s
		}
		if d.Kind != "" || d.Name != "" {
			s = fmt.Sprintf("The %s %q is invalid", d.Kind, d.Name)
		}
		var causes []string
		seen := map[string]bool{}
		for _, c := range d.Causes {
			msg := fmt.Sprintf("%s: %s", c.Field, c.Message)
			if !seen[msg] {
				seen[msg] = true
				causes = append(causes, msg)
			}
		}
		switch len(causes) {
		case 0:
			return s
		case 1:
			return s + ": " + causes[0]
		}
		return s + ": \n* " + strings.Join(causes, "\n* ")
	}
	msg := fmt.Sprintf("error when creating %q: %s", source, st.Message)
	if st.Reason == "" {
		return "Error from server: " + msg
	}
	return fmt.Sprintf("Error from server (%s): %s", st.Reason, msg)
}
