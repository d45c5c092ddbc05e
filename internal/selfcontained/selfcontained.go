// Package selfcontained finds files of the repository that name data outside it, so a clone passes on its own.
package selfcontained

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Finding is one place a file names something outside the repository.
type Finding struct {
	File string // relative to the root, slash-separated
	Line int
	What string
}

func (f Finding) String() string { return fmt.Sprintf("%s:%d: %s", f.File, f.Line, f.What) }

// textPatterns are what no text file may hold: a sibling shared/ directory beside a checkout and this machine's
// workspace. Spelled in parts so this file does not match itself.
var textPatterns = []string{
	".." + "/shared",
	"shared" + "/data",
	"/" + "work/",
}

// absPrefixes are absolute paths of a machine's own files (home and workspace directories); a Go string naming
// one is data outside the repository. System paths (/etc, /usr, /var/run/docker.sock, /tmp) are not data.
var absPrefixes = []string{"/" + "work/", "/" + "home/", "/" + "Users/", "/" + "root/", "/" + "mnt/"}

// Check walks the repository at root and returns every finding: text files holding a textPattern, and Go files
// whose string literals (or filepath.Join / path.Join of literals) name a path that leaves root or lies under an
// absPrefix. Binary files (a NUL in their first 8 KiB), gzip files and .git are skipped.
func Check(root string) ([]Finding, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	var out []Finding
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == ".git" { // a directory, or in a worktree a file naming one
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() || strings.HasSuffix(p, ".gz") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.IndexByte(data[:min(len(data), 8192)], 0) >= 0 {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		out = append(out, checkText(rel, data)...)
		if strings.HasSuffix(p, ".go") {
			fs, err := checkGo(rel, data)
			if err != nil {
				return err
			}
			out = append(out, fs...)
		}
		return nil
	})
	return out, err
}

func checkText(rel string, data []byte) []Finding {
	var out []Finding
	for i, line := range bytes.Split(data, []byte("\n")) {
		for _, pat := range textPatterns {
			if bytes.Contains(line, []byte(pat)) {
				out = append(out, Finding{rel, i + 1, fmt.Sprintf("names %q", pat)})
			}
		}
	}
	return out
}

// checkGo judges the strings of a Go file (rel, relative to the root) that name files: filepath.Join / path.Join
// of literals, literal arguments of the os and os/exec functions, and literal values of const and var
// declarations. Each is resolved against the file's directory. (Other literals, such as a hostile upload name in
// a test table, are data, not paths this code opens.)
func checkGo(rel string, data []byte) ([]Finding, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, data, parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", rel, err)
	}
	dir := path.Dir(rel)
	var out []Finding
	report := func(n ast.Node, p string) {
		if what := leaves(dir, p); what != "" {
			out = append(out, Finding{rel, fset.Position(n.Pos()).Line, what})
		}
	}
	literal := func(e ast.Expr) {
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil {
				report(lit, s)
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if joined, ok := literalJoin(n); ok {
				report(n, joined)
				return false
			}
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "os" || x.Name == "exec") {
					for _, a := range n.Args {
						literal(a)
					}
				}
			}
		case *ast.ValueSpec:
			for _, v := range n.Values {
				literal(v)
			}
		}
		return true
	})
	return out, nil
}

// literalJoin evaluates filepath.Join(...) or path.Join(...) whose arguments are all string literals.
func literalJoin(c *ast.CallExpr) (string, bool) {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Join" || len(c.Args) == 0 {
		return "", false
	}
	if x, ok := sel.X.(*ast.Ident); !ok || (x.Name != "filepath" && x.Name != "path") {
		return "", false
	}
	parts := make([]string, 0, len(c.Args))
	for _, a := range c.Args {
		lit, ok := a.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(lit.Value)
		if err != nil {
			return "", false
		}
		parts = append(parts, s)
	}
	return path.Join(parts...), true
}

// leaves says how p, a string of a Go file in dir (relative to the root), names a path outside the repository:
// a relative path whose ".." climb above the root, or an absolute one under an absPrefix; "" when it does not.
func leaves(dir, p string) string {
	if strings.ContainsAny(p, "\n\t ") {
		return ""
	}
	for _, pre := range absPrefixes {
		if strings.HasPrefix(p, pre) {
			return fmt.Sprintf("absolute path %q outside the repository", p)
		}
	}
	if p != ".." && !strings.HasPrefix(p, "../") {
		return ""
	}
	if j := path.Join(dir, p); j == ".." || strings.HasPrefix(j, "../") {
		return fmt.Sprintf("path %q leaves the repository (from %s/)", p, dir)
	}
	return ""
}
