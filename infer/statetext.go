package infer

import (
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/twin"
)

// Text answers as state tools read them (state.go): a template of literal pieces and holes, each hole named by
// the words before it.

// textTemplate answers the literal pieces the text answers share, with a hole between each two where they differ
// (a run of tokens), or nil when they do not align token by token or never differ.
func textTemplate(succ []*call) []string {
	toks := make([][]string, len(succ))
	for i, c := range succ {
		toks[i] = textTokens(c.text)
		if len(toks[i]) != len(toks[0]) {
			return nil
		}
	}
	n := len(toks[0])
	varies := make([]bool, n)
	any := false
	for j := 0; j < n; j++ {
		for i := 1; i < len(toks); i++ {
			if toks[i][j] != toks[0][j] {
				varies[j], any = true, true
				break
			}
		}
	}
	if !any {
		return nil
	}
	var lits []string
	var cur strings.Builder
	for j := 0; j < n; j++ {
		if !varies[j] {
			cur.WriteString(toks[0][j])
			continue
		}
		if j > 0 && varies[j-1] {
			continue // one hole runs over adjacent differing tokens
		}
		lits = append(lits, cur.String())
		cur.Reset()
	}
	lits = append(lits, cur.String())
	for i, l := range lits[1 : len(lits)-1] {
		if l == "" {
			_ = i
			return nil // two holes with nothing between: their split is not known
		}
	}
	return lits
}

// textTokens splits a text into words (letters, digits, and the dots, dashes and underscores inside them) and
// single other characters.
func textTokens(s string) []string {
	var out []string
	word := func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
	}
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && (word(s[j]) || (s[j] == '.' || s[j] == '-' || s[j] == '_') && j > i && j+1 < len(s) && word(s[j+1])) {
			j++
		}
		if j == i {
			j = i + 1
		}
		out = append(out, s[i:j])
		i = j
	}
	return out
}

// fillerWords are words between a name and its value in text ("Mobile Data is now ON").
var fillerWords = set("is", "are", "was", "were", "now", "the", "a", "an", "to", "set", "has", "been", "currently", "be", "at", "of")

// holeName names text hole i by the last words before it on its line, filler words left out ("Mobile Data is now
// ON" and "Mobile Data: OFF" both name "mobile data"): a tool showing that value and a tool setting it say so in
// the same words. "#i" when no word comes before it.
func holeName(lits []string, i int) string {
	before := lits[i]
	if k := strings.LastIndexByte(before, '\n'); k >= 0 {
		before = before[k+1:]
	}
	var words []string
	for _, w := range twin.LetterWords(before) {
		if !fillerWords[w] {
			words = append(words, w)
		}
	}
	if len(words) > 2 {
		words = words[len(words)-2:]
	}
	if len(words) == 0 {
		return "#" + strconv.Itoa(i)
	}
	return strings.Join(words, " ")
}
