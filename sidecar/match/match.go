// Package match selects the rules that apply to a request: by path (Exact,
// Prefix, RegularExpression), method, headers and host.
//
// Rules are indexed so that the number of rules does not dominate the cost
// of a match: exact paths sit in a map, prefixes in a trie of path
// elements, and a regular expression hangs off the trie node of the path
// elements its literal prefix spells out, so it is only run for paths that
// reach that node. A match costs O(path elements + candidate rules).
//
// A Matcher is immutable after New and safe for concurrent use.
package match

import (
	"fmt"
	"net/http"
	"path"
	"regexp"
	"regexp/syntax"
	"strings"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Matcher matches requests against an indexed set of rules.
type Matcher struct {
	rules []rule
	exact map[string][]int
	root  *node
}

type node struct {
	children map[string]*node
	rules    []int // prefix rules and rules without a path
	regexes  []int // regex rules whose literal prefix reaches this node
}

type rule struct {
	re      *regexp.Regexp
	methods uint16   // bit set of well-known methods
	other   []string // methods outside the bit set
	headers []header
	hosts   []string // exact names, or ".example.com" for *.example.com
}

type header struct {
	name  string // canonical
	value string
}

// New indexes rules; rule i of the result is ms[i]. It returns an error
// naming the rule when a match is invalid, which config.Validate would have
// caught.
func New(ms []config.Match) (*Matcher, error) {
	m := &Matcher{rules: make([]rule, len(ms)), exact: map[string][]int{}, root: &node{}}
	for i, cm := range ms {
		r := &m.rules[i]
		for _, meth := range cm.Methods {
			if b := methodBit(meth); b != 0 {
				r.methods |= b
			} else {
				r.other = append(r.other, meth)
			}
		}
		for _, h := range cm.Headers {
			r.headers = append(r.headers, header{name: http.CanonicalHeaderKey(h.Name), value: h.Value})
		}
		for _, h := range cm.Hosts {
			r.hosts = append(r.hosts, strings.ToLower(strings.TrimPrefix(h, "*")))
		}
		if cm.Path == nil {
			m.root.rules = append(m.root.rules, i)
			continue
		}
		switch cm.Path.Type {
		case config.PathExact:
			m.exact[cm.Path.Value] = append(m.exact[cm.Path.Value], i)
		case config.PathPrefix:
			n := m.root.descend(strings.TrimSuffix(cm.Path.Value, "/"))
			n.rules = append(n.rules, i)
		case config.PathRegularExpression:
			re, lit, err := compileRegex(cm.Path.Value)
			if err != nil {
				return nil, fmt.Errorf("rule %d: path: %w", i, err)
			}
			r.re = re
			// Only the complete path elements of the literal prefix are
			// certain: "/api/v1/us" reaches the node api/v1.
			dir := lit[:strings.LastIndexByte(lit, '/')+1]
			n := m.root.descend(strings.TrimSuffix(dir, "/"))
			n.regexes = append(n.regexes, i)
		default:
			return nil, fmt.Errorf("rule %d: unknown path type %q", i, cm.Path.Type)
		}
	}
	return m, nil
}

// compileRegex anchors expr to the whole path and returns it with the
// literal text every match starts with.
func compileRegex(expr string) (*regexp.Regexp, string, error) {
	anchored := `^(?:` + expr + `)$`
	re, err := regexp.Compile(anchored)
	if err != nil {
		return nil, "", err
	}
	st, err := syntax.Parse(anchored, syntax.Perl)
	if err != nil {
		return nil, "", err
	}
	return re, literalPrefix(st.Simplify()), nil
}

// literalPrefix returns the literal, case-sensitive text at the start of
// every match of re; "" when there is none or the expression does not
// start with '/'.
func literalPrefix(re *syntax.Regexp) string {
	var b strings.Builder
	var walk func(*syntax.Regexp) bool // reports whether to continue
	walk = func(re *syntax.Regexp) bool {
		switch re.Op {
		case syntax.OpBeginText, syntax.OpBeginLine, syntax.OpEmptyMatch:
			return true
		case syntax.OpLiteral:
			if re.Flags&syntax.FoldCase != 0 {
				return false
			}
			b.WriteString(string(re.Rune))
			return true
		case syntax.OpCapture:
			return walk(re.Sub[0]) && false
		case syntax.OpConcat:
			for _, s := range re.Sub {
				if !walk(s) {
					return false
				}
			}
			return true
		}
		return false
	}
	walk(re)
	s := b.String()
	if !strings.HasPrefix(s, "/") {
		return ""
	}
	return s
}

// descend returns the node for a cleaned path prefix, creating it.
func (n *node) descend(prefix string) *node {
	for _, seg := range strings.Split(prefix, "/") {
		if seg == "" {
			continue
		}
		c := n.children[seg]
		if c == nil {
			if n.children == nil {
				n.children = map[string]*node{}
			}
			c = &node{}
			n.children[seg] = c
		}
		n = c
	}
	return n
}

// Len returns the number of rules.
func (m *Matcher) Len() int { return len(m.rules) }

// Match appends to dst, in ascending order, the indices of the rules that
// match a request with the given cleaned path (see CleanPath), method,
// headers and host (the Host header or :authority, with or without its
// port), and returns the extended slice.
func (m *Matcher) Match(p, method, host string, h http.Header, dst []int) []int {
	host = hostName(host)
	start := len(dst)
	bit := methodBit(method)
	for _, i := range m.exact[p] {
		dst = m.appendIf(dst, i, p, method, host, bit, h)
	}
	n := m.root
	rest := p
	for n != nil {
		for _, i := range n.rules {
			dst = m.appendIf(dst, i, p, method, host, bit, h)
		}
		for _, i := range n.regexes {
			dst = m.appendIf(dst, i, p, method, host, bit, h)
		}
		// Next path element.
		for len(rest) > 0 && rest[0] == '/' {
			rest = rest[1:]
		}
		if rest == "" || n.children == nil {
			break
		}
		seg := rest
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			seg, rest = rest[:j], rest[j:]
		} else {
			rest = ""
		}
		n = n.children[seg]
	}
	// Few rules match a request: insertion sort keeps the order stable
	// without allocating.
	out := dst[start:]
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return dst
}

