package rlsimport

import (
	"fmt"
	"slices"
	"strings"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Applies words the requests a match selects: "GET requests to paths
// under /api/ with header X-Tier: free". floodgate-sidecar --check-config
// and kubectl floodgate explain both use it.
func Applies(m *config.Match) string {
	var what string
	if len(m.Methods) > 0 {
		methods := m.Methods
		if slices.Contains(methods, "GET") && !slices.Contains(methods, "HEAD") {
			// As the matcher holds them: a rule on GET holds HEAD.
			methods = append(slices.Clip(methods), "HEAD")
		}
		what = strings.Join(methods, " and ") + " requests"
	} else {
		what = "requests"
	}
	if len(m.Hosts) > 0 {
		what += " for " + strings.Join(m.Hosts, " or ")
	}
	if p := m.Path; p != nil {
		switch p.Type {
		case config.PathExact:
			what += " to " + p.Value
		case config.PathPrefix:
			what += " to paths under " + p.Value
		default:
			what += " to paths matching " + p.Value
		}
	} else if len(m.Hosts) == 0 && len(m.Query) == 0 && len(m.SourceCIDRs) == 0 && len(m.When) == 0 {
		what = "all " + what
	}
	with := make([]string, 0, len(m.Headers)+len(m.Query))
	for _, h := range m.Headers {
		with = append(with, valueMatch("header", h.Name, h.Value, h.Regex, h.Absent, h.Invert))
	}
	for _, q := range m.Query {
		with = append(with, valueMatch("query parameter", q.Name, q.Value, q.Regex, q.Absent, q.Invert))
	}
	if len(with) > 0 {
		what += " with " + strings.Join(with, " and ")
	}
	if len(m.SourceCIDRs) > 0 {
		what += " from " + strings.Join(m.SourceCIDRs, " or ")
	}
	if len(m.When) > 0 {
		what += " when " + strings.Join(m.When, " and ")
	}
	return what
}

// valueMatch words one header or query parameter match.
func valueMatch(kind, name, value, regex string, absent, invert bool) string {
	switch {
	case absent:
		return "no " + name + " " + kind
	case value != "" && invert:
		return fmt.Sprintf("%s %s other than %s", kind, name, value)
	case value != "":
		return fmt.Sprintf("%s %s: %s", kind, name, value)
	case regex != "" && invert:
		return fmt.Sprintf("%s %s not matching %s", kind, name, regex)
	case regex != "":
		return fmt.Sprintf("%s %s matching %s", kind, name, regex)
	case invert:
		return "no " + name + " " + kind
	}
	return "a " + name + " " + kind
}

// Counter words how a rule's key alternatives split the requests into
// counters: "each X-API-Key, else each client IP".
func Counter(alts [][]config.KeyPart) string {
	var words []string
	for _, key := range alts {
		if len(key) == 0 {
			words = append(words, "all of them together (one counter)")
			continue
		}
		parts := make([]string, 0, len(key))
		for _, k := range key {
			parts = append(parts, KeyPart(k))
		}
		words = append(words, "each "+strings.Join(parts, " and "))
	}
	return strings.Join(words, ", else ")
}

// KeyPart names one part of a key.
func KeyPart(k config.KeyPart) string {
	switch {
	case k.Header != "":
		return k.Header
	case k.Query != "":
		return "query parameter " + k.Query
	case k.ClientIP != nil:
		return clientIP(k.ClientIP)
	case k.JWTClaim != "":
		return "JWT claim " + k.JWTClaim
	case k.Path != nil:
		return "path"
	case k.Method != nil:
		return "method"
	case k.Expression != "":
		return "value of " + k.Expression
	}
	return "?"
}

// clientIP names a client IP key part, with its prefix lengths when they
// are not the defaults (each IPv4 address, each IPv6 /64).
func clientIP(k *config.ClientIPKey) string {
	s := "client IP"
	if v4 := k.IPv4PrefixLength; v4 > 0 && v4 != 32 {
		s += fmt.Sprintf(" (IPv4 by /%d)", v4)
	}
	if v6 := k.IPv6PrefixLength; v6 > 0 && v6 != config.DefaultIPv6PrefixLength {
		s += fmt.Sprintf(" (IPv6 by /%d)", v6)
	}
	return s
}
