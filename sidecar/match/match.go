// Package match selects the rules that apply to a request: by path (Exact,
// Prefix, RegularExpression), method, host, headers, query parameters,
// client network and CEL conditions; and decides a rule's exemptions.
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
// reach that node. A match costs O(path elements + candidate rules). A
// candidate's cheap tests run first (method, host, headers, query, path
// expression, client network) and its CEL conditions last.
//
// Requests are read through *descriptor.Request, the head abstraction the
// key extraction uses too.
//
// A Matcher is immutable after New and safe for concurrent use.
package match

import (
	"bytes"
	"fmt"
	"net/http"
	"net/netip"
	"path"
	"regexp"
	"regexp/syntax"
	"strings"
	"unicode/utf8"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/descriptor"
	"github.com/floodgate-dev/floodgate/sidecar/expr"
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
	hosts   *Hosts
	headers []value
	query   []value
	cidrs   []netip.Prefix
	when    *expr.Program
	policy  *descriptor.Policy
}

// value is a compiled header or query match.
type value struct {
	name   string // canonical header name, or the query parameter's
	value  string
	re     *regexp.Regexp
	absent bool
	invert bool
}

// Rule is one rule to index: its match, and the policy whose
// trustedProxies and jwt its client networks and conditions read.
type Rule struct {
	Match  config.Match
	Policy *descriptor.Policy
}

