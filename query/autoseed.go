package query

import (
	"regexp"
	"strings"

	"github.com/doppel-dev/doppel/twin"
)

var emailRE = regexp.MustCompile(`[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}`)

// DeriveSeed writes seed instructions, in the plain form the twin's seed parser reads, for what a request names:
// an identifier that is a row's key in the world ("order #W2378156") pins that row; one shaped like a table's
// keys but absent creates it; an e-mail address found in a row pins that row, and one found nowhere creates a row
// of the table whose rows hold e-mail addresses, with that address. Clauses follow the order the request names
// them; nothing named gives "". The same request and tables always give the same instructions.
func DeriveSeed(request string, tables []twin.Table) string {
	var clauses []string
	seen := map[string]bool{}
	add := func(c string) {
		if !seen[c] {
			seen[c] = true
			clauses = append(clauses, c)
		}
	}
	emails := emailRE.FindAllString(request, -1)
	rest := emailRE.ReplaceAllString(request, " ")
	for _, e := range emails {
		if c := emailClause(e, tables); c != "" {
			add(c)
		}
	}
	for _, tok := range strings.Fields(rest) {
		tok = strings.TrimRight(strings.TrimLeft(tok, `"'([{<`), `"'.,;:!?)]}>`)
		if !idLike(tok) {
			continue
		}
		if c := keyClause(tok, tables); c != "" {
			add(c)
		}
	}
	return strings.Join(clauses, "; ")
}

// idLike: a token with a digit and at least four characters, the shape of identifiers (not a count or a year
// alone: those are all digits and short).
func idLike(tok string) bool {
	if len(tok) < 4 || strings.ContainsAny(tok, " \t") {
		return false
	}
	digit, other := false, false
	for _, r := range tok {
		switch {
		case r >= '0' && r <= '9':
			digit = true
		default:
			other = true
		}
	}
	return digit && (other || len(tok) >= 6)
}

func keyClause(tok string, tables []twin.Table) string {
	for _, t := range tables {
		if hasKey(t, tok) {
			return singular(t.Name) + " " + quote(tok)
		}
	}
	for _, t := range tables {
		if t.KeyShape != "" && shapeFits(t.KeyShape, tok) {
			return singular(t.Name) + " " + quote(tok)
		}
	}
	return ""
}

func hasKey(t twin.Table, key string) bool {
	lo, hi := 0, len(t.Rows)
	for lo < hi { // rows are sorted by key
		m := (lo + hi) / 2
		if t.Rows[m].Key < key {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo < len(t.Rows) && t.Rows[lo].Key == key
}

func emailClause(email string, tables []twin.Table) string {
	needle := `"` + email + `"`
	for _, t := range tables {
		for _, r := range t.Rows {
			if strings.Contains(r.JSON, needle) {
				return singular(t.Name) + " " + quote(r.Key)
			}
		}
	}
	for _, t := range tables {
		if f := emailField(t); f != "" {
			return singular(t.Name) + " with " + f + " " + quote(email)
		}
	}
	return ""
}

var emailFieldRE = regexp.MustCompile(`"([A-Za-z_][A-Za-z0-9_]*)"\s*:\s*"[^"@]+@[^"]+\.[A-Za-z]{2,}"`)

// emailField names the top-level-looking field the table's first rows hold an e-mail address in.
func emailField(t twin.Table) string {
	for i, r := range t.Rows {
		if i == 20 {
			break
		}
		if m := emailFieldRE.FindStringSubmatch(r.JSON); m != nil {
			return m[1]
		}
	}
	return ""
}

// shapeFits matches a key against a table's key shape (9 a digit, A an upper-case and a a lower-case letter, \x
// the character x, anything else itself).
func shapeFits(shape, key string) bool {
	i := 0
	for j := 0; j < len(shape); j++ {
		if i >= len(key) {
			return false
		}
		c, k := shape[j], key[i]
		switch {
		case c == '\\' && j+1 < len(shape):
			j++
			if shape[j] != k {
				return false
			}
		case c == '9':
			if k < '0' || k > '9' {
				return false
			}
		case c == 'A':
			if k < 'A' || k > 'Z' {
				return false
			}
		case c == 'a':
			if k < 'a' || k > 'z' {
				return false
			}
		default:
			if c != k {
				return false
			}
		}
		i++
	}
	return i == len(key)
}

func singular(table string) string {
	switch {
	case strings.HasSuffix(table, "ies"):
		return strings.TrimSuffix(table, "ies") + "y"
	case strings.HasSuffix(table, "s"):
		return strings.TrimSuffix(table, "s")
	}
	return table
}

// quote keeps a key whole for the seed parser when it holds a space or quote-like characters.
func quote(key string) string {
	if strings.ContainsAny(key, " \t;") {
		return `"` + key + `"`
	}
	return key
}
