package proxy

import (
	"net/http"
	"strings"
)

// vetRequest names what makes r one the sidecar refuses before any rule
// looks at it, or returns "": a request an application behind it could
// read otherwise than the rules that decided it (docs/configuration.md,
// "Requests refused before the rules").
//
//   - A method with a lower-case letter. Methods are case-sensitive, and
//     rules name the upper-case ones, but some servers upper-case what
//     they receive: "post" would pass a rule on POST and be served as
//     POST.
//   - A control character in the path, as sent or percent-encoded
//     ("/admin%00"): servers cut the path there, or read it otherwise.
//   - A Connection field naming Content-Length, Transfer-Encoding or Host.
//     A proxy removes the fields Connection names, so the application
//     would read the body without the framing the sidecar read it by, as
//     requests of its own, or route on another host.
func vetRequest(r *http.Request) string {
	for i := 0; i < len(r.Method); i++ {
		if c := r.Method[i]; 'a' <= c && c <= 'z' {
			return "the method must be upper case"
		}
	}
	for i := 0; i < len(r.URL.Path); i++ {
		if c := r.URL.Path[i]; c < ' ' || c == 0x7f {
			return "a control character in the path"
		}
	}
	for _, v := range r.Header["Connection"] {
		for v != "" {
			var tok string
			tok, v, _ = strings.Cut(v, ",")
			tok = strings.TrimSpace(tok)
			if strings.EqualFold(tok, "content-length") || strings.EqualFold(tok, "transfer-encoding") || strings.EqualFold(tok, "host") {
				return "the Connection field may not name " + tok
			}
		}
	}
	return ""
}