// New indexes rules; rule i of the result is rules[i]. It returns an error
// naming the rule when a match is invalid, which config.Validate would have
// caught.
func New(rules []Rule) (*Matcher, error) {
	m := &Matcher{rules: make([]rule, len(rules)), exact: map[string][]int{}, root: &node{}}
	for i := range rules {
		cm := &rules[i].Match
		r := &m.rules[i]
		r.policy = rules[i].Policy
		if r.policy == nil && (len(cm.SourceCIDRs) > 0 || len(cm.When) > 0) {
			return nil, fmt.Errorf("rule %d: sourceCIDRs and when need the rule's policy", i)
		}
		for _, meth := range cm.Methods {
			if b := methodBit(meth); b != 0 {
				r.methods |= b
			} else {
				r.other = append(r.other, meth)
			}
		}
		if r.methods&methodBit(http.MethodGet) != 0 {
			// A rule on GET holds HEAD too: servers answer HEAD from
			// the GET handler (Go's mux, Flask, Express), so HEAD would
			// otherwise reach it unchecked.
			r.methods |= methodBit(http.MethodHead)
		}
		var err error
		if r.hosts, err = NewHosts(cm.Hosts); err != nil {
			return nil, fmt.Errorf("rule %d: %w", i, err)
		}
		for j, h := range cm.Headers {
			v, err := newValue(http.CanonicalHeaderKey(h.Name), h.Value, h.Regex, h.Absent, h.Invert)
			if err != nil {
				return nil, fmt.Errorf("rule %d: headers[%d]: %w", i, j, err)
			}
			r.headers = append(r.headers, v)
		}
		for j, q := range cm.Query {
			v, err := newValue(q.Name, q.Value, q.Regex, q.Absent, q.Invert)
			if err != nil {
				return nil, fmt.Errorf("rule %d: query[%d]: %w", i, j, err)
			}
			r.query = append(r.query, v)
		}
		if r.cidrs, err = prefixes(cm.SourceCIDRs); err != nil {
			return nil, fmt.Errorf("rule %d: sourceCIDRs: %w", i, err)
		}
		if len(cm.When) > 0 {
			if r.when, err = expr.CompileConditions(cm.When); err != nil {
				return nil, fmt.Errorf("rule %d: %w", i, err)
			}
		}
		if cm.Path == nil {
			// Conditions that require a path prefix index the rule where
			// a regular expression's literal prefix would.
			n := m.root
			if r.when != nil {
				if pre := r.when.PathPrefix(); strings.HasPrefix(pre, "/") {
					// The trie holds paths as they are compared: lower
					// case.
					n = m.root.descend(string(descriptor.AppendNormalizedPath(nil, pre[:strings.LastIndexByte(pre, '/')+1])))
				}
			}
			n.rules = append(n.rules, i)
			continue
		}
		switch cm.Path.Type {
		case config.PathExact:
			v := string(descriptor.AppendNormalizedPath(nil, cm.Path.Value))
			m.exact[v] = append(m.exact[v], i)
		case config.PathPrefix:
			n := m.root.descend(string(descriptor.AppendNormalizedPath(nil, cm.Path.Value)))
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

// Programs returns the CEL conditions of the rules that have some, in rule
// order, for reporting how they run (expr.Program.Native).
func (m *Matcher) Programs() []*expr.Program {
	var out []*expr.Program
	for i := range m.rules {
		if m.rules[i].when != nil {
			out = append(out, m.rules[i].when)
		}
	}
	return out
}

// Len returns the number of rules.
func (m *Matcher) Len() int { return len(m.rules) }

// Match appends to dst, in ascending order, the indices of the rules that
// match the request (whose Path is cleaned, see CleanPath), and returns the
// extended slice. Paths compare without regard to ASCII case or a trailing
// slash.
func (m *Matcher) Match(r *descriptor.Request, dst []int) []int {
	start := len(dst)
	bit := methodBit(r.Method())
	var stack [256]byte
	norm := descriptor.AppendNormalizedPath(stack[:0], r.Path)
	for _, i := range m.exact[string(norm)] {
		dst = m.appendIf(dst, i, r, bit)
	}
	n := m.root
	rest := norm
	for n != nil {
		for _, i := range n.rules {
			dst = m.appendIf(dst, i, r, bit)
		}
		for _, i := range n.regexes {
			dst = m.appendIf(dst, i, r, bit)
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

func (m *Matcher) appendIf(dst []int, i int, r *descriptor.Request, bit uint16) []int {
	if m.rules[i].matches(r, bit) {
		return append(dst, i)
	}
	return dst
}

// matches runs the rule's tests other than the path index's, cheapest
// first.
func (ru *rule) matches(r *descriptor.Request, bit uint16) bool {
	if ru.methods != 0 || ru.other != nil {
		ok := bit != 0 && ru.methods&bit != 0
		for _, o := range ru.other {
			ok = ok || o == r.Method()
		}
		if !ok {
			return false
		}
	}
	if ru.hosts != nil && !ru.hosts.Match(r.Host()) {
		return false
	}
	for i := range ru.headers {
		if !ru.headers[i].matchHeader(r) {
			return false
		}
	}
	for i := range ru.query {
		if !ru.query[i].matchQuery(r) {
			return false
		}
	}
	if ru.re != nil && !ru.re.MatchString(r.Path) {
		// "/x/" is "/x" too.
		p := r.Path
		if len(p) < 2 || p[len(p)-1] != '/' || !ru.re.MatchString(p[:len(p)-1]) {
			return false
		}
	}
	if len(ru.cidrs) > 0 && !contains(ru.cidrs, r.ClientIP(ru.policy)) {
		return false
	}
	if ru.when != nil && !ru.when.Holds(r.Activation(ru.policy)) {
		return false
	}
	return true
}

func newValue(name, v, re string, absent, invert bool) (value, error) {
	out := value{name: name, value: v, absent: absent, invert: invert}
	if re != "" {
		var err error
		if out.re, err = regexp.Compile(`^(?:` + re + `)$`); err != nil {
			return value{}, fmt.Errorf("regex: %w", err)
		}
	}
	return out, nil
}

// test reports whether one value matches.
func (v *value) test(s string) bool {
	switch {
	case v.re != nil:
		return v.re.MatchString(s)
	case v.value != "":
		return s == v.value
	}
	return true
}

// matchHeader applies the match to a header.
func (v *value) matchHeader(r *descriptor.Request) bool {
	vs := r.HeaderValues(v.name)
	if v.absent {
		return len(vs) == 0
	}
	found := false
	for _, s := range vs {
		if v.test(s) {
			found = true
			break
		}
	}
	return found != v.invert
}

// matchQuery applies the match to a query parameter.
func (v *value) matchQuery(r *descriptor.Request) bool {
	present, found := false, false
	r.QueryValues(v.name, func(s string) bool {
		present = true
		found = v.test(s)
		return !found
	})
	if v.absent {
		return !present
	}
	return found != v.invert
}

func prefixes(cidrs []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// contains reports whether a is in one of the networks. An invalid
// address (no client IP) is in none.
func contains(ps []netip.Prefix, a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Hosts matches a request's host against exact names and wildcards, as
// config.Match.Hosts describes. A nil *Hosts matches every host. It is
// immutable and safe for concurrent use.
type Hosts struct {
	exact    map[string]bool
	suffixes []string // ".example.com" for "*.example.com"
}

// NewHosts compiles a hosts list; nil for an empty one.
func NewHosts(hosts []string) (*Hosts, error) {
	if len(hosts) == 0 {
		return nil, nil
	}
	h := &Hosts{exact: map[string]bool{}}
	for _, name := range hosts {
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		switch {
		case name == "" || name == "*":
			return nil, fmt.Errorf("hosts: %q is not a host name", name)
		case strings.HasPrefix(name, "*."):
			h.suffixes = append(h.suffixes, name[1:])
		case strings.Contains(name, "*"):
			return nil, fmt.Errorf("hosts: %q: a wildcard must be the whole first label", name)
		default:
			h.exact[name] = true
		}
	}
	return h, nil
}

// Match reports whether host (lower case, without port, as
// descriptor.Request.Host gives it) is accepted.
func (h *Hosts) Match(host string) bool {
	if h == nil {
		return true
	}
	if h.exact[host] {
		return true
	}
	for _, s := range h.suffixes {
		if len(host) > len(s) && strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
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

// MatchPath returns the path rules are matched and keyed on: CleanPath of
// p once the forms that servers route as another path are read as that
// path. A segment's parameters are dropped ("/admin;jsessionid=1" is
// "/admin", as Java servers route it), a backslash is a separator (as some
// servers read it), and whitespace ending a segment is dropped ("/admin "
// is "/admin"). Each makes a rule hold more requests, never fewer; the
// application is still sent the path as the client wrote it, unless
// cleaning changed it. It does not allocate when p has none of them and
// is clean.
func MatchPath(p string) string {
	for i := 0; i < len(p); i++ {
		// A byte loop: strings.ContainsAny builds its set on every call,
		// and this runs on every request.
		if c := p[i]; c == ';' || c == '\\' || c == ' ' || c == '\t' {
			p = routedForm(p)
			break
		}
	}
	return CleanPath(p)
}

// routedForm is MatchPath's rewriting of p before cleaning.
func routedForm(p string) string {
	p = strings.ReplaceAll(p, "\\", "/")
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if j := strings.IndexByte(s, ';'); j >= 0 {
			s = s[:j]
		}
		segs[i] = strings.TrimRight(s, " \t")
	}
	return strings.Join(segs, "/")
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
