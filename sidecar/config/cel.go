package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
)

// The CEL language of match.when, exempt.when and key expressions: the
// variables a request offers, and the bounds an expression must keep. Both
// planes compile expressions with Compile, so that the API admits exactly
// the expressions a sidecar loads.
//
// The variables:
//
//	request.method   string               the request method
//	request.path     string               the cleaned path, without the query
//	request.host     string               Host (or :authority), lower case, without the port
//	request.headers  map(string, string)  header names in lower case; several values joined with ","
//	request.query    map(string, string)  the first value of each query parameter, decoded
//	source.address   string               the client IP, read as trustedProxies says
//	auth.claims      map(string, dyn)     the claims of the verified bearer token; empty without one
//
// The standard library is there, with the strings extension (lowerAscii,
// split, ...) and the network extension (ip, cidr,
// cidr('10.0.0.0/8').containsIP(source.address)). Numbers of different
// types compare with each other, so a JSON claim (a double) compares with
// an int literal.
const (
	// VarMethod, VarPath, VarHost, VarHeaders, VarQuery, VarSource and
	// VarClaims are the names of the variables.
	VarMethod  = "request.method"
	VarPath    = "request.path"
	VarHost    = "request.host"
	VarHeaders = "request.headers"
	VarQuery   = "request.query"
	VarSource  = "source.address"
	VarClaims  = "auth.claims"

	// MaxExpressionLength bounds the text of one expression.
	MaxExpressionLength = 2048
	// MaxExpressionCost bounds the estimated worst-case cost of one
	// expression, in CEL's cost units (about one per elementary operation),
	// for a request head of at most HeadBytes bytes. It is the per-call
	// limit Kubernetes applies to the CEL rules of its own objects.
	MaxExpressionCost = 1_000_000
	// HeadBytes is the request head size the cost estimate assumes: the
	// sidecar's default --max-header-bytes. Each string a request offers is
	// at most this long, and each map holds at most HeadBytes/4 entries
	// (the shortest header line, "a:b" and its line end, takes 4 bytes).
	HeadBytes = 64 << 10
	// MaxKeyValueLength bounds the value a key expression computes; a
	// longer value is a missing key part.
	MaxKeyValueLength = 4096
)

// variables are the variables' names, for messages.
var variables = []string{VarMethod, VarPath, VarHost, VarHeaders, VarQuery, VarSource, VarClaims}

// ExpressionKind says what an expression computes.
type ExpressionKind int

// The ExpressionKinds.
const (
	// Condition is a predicate: match.when and exempt.when. It must be
	// of type bool.
	Condition ExpressionKind = iota + 1
	// KeyValue is a key part's value: a string, or a number or bool,
	// which is written in decimal (true and false for a bool). It may be
	// dyn (a claim), checked when the request is keyed.
	KeyValue
)

// Expression is a compiled expression.
type Expression struct {
	// AST is the checked syntax tree.
	AST *cel.Ast
	// Cost is the estimated worst-case cost.
	Cost uint64
	// Claims reports whether the expression reads auth.claims, which needs
	// the policy's jwt section.
	Claims bool
	// Loops reports whether the expression iterates (a comprehension such
	// as all, exists or map), the only way its cost grows faster than the
	// request.
	Loops bool
	// Headers are the request headers, lower case, that the expression
	// reads by name: request.headers['x-tier'], 'x-tier' in
	// request.headers, has(request.headers.x) and request.headers.x.
	Headers []string
	// AnyHeader reports whether it reads request.headers otherwise (as a
	// whole, or with a computed name), so that no list of headers covers
	// what it reads.
	AnyHeader bool
}

var env = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable(VarMethod, cel.StringType),
		cel.Variable(VarPath, cel.StringType),
		cel.Variable(VarHost, cel.StringType),
		cel.Variable(VarHeaders, cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable(VarQuery, cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable(VarSource, cel.StringType),
		cel.Variable(VarClaims, cel.MapType(cel.StringType, cel.DynType)),
		ext.Strings(),
		ext.Network(),
		cel.CrossTypeNumericComparisons(true),
		cel.ASTValidators(cel.ValidateRegexLiterals()),
	)
})

// CELEnv returns the CEL environment every expression is compiled in. It
// is immutable and safe for concurrent use.
func CELEnv() (*cel.Env, error) { return env() }

