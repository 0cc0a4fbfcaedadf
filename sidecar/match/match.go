// Package match selects the rules that apply to a request: by path (Exact,
// Prefix, RegularExpression), method and headers.
//
// Paths are compared as a client cannot sidestep: on the cleaned path
// (CleanPath), ignoring ASCII case and a trailing slash, because many
// applications serve "/login", "/login/" and "/LOGIN" alike. A regular
// expression is matched case-insensitively, against the path and against
// it without its trailing slash.
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
	"bytes"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"regexp/syntax"
	"strings"
	"unicode/utf8"

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
		if cm.Path == nil {
			m.root.rules = append(m.root.rules, i)
			continue
		}
		switch cm.Path.Type {
		case config.PathExact:
			v := string(normalize(nil, cm.Path.Value))
			m.exact[v] = append(m.exact[v], i)
		case config.PathPrefix:
			n := m.root.descend(string(normalize(nil, cm.Path.Value)))
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

// compileRegex anchors expr to the whole path, makes it ignore case, and
// returns it with the literal text, in lower case, every match starts
// with.
func compileRegex(expr string) (*regexp.Regexp, string, error) {
	anchored := `(?i)^(?:` + expr + `)$`
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

// literalPrefix returns the literal text, in lower case, at the start of
// every match of re, which matches without regard to case; "" when there
// is none or the expression does not start with '/'. Only ASCII literals
// count: the trie holds paths lowered in ASCII.
func literalPrefix(re *syntax.Regexp) string {
	var b strings.Builder
	var walk func(*syntax.Regexp) bool // reports whether to continue
	walk = func(re *syntax.Regexp) bool {
		switch re.Op {
		case syntax.OpBeginText, syntax.OpBeginLine, syntax.OpEmptyMatch:
			return true
		case syntax.OpLiteral:
			for _, r := range re.Rune {
				if r >= utf8.RuneSelf {
					return false
				}
				b.WriteByte(lower(byte(r)))
			}
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
// match a request with the given cleaned path (see CleanPath), method and
// headers, and returns the extended slice. Paths compare without regard to
// ASCII case or a trailing slash.
func (m *Matcher) Match(p, method string, h http.Header, dst []int) []int {
	start := len(dst)
	bit := methodBit(method)
	var stack [256]byte
	norm := normalize(stack[:0], p)
	for _, i := range m.exact[string(norm)] {
		dst = m.appendIf(dst, i, p, method, bit, h)
	}
	n := m.root
	rest := norm
	for n != nil {
		for _, i := range n.rules {
			dst = m.appendIf(dst, i, p, method, bit, h)
		}
		for _, i := range n.regexes {
			dst = m.appendIf(dst, i, p, method, bit, h)
		}
		// Next path element.
		for len(rest) > 0 && rest[0] == '/' {
			rest = rest[1:]
		}
		if len(rest) == 0 || n.children == nil {
			break
		}
		seg := rest
		if j := bytes.IndexByte(rest, '/'); j >= 0 {
			seg, rest = rest[:j], rest[j:]
		} else {
			rest = nil
		}
		n = n.children[string(seg)]
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

func (m *Matcher) appendIf(dst []int, i int, p, method string, bit uint16, h http.Header) []int {
	r := &m.rules[i]
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
		// "/x/" is "/x" too.
		if len(p) < 2 || p[len(p)-1] != '/' || !r.re.MatchString(p[:len(p)-1]) {
			return dst
		}
	}
	return append(dst, i)
}

// normalize appends to dst the form in which a cleaned path is compared:
// ASCII lower case, without a trailing slash (but "/" stays "/").
func normalize(dst []byte, p string) []byte {
	if len(p) > 1 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	for i := 0; i < len(p); i++ {
		dst = append(dst, lower(p[i]))
	}
	return dst
}

// NormalizedPath returns the form in which a cleaned path is compared
// (ASCII lower case, no trailing slash), the value a path key part counts
// by. It does not allocate when p is already in that form.
func NormalizedPath(p string) string {
	if len(p) > 1 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; 'A' <= c && c <= 'Z' {
			return string(normalize(make([]byte, 0, len(p)), p))
		}
	}
	return p
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
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
