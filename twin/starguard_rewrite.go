package twin

import (
	"fmt"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// The rewrite of provided source: what can allocate goes through the guards (starguard.go).

// Names of the guard functions the rewrite calls: "·" does not occur in Starlark identifiers, so the source can
// neither name, shadow nor rebind them.
const (
	guardPrefix = "·"
	guardAttr   = guardPrefix + "attr"
	guardSlice  = guardPrefix + "slice"
	guardSpread = guardPrefix + "spread"
	guardKw     = guardPrefix + "spreadkw"
	guardAug    = guardPrefix + "aug"
)

// guardedBinary are the binary operators the rewrite routes through guards: those that can make a value larger
// than a constant (comparisons and membership cannot).
var guardedBinary = map[syntax.Token]bool{
	syntax.PLUS: true, syntax.MINUS: true, syntax.STAR: true, syntax.SLASH: true, syntax.SLASHSLASH: true,
	syntax.PERCENT: true, syntax.AMP: true, syntax.PIPE: true, syntax.CIRCUMFLEX: true, syntax.LTLT: true,
	syntax.GTGT: true,
}

// augmented maps an augmented assignment to its binary operator.
var augmented = map[syntax.Token]syntax.Token{
	syntax.PLUS_EQ: syntax.PLUS, syntax.MINUS_EQ: syntax.MINUS, syntax.STAR_EQ: syntax.STAR, syntax.SLASH_EQ: syntax.SLASH,
	syntax.SLASHSLASH_EQ: syntax.SLASHSLASH, syntax.PERCENT_EQ: syntax.PERCENT, syntax.AMP_EQ: syntax.AMP,
	syntax.PIPE_EQ: syntax.PIPE, syntax.CIRCUMFLEX_EQ: syntax.CIRCUMFLEX, syntax.LTLT_EQ: syntax.LTLT,
	syntax.GTGT_EQ: syntax.GTGT,
}

func binaryGuardName(op syntax.Token) string { return guardPrefix + op.String() }
func augGuardName(op syntax.Token) string    { return guardAug + op.String() }
func unaryGuardName(op syntax.Token) string  { return guardPrefix + "unary" + op.String() }

// rewriter rewrites a provided file's syntax tree so that what can allocate goes through the guards.
type rewriter struct {
	temps int
}

// guardFile rewrites f in place.
func guardFile(f *syntax.File) {
	r := &rewriter{}
	f.Stmts = r.stmts(f.Stmts)
}

func ident(name string, pos syntax.Position) *syntax.Ident {
	return &syntax.Ident{NamePos: pos, Name: name}
}

func call(name string, pos syntax.Position, args ...syntax.Expr) *syntax.CallExpr {
	return &syntax.CallExpr{Fn: ident(name, pos), Lparen: pos, Args: args, Rparen: pos}
}

func strLit(s string, pos syntax.Position) *syntax.Literal {
	return &syntax.Literal{Token: syntax.STRING, TokenPos: pos, Raw: fmt.Sprintf("%q", s), Value: s}
}

func none(pos syntax.Position) syntax.Expr { return ident("None", pos) }

func (r *rewriter) temp(pos syntax.Position) *syntax.Ident {
	r.temps++
	return ident(fmt.Sprintf("%stmp%d", guardPrefix, r.temps), pos)
}

func (r *rewriter) stmts(in []syntax.Stmt) []syntax.Stmt {
	out := make([]syntax.Stmt, 0, len(in))
	for _, s := range in {
		out = append(out, r.stmt(s)...)
	}
	return out
}

func (r *rewriter) stmt(s syntax.Stmt) []syntax.Stmt {
	switch s := s.(type) {
	case *syntax.AssignStmt:
		if op, ok := augmented[s.Op]; ok {
			return r.augment(s, op)
		}
		s.LHS = r.target(s.LHS)
		s.RHS = r.expr(s.RHS)
	case *syntax.ExprStmt:
		s.X = r.expr(s.X)
	case *syntax.ReturnStmt:
		if s.Result != nil {
			s.Result = r.expr(s.Result)
		}
	case *syntax.IfStmt:
		s.Cond = r.expr(s.Cond)
		s.True = r.stmts(s.True)
		s.False = r.stmts(s.False)
	case *syntax.ForStmt:
		s.Vars = r.target(s.Vars)
		s.X = r.expr(s.X)
		s.Body = r.stmts(s.Body)
	case *syntax.WhileStmt:
		s.Cond = r.expr(s.Cond)
		s.Body = r.stmts(s.Body)
	case *syntax.DefStmt:
		r.params(s.Params)
		s.Body = r.stmts(s.Body)
	}
	return []syntax.Stmt{s}
}

// params rewrites the default values of a function's parameters.
func (r *rewriter) params(ps []syntax.Expr) {
	for _, p := range ps {
		if b, ok := p.(*syntax.BinaryExpr); ok && b.Op == syntax.EQ {
			b.Y = r.expr(b.Y)
		}
	}
}

// target rewrites what an assignment target evaluates (indexes, the operand of an index or a field), not the
// target itself.
func (r *rewriter) target(e syntax.Expr) syntax.Expr {
	switch x := e.(type) {
	case *syntax.IndexExpr:
		x.X = r.expr(x.X)
		x.Y = r.expr(x.Y)
	case *syntax.DotExpr:
		x.X = r.expr(x.X)
	case *syntax.TupleExpr:
		for i := range x.List {
			x.List[i] = r.target(x.List[i])
		}
	case *syntax.ListExpr:
		for i := range x.List {
			x.List[i] = r.target(x.List[i])
		}
	case *syntax.ParenExpr:
		x.X = r.target(x.X)
	}
	return e
}

// augment rewrites lhs op= rhs as lhs = ·aug<op>(lhs, rhs), evaluating what lhs names once: into temporaries when
// it is an index or a field.
func (r *rewriter) augment(s *syntax.AssignStmt, op syntax.Token) []syntax.Stmt {
	pos := s.OpPos
	rhs := r.expr(s.RHS)
	assign := func(lhs, read syntax.Expr) *syntax.AssignStmt {
		return &syntax.AssignStmt{OpPos: pos, Op: syntax.EQ, LHS: lhs, RHS: call(augGuardName(op), pos, read, rhs)}
	}
	switch x := s.LHS.(type) {
	case *syntax.Ident:
		return []syntax.Stmt{assign(ident(x.Name, x.NamePos), ident(x.Name, x.NamePos))}
	case *syntax.IndexExpr:
		obj, key := r.temp(pos), r.temp(pos)
		return []syntax.Stmt{
			&syntax.AssignStmt{OpPos: pos, Op: syntax.EQ, LHS: obj, RHS: r.expr(x.X)},
			&syntax.AssignStmt{OpPos: pos, Op: syntax.EQ, LHS: key, RHS: r.expr(x.Y)},
			assign(&syntax.IndexExpr{X: ident(obj.Name, pos), Lbrack: x.Lbrack, Y: ident(key.Name, pos), Rbrack: x.Rbrack},
				&syntax.IndexExpr{X: ident(obj.Name, pos), Lbrack: x.Lbrack, Y: ident(key.Name, pos), Rbrack: x.Rbrack}),
		}
	case *syntax.DotExpr:
		obj := r.temp(pos)
		return []syntax.Stmt{
			&syntax.AssignStmt{OpPos: pos, Op: syntax.EQ, LHS: obj, RHS: r.expr(x.X)},
			assign(&syntax.DotExpr{X: ident(obj.Name, pos), Dot: x.Dot, Name: ident(x.Name.Name, x.Name.NamePos)},
				&syntax.DotExpr{X: ident(obj.Name, pos), Dot: x.Dot, Name: ident(x.Name.Name, x.Name.NamePos)}),
		}
	}
	// The parser allows nothing else as an augmented target; the resolver reports it.
	s.RHS = rhs
	return []syntax.Stmt{s}
}

func (r *rewriter) expr(e syntax.Expr) syntax.Expr {
	switch x := e.(type) {
	case nil:
		return nil
	case *syntax.BinaryExpr:
		x.X, x.Y = r.expr(x.X), r.expr(x.Y)
		if guardedBinary[x.Op] {
			return call(binaryGuardName(x.Op), x.OpPos, x.X, x.Y)
		}
	case *syntax.UnaryExpr:
		x.X = r.expr(x.X)
		if x.Op == syntax.MINUS || x.Op == syntax.TILDE || x.Op == syntax.PLUS {
			return call(unaryGuardName(x.Op), x.OpPos, x.X)
		}
	case *syntax.CallExpr:
		x.Fn = r.expr(x.Fn)
		for i, a := range x.Args {
			switch a := a.(type) {
			case *syntax.UnaryExpr: // *args, **kwargs
				a.X = r.expr(a.X)
				switch a.Op {
				case syntax.STAR:
					a.X = call(guardSpread, a.OpPos, a.X)
				case syntax.STARSTAR:
					a.X = call(guardKw, a.OpPos, a.X)
				}
			case *syntax.BinaryExpr: // name=value
				if a.Op == syntax.EQ {
					a.Y = r.expr(a.Y)
					continue
				}
				x.Args[i] = r.expr(a)
			default:
				x.Args[i] = r.expr(a)
			}
		}
	case *syntax.DotExpr:
		x.X = r.expr(x.X)
		if guardedMethod(x.Name.Name) {
			return call(guardAttr, x.Dot, x.X, strLit(x.Name.Name, x.Name.NamePos))
		}
	case *syntax.SliceExpr:
		pos := x.Lbrack
		arg := func(e syntax.Expr) syntax.Expr {
			if e == nil {
				return none(pos)
			}
			return r.expr(e)
		}
		return call(guardSlice, pos, r.expr(x.X), arg(x.Lo), arg(x.Hi), arg(x.Step))
	case *syntax.IndexExpr:
		x.X, x.Y = r.expr(x.X), r.expr(x.Y)
	case *syntax.ParenExpr:
		x.X = r.expr(x.X)
	case *syntax.CondExpr:
		x.Cond, x.True, x.False = r.expr(x.Cond), r.expr(x.True), r.expr(x.False)
	case *syntax.ListExpr:
		for i := range x.List {
			x.List[i] = r.expr(x.List[i])
		}
	case *syntax.TupleExpr:
		for i := range x.List {
			x.List[i] = r.expr(x.List[i])
		}
	case *syntax.DictExpr:
		for _, en := range x.List {
			if d, ok := en.(*syntax.DictEntry); ok {
				d.Key, d.Value = r.expr(d.Key), r.expr(d.Value)
			}
		}
	case *syntax.Comprehension:
		x.Body = r.expr(x.Body)
		for _, c := range x.Clauses {
			switch c := c.(type) {
			case *syntax.ForClause:
				c.Vars = r.target(c.Vars)
				c.X = r.expr(c.X)
			case *syntax.IfClause:
				c.Cond = r.expr(c.Cond)
			}
		}
	case *syntax.LambdaExpr:
		r.params(x.Params)
		x.Body = r.expr(x.Body)
	}
	return e
}

// compileGuarded compiles provided source with its allocations guarded, and runs its top level on th (which must
// carry a budget), answering its globals.
func compileGuarded(th *starlark.Thread, filename, src string, pre starlark.StringDict) (starlark.StringDict, error) {
	f, err := fileOptions.Parse(filename, src, 0)
	if err != nil {
		return nil, err
	}
	guardFile(f)
	prog, err := starlark.FileProgram(f, pre.Has)
	if err != nil {
		return nil, err
	}
	return prog.Init(th, pre)
}
