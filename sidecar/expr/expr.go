// Package expr evaluates the CEL expressions of a sidecar config: the
// conditions of match.when and exempt.when, and key expressions. They are
// compiled once, when a config is loaded, in the environment the config
// package defines (config.CELEnv), so the sidecar runs exactly the
// expressions floodgate-manager admitted.
//
// # Two ways to evaluate
//
// The conditions users write most are comparisons of the request's method,
// path, host, a header or a query parameter with constants: ==, !=, in a
// list of strings, startsWith, endsWith, contains, matches, presence (has()
// and in on request.headers or request.query), and their combinations with
// &&, || and !. Compile translates such an expression into native Go
// closures that read the request directly, with CEL's semantics intact,
// errors included (a header the request lacks is an error, which && and ||
// absorb as CEL does). Everything else runs in cel-go's interpreter, over
// an Activation that boxes each request value at most once per request.
// Both ways give the same answers; the package's tests check that on
// generated requests.
//
// A condition that evaluates to an error, or to anything but true, does
// not hold. A Program is immutable and safe for concurrent use; an
// Activation is used by one request at a time.
package expr

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"

	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// Input is the request head an expression reads. Its values are fixed for
// the duration of one request.
type Input interface {
	// Method is the request method.
	Method() string
	// Path is the cleaned path, without the query.
	Path() string
	// Host is the Host header (or :authority), in lower case, without the
	// port.
	Host() string
	// HeaderValues returns the values of the header with the canonical
	// name (net/http's form, such as "X-Api-Key").
	HeaderValues(canonical string) []string
	// Headers returns every header, with its name in lower case and its
	// values joined with ",". The caller does not modify it.
	Headers() map[string]string
	// QueryValue returns the first value of a query parameter, decoded.
	QueryValue(name string) (string, bool)
	// Query returns the first value of every query parameter. The caller
	// does not modify it.
	Query() map[string]string
	// SourceAddress is the client IP as text, "" when it is unknown.
	SourceAddress() string
	// Claims are the claims of the verified bearer token, nil without one.
	Claims() map[string]any
	// HeadSize is the size of the request head in bytes: method, path,
	// query and headers (names and values). Conditions that loop are only
	// run on heads of at most config.HeadBytes, the size their cost
	// estimate holds for.
	HeadSize() int
}

// Program is a compiled list of conditions, all of which must hold, or a
// compiled key expression.
type Program struct {
	kind config.ExpressionKind
	// native are the conditions translated into Go; interp the others.
	native []boolFn
	interp []cel.Program
	// loops is set when an interpreted expression iterates.
	loops bool
	// value is the key expression translated into Go, or nil.
	value strFn
	// srcs are the expressions as written, for errors and String.
	srcs []string
	// prefix is what every path on which the conditions hold starts with.
	prefix string
}

// CompileConditions compiles conditions that must all hold. No condition
// compiles to a Program that always holds.
func CompileConditions(conds []string) (*Program, error) {
	p := &Program{kind: config.Condition, srcs: conds}
	for i, c := range conds {
		e, err := config.CompileExpression(c, config.Condition)
		if err != nil {
			return nil, fmt.Errorf("when[%d]: %w", i, err)
		}
		if pre := requiredPrefix(e.AST.NativeRep(), e.AST.NativeRep().Expr()); len(pre) > len(p.prefix) {
			p.prefix = pre
		}
		if f, ok := lowerCondition(e.AST.NativeRep()); ok {
			p.native = append(p.native, f)
			continue
		}
		prg, err := program(e)
		if err != nil {
			return nil, fmt.Errorf("when[%d]: %w", i, err)
		}
		p.interp = append(p.interp, prg)
		p.loops = p.loops || e.Loops
	}
	return p, nil
}

// CompileKey compiles a key expression.
func CompileKey(src string) (*Program, error) {
	e, err := config.CompileExpression(src, config.KeyValue)
	if err != nil {
		return nil, err
	}
	p := &Program{kind: config.KeyValue, srcs: []string{src}}
	if f, ok := lowerString(e.AST.NativeRep(), e.AST.NativeRep().Expr()); ok {
		p.value = f
		return p, nil
	}
	prg, err := program(e)
	if err != nil {
		return nil, err
	}
	p.interp = []cel.Program{prg}
	p.loops = e.Loops
	return p, nil
}

// program builds the interpreter's program.
//
// The cost of an expression is bounded by its static estimate, which holds
// for a request head of config.HeadBytes; without loops, cost grows with
// the head only linearly, and the head is bounded by --max-header-bytes.
// An expression that loops is run only on heads within config.HeadBytes
// (see tooBig), rather than under cel-go's runtime cost limit, whose
// tracking made a loop over n elements take time in n squared.
func program(e *config.Expression) (cel.Program, error) {
	env, err := config.CELEnv()
	if err != nil {
		return nil, err
	}
	prg, err := env.Program(e.AST,
		cel.EvalOptions(cel.OptOptimize),
		cel.OptimizeRegex(interpreter.MatchesRegexOptimization))
	if err != nil {
		return nil, fmt.Errorf("build the program: %w", err)
	}
	return prg, nil
}

