package runner

import (
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
)

// The admin port answers anyone who reaches the pod's address: the
// kubelet's probes, Prometheus, kubectl floodgate through the API
// server's pod proxy. What a policy keeps to itself (its CEL conditions,
// the values and patterns of its header and query matches, its key
// expressions and its exemptions, shared secrets among them) is shown on
// loopback only, as through kubectl port-forward; the debug endpoints
// that are not reports (pprof, the debugging build's clock) answer on
// loopback only (docs/operations.md, "The admin port").

// redacted stands for what /debug/config shows only on loopback.
const redacted = "<redacted: on loopback only>"

// fromLoopback reports whether req came from this host's loopback: in a
// pod, from a container of the pod or through kubectl port-forward.
func fromLoopback(req *http.Request) bool {
	host, _, err := net.SplitHostPort(req.RemoteAddr)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// loopbackOnly answers 403 to a request that did not come from loopback.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !fromLoopback(req) {
			http.Error(w, "this endpoint answers on loopback only: use kubectl port-forward", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, req)
	})
}

// redactStatus returns st as JSON with what a policy keeps to itself
// replaced by redacted, wherever in the config it appears: "when" and
// "expression" strings, the "value" and "regex" of "headers" and "query"
// matches, and every "exempt".
func redactStatus(st Status) (any, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	if c, ok := v["config"]; ok {
		v["config"] = redactValue(c)
	}
	return v, nil
}

func redactValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, child := range t {
			switch k {
			case "when", "expression":
				t[k] = redactStrings(child)
			case "exempt":
				t[k] = redacted
			case "headers", "query":
				if list, ok := child.([]any); ok {
					for _, e := range list {
						if m, ok := e.(map[string]any); ok {
							for _, f := range []string{"value", "regex"} {
								if _, ok := m[f]; ok {
									m[f] = redacted
								}
							}
						}
					}
				}
			default:
				t[k] = redactValue(child)
			}
		}
		return t
	case []any:
		for i := range t {
			t[i] = redactValue(t[i])
		}
		return t
	}
	return v
}

// redactStrings replaces a string, or each string of a list, by redacted.
func redactStrings(v any) any {
	switch t := v.(type) {
	case string:
		return redacted
	case []any:
		for i := range t {
			if _, ok := t[i].(string); ok {
				t[i] = redacted
			}
		}
		return t
	}
	return redactValue(v)
}
