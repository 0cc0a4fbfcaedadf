package expr

import (
	"net/http"
	"regexp"
	"strings"

	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/overloads"
	"github.com/google/cel-go/common/types"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// tri is a condition's outcome under CEL's rules: true, false, or an
// error, which && and || absorb when the other side decides.
type tri uint8

const (
	triFalse tri = iota
	triTrue
	triErr
)

func triOf(b bool) tri {
	if b {
		return triTrue
	}
	return triFalse
}

// boolFn is a condition translated into Go; strFn a string-valued
// expression, whose ok is false where CEL would give an error.
type (
	boolFn func(Input) tri
	strFn  func(Input) (s string, ok bool)
)

// lowerCondition translates a checked condition into Go, when every node
// of it is one the translation knows.
func lowerCondition(a *ast.AST) (boolFn, bool) {
	return lowerBool(a, a.Expr())
}

func lowerBool(a *ast.AST, e ast.Expr) (boolFn, bool) {
	switch e.Kind() {
	case ast.LiteralKind:
		b, ok := e.AsLiteral().(types.Bool)
		if !ok {
			return nil, false
		}
		v := triOf(bool(b))
		return func(Input) tri { return v }, true
	case ast.SelectKind:
		sel := e.AsSelect()
		if !sel.IsTestOnly() {
			return nil, false
		}
		// has(request.headers.name), has(request.query.name)
		return presence(a, sel.Operand(), sel.FieldName())
	case ast.CallKind:
		return lowerCall(a, e.AsCall())
	}
	return nil, false
}

// lowerCall translates a call that computes a bool.
func lowerCall(a *ast.AST, call ast.CallExpr) (boolFn, bool) {
	args := call.Args()
	switch fn := call.FunctionName(); {
	case fn == operators.LogicalAnd || fn == operators.LogicalOr:
		return lowerLogical(a, fn, args)
	case fn == operators.LogicalNot && len(args) == 1:
		return lowerNot(a, args[0])
	case (fn == operators.Equals || fn == operators.NotEquals) && len(args) == 2:
		return lowerEquality(a, fn == operators.Equals, args[0], args[1])
	case fn == operators.In && len(args) == 2:
		return lowerIn(a, args[0], args[1])
	case fn == overloads.StartsWith || fn == overloads.EndsWith || fn == overloads.Contains || fn == overloads.Matches:
		return lowerStringTest(a, fn, call)
	}
	return nil, false
}

// lowerLogical translates && and ||.
func lowerLogical(a *ast.AST, fn string, args []ast.Expr) (boolFn, bool) {
	fs := make([]boolFn, len(args))
	for i, arg := range args {
		f, ok := lowerBool(a, arg)
		if !ok {
			return nil, false
		}
		fs[i] = f
	}
	if fn == operators.LogicalAnd {
		return and(fs), true
	}
	return or(fs), true
}

// lowerNot translates !.
func lowerNot(a *ast.AST, arg ast.Expr) (boolFn, bool) {
	f, ok := lowerBool(a, arg)
	if !ok {
		return nil, false
	}
	return func(in Input) tri {
		switch f(in) {
		case triTrue:
			return triFalse
		case triFalse:
			return triTrue
		}
		return triErr
	}, true
}

// lowerEquality translates == (want true) and != (want false) of two
// strings.
func lowerEquality(a *ast.AST, want bool, left, right ast.Expr) (boolFn, bool) {
	if !isString(a, left) || !isString(a, right) {
		return nil, false
	}
	l, okL := lowerString(a, left)
	r, okR := lowerString(a, right)
	if !okL || !okR {
		return nil, false
	}
	// The usual shape compares with a literal: one closure call less.
	if lit, ok := stringLiteral(right); ok {
		return compareLiteral(l, lit, want), true
	}
	if lit, ok := stringLiteral(left); ok {
		return compareLiteral(r, lit, want), true
	}
	return func(in Input) tri {
		x, ok := l(in)
		if !ok {
			return triErr
		}
		y, ok := r(in)
		if !ok {
			return triErr
		}
		return triOf((x == y) == want)
	}, true
}

// lowerIn translates 'name' in a map of the request, and a string in a
// list of string literals.
func lowerIn(a *ast.AST, elem, container ast.Expr) (boolFn, bool) {
	// 'name' in request.headers, 'name' in request.query
	if lit, ok := stringLiteral(elem); ok {
		if f, ok := presence(a, container, lit); ok {
			return f, true
		}
	}
	// request.method in ['GET', 'HEAD']
	if container.Kind() != ast.ListKind || !isString(a, elem) {
		return nil, false
	}
	x, ok := lowerString(a, elem)
	if !ok {
		return nil, false
	}
	var list []string
	for _, el := range container.AsList().Elements() {
		s, ok := stringLiteral(el)
		if !ok {
			return nil, false
		}
		list = append(list, s)
	}
	if len(list) <= 8 {
		// A few comparisons beat hashing the string.
		return func(in Input) tri {
			s, ok := x(in)
			if !ok {
				return triErr
			}
			for _, e := range list {
				if s == e {
					return triTrue
				}
			}
			return triFalse
		}, true
	}
	set := map[string]bool{}
	for _, e := range list {
		set[e] = true
	}
	return func(in Input) tri {
		s, ok := x(in)
		if !ok {
			return triErr
		}
		return triOf(set[s])
	}, true
}

// lowerStringTest translates s.startsWith('lit'), endsWith, contains and
// matches('re') in both forms.
func lowerStringTest(a *ast.AST, fn string, call ast.CallExpr) (boolFn, bool) {
	args := call.Args()
	var target, arg ast.Expr
	switch {
	case call.IsMemberFunction() && len(args) == 1:
		target, arg = call.Target(), args[0]
	case !call.IsMemberFunction() && len(args) == 2 && fn == overloads.Matches:
		target, arg = args[0], args[1]
	default:
		return nil, false
	}
	if !isString(a, target) {
		return nil, false
	}
	lit, ok := stringLiteral(arg)
	if !ok {
		return nil, false
	}
	s, ok := lowerString(a, target)
	if !ok {
		return nil, false
	}
	var test func(string) bool
	switch fn {
	case overloads.StartsWith:
		test = func(v string) bool { return strings.HasPrefix(v, lit) }
	case overloads.EndsWith:
		test = func(v string) bool { return strings.HasSuffix(v, lit) }
	case overloads.Contains:
		test = func(v string) bool { return strings.Contains(v, lit) }
	case overloads.Matches:
		// CEL's matches is RE2 and unanchored, as MatchString is.
		re, err := regexp.Compile(lit)
		if err != nil {
			return nil, false
		}
		test = re.MatchString
	}
	return func(in Input) tri {
		v, ok := s(in)
		if !ok {
			return triErr
		}
		return triOf(test(v))
	}, true
}

// and is CEL's &&: false when any side is false, else an error when any
// side is an error, else true.
func and(fs []boolFn) boolFn {
	return func(in Input) tri {
		out := triTrue
		for _, f := range fs {
			switch f(in) {
			case triFalse:
				return triFalse
			case triErr:
				out = triErr
			}
		}
		return out
	}
}

// or is CEL's ||: true when any side is true, else an error when any side
// is an error, else false.
func or(fs []boolFn) boolFn {
	return func(in Input) tri {
		out := triFalse
		for _, f := range fs {
			switch f(in) {
			case triTrue:
				return triTrue
			case triErr:
				out = triErr
			}
		}
		return out
	}
}

// presence tests whether the map m (request.headers or request.query) has
// the key name.
func presence(a *ast.AST, m ast.Expr, name string) (boolFn, bool) {
	switch variable(a, m) {
	case config.VarHeaders:
		canon, lower := headerKey(name)
		if !lower {
			return func(Input) tri { return triFalse }, true
		}
		return func(in Input) tri { return triOf(len(in.HeaderValues(canon)) > 0) }, true
	case config.VarQuery:
		return func(in Input) tri {
			_, ok := in.QueryValue(name)
			return triOf(ok)
		}, true
	}
	return nil, false
}

// lowerString translates a string-valued expression: a string literal, a
// string variable, or a header or query parameter looked up by a literal
// name.
func lowerString(a *ast.AST, e ast.Expr) (strFn, bool) {
	if s, ok := stringLiteral(e); ok {
		return func(Input) (string, bool) { return s, true }, true
	}
	switch variable(a, e) {
	case config.VarMethod:
		return func(in Input) (string, bool) { return in.Method(), true }, true
	case config.VarPath:
		return func(in Input) (string, bool) { return in.Path(), true }, true
	case config.VarHost:
		return func(in Input) (string, bool) { return in.Host(), true }, true
	case config.VarSource:
		return func(in Input) (string, bool) { return in.SourceAddress(), true }, true
	}
	var m ast.Expr
	var name string
	switch e.Kind() {
	case ast.SelectKind:
		// request.headers.name
		sel := e.AsSelect()
		if sel.IsTestOnly() {
			return nil, false
		}
		m, name = sel.Operand(), sel.FieldName()
	case ast.CallKind:
		// request.headers['name']
		call := e.AsCall()
		if call.FunctionName() != operators.Index || len(call.Args()) != 2 {
			return nil, false
		}
		lit, ok := stringLiteral(call.Args()[1])
		if !ok {
			return nil, false
		}
		m, name = call.Args()[0], lit
	default:
		return nil, false
	}
	switch variable(a, m) {
	case config.VarHeaders:
		canon, lower := headerKey(name)
		if !lower {
			// The map's keys are lower case: no such key.
			return func(Input) (string, bool) { return "", false }, true
		}
		return func(in Input) (string, bool) {
			vs := in.HeaderValues(canon)
			switch len(vs) {
			case 0:
				return "", false
			case 1:
				return vs[0], true
			}
			return strings.Join(vs, ","), true
		}, true
	case config.VarQuery:
		return func(in Input) (string, bool) { return in.QueryValue(name) }, true
	}
	return nil, false
}

// headerKey returns the canonical form of a request.headers key, and
// whether the key is in lower case, as every key of that map is.
func headerKey(name string) (canonical string, lower bool) {
	return http.CanonicalHeaderKey(name), name == strings.ToLower(name)
}

// variable returns the name of the variable e refers to, or "".
func variable(a *ast.AST, e ast.Expr) string {
	if ref, ok := a.ReferenceMap()[e.ID()]; ok && ref.Value == nil && len(ref.OverloadIDs) == 0 {
		return ref.Name
	}
	if e.Kind() == ast.IdentKind {
		return e.AsIdent()
	}
	return ""
}

// compareLiteral is x == lit (want true) or x != lit (want false).
func compareLiteral(x strFn, lit string, want bool) boolFn {
	return func(in Input) tri {
		v, ok := x(in)
		if !ok {
			return triErr
		}
		return triOf((v == lit) == want)
	}
}

func stringLiteral(e ast.Expr) (string, bool) {
	if e.Kind() != ast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(types.String)
	return string(s), ok
}

// isString reports whether the checker typed e as a string (not dyn).
func isString(a *ast.AST, e ast.Expr) bool {
	return a.GetType(e.ID()).IsExactType(types.StringType)
}

// requiredPrefix returns a literal that request.path starts with wherever
// e is true: from request.path.startsWith(lit) and request.path == lit,
// and the longest of those that a conjunction requires. Anything else
// requires nothing ("").
func requiredPrefix(a *ast.AST, e ast.Expr) string {
	if e.Kind() != ast.CallKind {
		return ""
	}
	call := e.AsCall()
	args := call.Args()
	switch fn := call.FunctionName(); {
	case fn == operators.LogicalAnd:
		best := ""
		for _, arg := range args {
			if p := requiredPrefix(a, arg); len(p) > len(best) {
				best = p
			}
		}
		return best
	case fn == overloads.StartsWith && call.IsMemberFunction() && len(args) == 1:
		if variable(a, call.Target()) != config.VarPath {
			return ""
		}
		lit, _ := stringLiteral(args[0])
		return lit
	case fn == operators.Equals && len(args) == 2:
		for i := range 2 {
			if variable(a, args[i]) == config.VarPath {
				lit, _ := stringLiteral(args[1-i])
				return lit
			}
		}
	}
	return ""
}