// CompileExpression parses, type-checks and cost-checks expr. The error
// says what is wrong in words that fit after a field path.
func CompileExpression(expr string, kind ExpressionKind) (*Expression, error) {
	if strings.TrimSpace(expr) == "" {
		return nil, errors.New("must not be empty")
	}
	if len(expr) > MaxExpressionLength {
		return nil, fmt.Errorf("at most %d characters, got %d", MaxExpressionLength, len(expr))
	}
	e, err := CELEnv()
	if err != nil {
		return nil, fmt.Errorf("the CEL environment: %w", err)
	}
	checked, iss := e.Compile(expr)
	if iss.Err() != nil {
		msg := oneLine(iss.Err().Error())
		if strings.Contains(msg, "undeclared reference") {
			msg += "; the variables are " + strings.Join(variables, ", ")
		}
		return nil, fmt.Errorf("not a valid CEL expression: %s", msg)
	}
	out := checked.OutputType()
	switch kind {
	case Condition:
		if !out.IsExactType(types.BoolType) && !out.IsExactType(types.DynType) {
			return nil, fmt.Errorf("must be a condition (of type bool), but is of type %s", out)
		}
	case KeyValue:
		ok := false
		for _, t := range []*types.Type{types.StringType, types.IntType, types.UintType, types.DoubleType, types.BoolType, types.DynType} {
			ok = ok || out.IsExactType(t)
		}
		if !ok {
			return nil, fmt.Errorf("must compute a string, a number or a bool, but is of type %s", out)
		}
	default:
		return nil, fmt.Errorf("unknown expression kind %d", kind)
	}
	est, err := e.EstimateCost(checked, costEstimator{})
	if err != nil {
		return nil, fmt.Errorf("cannot estimate its cost: %w", err)
	}
	if est.Max > MaxExpressionCost {
		return nil, fmt.Errorf("its estimated worst-case cost %d exceeds the limit %d (for a request head of %d bytes); iterate over fewer elements, for example without nesting comprehensions over request.headers",
			est.Max, MaxExpressionCost, HeadBytes)
	}
	info := &Expression{AST: checked, Cost: est.Max}
	native := checked.NativeRep()
	for _, ref := range native.ReferenceMap() {
		if ref.Name == VarClaims {
			info.Claims = true
		}
	}
	ast.PreOrderVisit(native.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if e.Kind() == ast.ComprehensionKind {
			info.Loops = true
		}
	}))
	info.Headers, info.AnyHeader = headersRead(native)
	return info, nil
}

// headersRead returns the header names, lower case, sorted and distinct,
// that a checked expression reads from request.headers by a literal name,
// and whether it reads the map in any other way.
func headersRead(a *ast.AST) (names []string, anyHeader bool) {
	refs := a.ReferenceMap()
	isHeaders := func(e ast.Expr) bool {
		ref, ok := refs[e.ID()]
		return ok && ref.Name == VarHeaders
	}
	byName := map[int64]bool{} // request.headers nodes read by a literal name
	ast.PreOrderVisit(a.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		switch e.Kind() {
		case ast.CallKind:
			call := e.AsCall()
			args := call.Args()
			if len(args) != 2 {
				return
			}
			m, k := args[0], args[1] // m[k]
			switch call.FunctionName() {
			case operators.Index, operators.OptIndex:
			case operators.In: // k in m
				m, k = args[1], args[0]
			default:
				return
			}
			if !isHeaders(m) || k.Kind() != ast.LiteralKind {
				return
			}
			if name, ok := k.AsLiteral().(types.String); ok {
				byName[m.ID()] = true
				names = append(names, strings.ToLower(string(name)))
			}
		case ast.SelectKind:
			if sel := e.AsSelect(); isHeaders(sel.Operand()) {
				byName[sel.Operand().ID()] = true
				names = append(names, strings.ToLower(sel.FieldName()))
			}
		}
	}))
	ast.PreOrderVisit(a.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if isHeaders(e) && !byName[e.ID()] {
			anyHeader = true
		}
	}))
	slices.Sort(names)
	return slices.Compact(names), anyHeader
}

// oneLine folds cel-go's multi-line issue report (message, source line,
// caret) into one line.
func oneLine(s string) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.Trim(l, "^.| ") == "" || strings.HasPrefix(l, "|") {
			continue
		}
		parts = append(parts, l)
	}
	return strings.Join(parts, "; ")
}

// costEstimator gives the sizes of what a request offers, which CEL does
// not know: every string at most HeadBytes long, every map at most
// HeadBytes/4 entries.
type costEstimator struct{}

func (costEstimator) EstimateSize(el checker.AstNode) *checker.SizeEstimate {
	if len(el.Path()) == 0 {
		return nil
	}
	switch el.Path()[0] {
	case VarHeaders, VarQuery, VarClaims:
		if len(el.Path()) == 1 {
			return &checker.SizeEstimate{Min: 0, Max: HeadBytes / 4}
		}
		return &checker.SizeEstimate{Min: 0, Max: HeadBytes}
	case VarMethod, VarPath, VarHost, VarSource:
		return &checker.SizeEstimate{Min: 0, Max: HeadBytes}
	}
	return nil
}

func (costEstimator) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}