func (m *Matcher) appendIf(dst []int, i int, p, method, host string, bit uint16, h http.Header) []int {
	r := &m.rules[i]
	if r.hosts != nil && !hostMatches(r.hosts, host) {
		return dst
	}
	if r.methods != 0 || r.other != nil {
		ok := bit != 0 && r.methods&bit != 0
		for _, o := range r.other {
			ok = ok || o == method
		}
		if !ok {
			return dst
		}
	}
	for _, hm := range r.headers {
		vs := h[hm.name]
		if len(vs) == 0 {
			return dst
		}
		if hm.value != "" {
			found := false
			for _, v := range vs {
				if v == hm.value {
					found = true
					break
				}
			}
			if !found {
				return dst
			}
		}
	}
	if r.re != nil && !r.re.MatchString(p) {
		return dst
	}
	return append(dst, i)
}

func methodBit(m string) uint16 {
	switch m {
	case http.MethodGet:
		return 1 << 0
	case http.MethodHead:
		return 1 << 1
	case http.MethodPost:
		return 1 << 2
	case http.MethodPut:
		return 1 << 3
	case http.MethodPatch:
		return 1 << 4
	case http.MethodDelete:
		return 1 << 5
	case http.MethodOptions:
		return 1 << 6
	case http.MethodConnect:
		return 1 << 7
	case http.MethodTrace:
		return 1 << 8
	}
	return 0
}

// CleanPath returns the canonical form of a request path that rules are
// matched and keyed on: path.Clean, rooted, keeping a trailing slash. It
// does not allocate when p is already clean.
func CleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if len(p) > 1 && p[len(p)-1] == '/' && c != "/" {
		if len(c) == len(p)-1 && p[:len(c)] == c {
			return p
		}
		return c + "/"
	}
	return c
}

// hostName is the name part of a Host header: without the port and a
// trailing dot. IPv6 literals keep their brackets. Case is left to
// hostMatches.
func hostName(host string) string {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	return strings.TrimSuffix(host, ".")
}

// hostMatches reports whether host matches one of hosts: an exact name,
// or a suffix ".example.com" (a wildcard *.example.com) that host ends in
// after at least one label. The comparison ignores case.
func hostMatches(hosts []string, host string) bool {
	for _, h := range hosts {
		if h[0] == '.' {
			if len(host) > len(h) && strings.EqualFold(host[len(host)-len(h):], h) {
				return true
			}
			continue
		}
		if strings.EqualFold(host, h) {
			return true
		}
	}
	return false
}
