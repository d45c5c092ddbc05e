package query

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"unicode"

	"github.com/doppel-dev/doppel/twin"
)

// Index ranks an agent's recorded runs by how close their first user message is to a request: TF-IDF cosine
// similarity over word tokens (lower-cased runs of letters and digits, stop words dropped), with sublinear term
// frequency (1 + ln tf) and smoothed inverse document frequency (ln((1+N)/(1+df)) + 1), vectors L2-normalised.
// Ties go to the smaller trace id, so the ranking is deterministic.
type Index struct {
	runs []twin.AgentRun
	idf  map[string]float64
	vecs []map[string]float64
}

// Match is a ranked run: its position in the profile's runs and its cosine similarity to the request.
type Match struct {
	Run   int
	Score float64
}

// NewIndex indexes runs (the twin.Agent's, in their order).
func NewIndex(runs []twin.AgentRun) *Index {
	ix := &Index{runs: runs, idf: map[string]float64{}, vecs: make([]map[string]float64, len(runs))}
	df := map[string]int{}
	tfs := make([]map[string]int, len(runs))
	for i, r := range runs {
		tfs[i] = termCounts(r.Request)
		for term := range tfs[i] {
			df[term]++
		}
	}
	n := float64(len(runs))
	for term, d := range df {
		ix.idf[term] = math.Log((1+n)/(1+float64(d))) + 1
	}
	for i, tf := range tfs {
		ix.vecs[i] = ix.vector(tf)
	}
	return ix
}

// Rank answers every run with a positive similarity to request, best first.
func (ix *Index) Rank(request string) []Match {
	q := ix.vector(termCounts(request))
	var out []Match
	for i, v := range ix.vecs {
		s := dot(q, v)
		if s > 0 {
			out = append(out, Match{Run: i, Score: s})
		}
	}
	slices.SortStableFunc(out, func(a, b Match) int {
		return cmp.Or(cmp.Compare(b.Score, a.Score), cmp.Compare(ix.runs[a.Run].TraceID, ix.runs[b.Run].TraceID))
	})
	return out
}

// Best answers the closest run, or false when no run shares a word with request.
func (ix *Index) Best(request string) (Match, bool) {
	r := ix.Rank(request)
	if len(r) == 0 {
		return Match{}, false
	}
	return r[0], true
}

// vector weighs term counts by idf (terms the index has never seen weigh nothing) and normalises the result.
func (ix *Index) vector(tf map[string]int) map[string]float64 {
	v := make(map[string]float64, len(tf))
	norm := 0.0
	for term, c := range tf {
		idf, ok := ix.idf[term]
		if !ok {
			continue
		}
		w := (1 + math.Log(float64(c))) * idf
		v[term] = w
		norm += w * w
	}
	if norm == 0 {
		return v
	}
	norm = math.Sqrt(norm)
	for term := range v {
		v[term] /= norm
	}
	return v
}

func dot(a, b map[string]float64) float64 {
	if len(b) < len(a) {
		a, b = b, a
	}
	s := 0.0
	for term, w := range a {
		s += w * b[term]
	}
	return s
}

// termCounts splits text into lower-cased runs of letters and digits, dropping one-letter words and stop words.
func termCounts(text string) map[string]int {
	out := map[string]int{}
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}) {
		if len([]rune(w)) < 2 || stopWords[w] {
			continue
		}
		out[w]++
	}
	return out
}

// stopWords are English function words that say nothing about a request.
var stopWords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`a about an and are as at be been but by can could do does for from had has have
		he her hi hello his how if in into is it its just me my no not of on or our please she so some than that the
		their them then there these they this to too up us was we were what when which who will with would you your`) {
		m[w] = true
	}
	return m
}()