// Native reports how many of the program's expressions run as native Go
// rather than in the interpreter, and how many there are.
func (p *Program) Native() (native, total int) {
	if p.kind == config.KeyValue {
		if p.value != nil {
			return 1, 1
		}
		return 0, 1
	}
	return len(p.native), len(p.native) + len(p.interp)
}

// PathPrefix returns a string that the path of every request on which the
// conditions hold starts with ("" when the conditions do not say), so that
// a matcher can index the rule under it, as it indexes a path match. It is
// read from conditions such as request.path.startsWith('/api/') and
// request.path == '/login', alone or in a conjunction.
func (p *Program) PathPrefix() string { return p.prefix }

// String returns the expressions as written.
func (p *Program) String() string { return fmt.Sprint(p.srcs) }

// Holds reports whether every condition holds on a's request. A nil
// Program holds.
func (p *Program) Holds(a *Activation) bool {
	if p == nil {
		return true
	}
	for _, f := range p.native {
		if f(a.in) != triTrue {
			return false
		}
	}
	if p.tooBig(a) {
		return false
	}
	for _, prg := range p.interp {
		out, _, err := prg.Eval(a)
		if err != nil || out != types.True {
			return false
		}
	}
	return true
}

// tooBig reports whether a's request head is too large for the program's
// loops to run on.
func (p *Program) tooBig(a *Activation) bool {
	if !p.loops {
		return false
	}
	if a.headSize < 0 {
		a.headSize = a.in.HeadSize()
	}
	return a.headSize > config.HeadBytes
}

// errNoValue is a key expression that gave no usable value.
var errNoValue = errors.New("no value")

// AppendValue appends the key expression's value on a's request to dst.
// ok is false when the expression fails, computes a list, a map or null,
// or a value longer than config.MaxKeyValueLength.
func (p *Program) AppendValue(dst []byte, a *Activation) (out []byte, ok bool) {
	start := len(dst)
	var err error
	if p.value != nil {
		s, good := p.value(a.in)
		if !good {
			return dst, false
		}
		dst = append(dst, s...)
	} else {
		if p.tooBig(a) {
			return dst, false
		}
		dst, err = appendVal(dst, p.interp[0], a)
		if err != nil {
			return dst[:start], false
		}
	}
	if len(dst)-start > config.MaxKeyValueLength {
		return dst[:start], false
	}
	return dst, true
}

func appendVal(dst []byte, prg cel.Program, a *Activation) ([]byte, error) {
	v, _, err := prg.Eval(a)
	if err != nil {
		return dst, err
	}
	switch v := v.(type) {
	case types.String:
		return append(dst, v...), nil
	case types.Int:
		return strconv.AppendInt(dst, int64(v), 10), nil
	case types.Uint:
		return strconv.AppendUint(dst, uint64(v), 10), nil
	case types.Double:
		f := float64(v)
		if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			// A JSON number that is a whole number keys like the int.
			return strconv.AppendInt(dst, int64(f), 10), nil
		}
		return strconv.AppendFloat(dst, f, 'g', -1, 64), nil
	case types.Bool:
		return strconv.AppendBool(dst, bool(v)), nil
	}
	return dst, errNoValue
}

// Activation is the interpreter's view of one request: it resolves the
// variables of config.CELEnv from an Input, boxing each value at most once.
// Reset it for every request; it is not safe for concurrent use.
type Activation struct {
	in Input

	method, path, host, source ref.Val
	headers, query             map[string]string
	claims                     map[string]any
	claimsDone                 bool
	headSize                   int // -1 until read
}

// Reset points a at a new request.
func (a *Activation) Reset(in Input) {
	*a = Activation{in: in, headSize: -1}
}

// ResolveName implements interpreter.Activation.
func (a *Activation) ResolveName(name string) (any, bool) {
	switch name {
	case config.VarMethod:
		if a.method == nil {
			a.method = types.String(a.in.Method())
		}
		return a.method, true
	case config.VarPath:
		if a.path == nil {
			a.path = types.String(a.in.Path())
		}
		return a.path, true
	case config.VarHost:
		if a.host == nil {
			a.host = types.String(a.in.Host())
		}
		return a.host, true
	case config.VarSource:
		if a.source == nil {
			a.source = types.String(a.in.SourceAddress())
		}
		return a.source, true
	case config.VarHeaders:
		if a.headers == nil {
			a.headers = a.in.Headers()
		}
		return a.headers, true
	case config.VarQuery:
		if a.query == nil {
			a.query = a.in.Query()
		}
		return a.query, true
	case config.VarClaims:
		if !a.claimsDone {
			a.claims, a.claimsDone = a.in.Claims(), true
			if a.claims == nil {
				a.claims = map[string]any{}
			}
		}
		return a.claims, true
	}
	return nil, false
}

// Parent implements interpreter.Activation.
func (a *Activation) Parent() interpreter.Activation { return nil }
