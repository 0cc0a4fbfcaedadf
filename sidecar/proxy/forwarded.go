package proxy

import (
	"net/http"
	"net/textproto"
	"strings"
)

// The rules decide the request the application gets, so both fronts leave
// out of the decision what they do not forward:
//
//   - The fields the Connection field names, but Upgrade (the upgrade
//     path reads it). A proxy removes them, so a key taken from one
//     ("Connection: X-Api-Key") would count a value the application never
//     reads.
//   - Unless Options.AllowUnderscoreHeaders, fields whose names contain an
//     underscore. Servers that pass fields to the application the CGI way
//     (WSGI, Rack, PHP) read X_Api_Key as X-Api-Key, and join it to an
//     X-Api-Key the rules keyed; nginx and Apache drop such fields by
//     default for the same reason.

// UnderscoreName reports whether a field name contains an underscore.
func UnderscoreName[T string | []byte](name T) bool {
	for i := 0; i < len(name); i++ {
		if name[i] == '_' {
			return true
		}
	}
	return false
}

// dropUnforwarded removes from h the fields the application will not get.
func dropUnforwarded(h http.Header, allowUnderscore bool) {
	for _, v := range h["Connection"] {
		for v != "" {
			var tok string
			tok, v, _ = strings.Cut(v, ",")
			tok = strings.TrimSpace(tok)
			if tok == "" || strings.EqualFold(tok, "upgrade") || strings.EqualFold(tok, "connection") {
				continue
			}
			delete(h, textproto.CanonicalMIMEHeaderKey(tok))
		}
	}
	if allowUnderscore {
		return
	}
	for k := range h {
		if UnderscoreName(k) {
			delete(h, k)
		}
	}
}
