package infer

import (
	"regexp"

	"github.com/doppel-dev/doppel/twin"
)

// learnRelations finds fields holding keys of other tables: a string field (an
// order's user_id) or a list of strings (a user's orders), whose values have the
// other table's key pattern and at least one of which is a key the world holds.
func (m *model) learnRelations() {
	pats := map[string]*regexp.Regexp{}
	for _, tn := range m.tableNames {
		keys := sortedKeys(m.base[tn])
		if len(keys) == 0 {
			keys = sortedKeys(m.sightings[tn])
		}
		if p := keyPatternOf(keys); p != "" {
			pats[tn] = regexp.MustCompile(p)
		}
	}
	for _, tn := range m.tableNames {
		t := m.tables[tn]
		rows := m.base[tn]
		type stat struct{ total, pat, known int }
		single := map[string]map[string]*stat{}
		many := map[string]map[string]*stat{}
		var fieldOrder []string
		for _, k := range sortedKeys(rows) {
			r := rows[k]
			for i, f := range r.Keys {
				if f == t.keyField {
					continue
				}
				if single[f] == nil {
					single[f], many[f] = map[string]*stat{}, map[string]*stat{}
					fieldOrder = append(fieldOrder, f)
				}
				var vals []string
				target, isList := single[f], false
				switch x := r.Vals[i].(type) {
				case string:
					vals = []string{x}
				case []any:
					target, isList = many[f], true
					for _, e := range x {
						if s, ok := e.(string); ok {
							vals = append(vals, s)
						}
					}
				}
				for _, other := range m.tableNames {
					re := pats[other]
					if re == nil || (other == tn && !isList) {
						continue
					}
					st := target[other]
					if st == nil {
						st = &stat{}
						target[other] = st
					}
					for _, v := range vals {
						st.total++
						if re.MatchString(v) {
							st.pat++
						}
						if _, ok := m.anyRow(other, v); ok {
							st.known++
						}
					}
				}
			}
		}
		for _, f := range fieldOrder {
			for _, isMany := range []bool{false, true} {
				stats := single[f]
				if isMany {
					stats = many[f]
				}
				for _, other := range m.tableNames {
					st := stats[other]
					if st == nil || st.total == 0 || st.known == 0 || st.pat*10 < st.total*9 {
						continue
					}
					t.refs = append(t.refs, twin.Ref{Field: f, Table: other, Many: isMany})
					break
				}
			}
		}
	}
}
