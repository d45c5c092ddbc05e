package twin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Listed rows in a session's world. The rows a search lists (listing.go: a flight's seats and prices on a date)
// are learned from the recordings once per runtime and shared; a session that changes one holds its own copy in
// its overlay, under the listing's own table name (listedTable), so forks and rebuilds carry it, and the state hash
// covers every row the session touched (withListed: a world whose listed rows are as recorded hashes as before).
// Searches, and the preconditions of writes on those rows, read them as the session sees them (listedView).
//
// A write changes them when the recordings show how: a successful call naming rows (a booking's flights) by the
// list argument of a per-row relation (precond.go), with the same row seen in one trace before and after it (a
// search of that flight and date on both sides), whose number (available_seats[cabin]) moved by the length of a
// list argument (the passengers), one way every time (rowEffect). It is learned only with at least
// minPrecondSuccesses such sightings and no sighting against it; what the recordings never show is not guessed.

// rowView answers a listing's row by id (listing.rowID), as some world sees it.
type rowView func(id string) (*jsonvalue.Object, bool)

// sighting is one recorded answer's copy of a row: in which trace and at which call.
type sighting struct {
	trace string
	call  int
	id    string
	row   *jsonvalue.Object
}

// recorded is the view of the rows as the recordings left them.
func (l *listing) recorded(id string) (*jsonvalue.Object, bool) {
	r, ok := l.rows[id]
	return r, ok
}

// listedPrefix starts the overlay table names of listings: a NUL, which no entity table's name holds.
const listedPrefix = "\x00listed:"

func listedTable(l *listing) string { return listedPrefix + l.name }

// listedView answers the view of a listing's rows in the session's world.
func (s *Session) listedView(l *listing) rowView {
	name := listedTable(l)
	return func(id string) (*jsonvalue.Object, bool) {
		if r, ok := s.over[name][id]; ok {
			return r, r != nil
		}
		return l.recorded(id)
	}
}

// putListed stores the session's copy of a listed row.
func (s *Session) putListed(l *listing, id string, row *jsonvalue.Object) {
	name := listedTable(l)
	if s.over[name] == nil {
		s.over[name] = map[string]*jsonvalue.Object{}
	}
	s.over[name][id] = row
	s.dirty = true
}

// listedTouched tells a search whose recorded answer for these very arguments may be stale: the session changed a
// row the search lists, so the rows answer it instead.
func (s *Session) listedTouched(t *rtTool, args *jsonvalue.Object) bool {
	l := t.listing
	if l == nil || len(s.over[listedTable(l)]) == 0 {
		return false
	}
	over := s.over[listedTable(l)]
	for _, id := range l.selected(args, l.recorded) {
		if _, ok := over[id]; ok {
			return true
		}
	}
	return false
}

// listedHashDomain prefixes the hash of a world with listed rows of its own.
const listedHashDomain = "doppel.world.v2+listed\n"

// withListed answers the world hash h extended by the session's own listed rows and the answers the trace it
// opened from observed (fromtrace.go), in name and id order; h itself when it holds none.
func (s *Session) withListed(h string) string {
	var names []string
	for name, rows := range s.over {
		if (strings.HasPrefix(name, listedPrefix) || strings.HasPrefix(name, observedPrefix)) && len(rows) > 0 {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return h
	}
	sort.Strings(names)
	d := sha256.New()
	d.Write([]byte(listedHashDomain))
	d.Write([]byte(h))
	var buf bytes.Buffer
	for _, name := range names {
		ids := make([]string, 0, len(s.over[name]))
		for id := range s.over[name] {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			buf.Reset()
			jsonvalue.AppendString(&buf, name)
			buf.WriteByte(':')
			jsonvalue.AppendString(&buf, id)
			buf.WriteByte(':')
			jsonvalue.AppendCanonical(&buf, s.over[name][id])
			buf.WriteByte('\n')
			d.Write(buf.Bytes())
		}
	}
	return "sha256:" + hex.EncodeToString(d.Sum(nil))
}

// rowEffect is a write's learned effect on the rows its arguments name: each row's number (p.member) moves by
// sign times the length of the list argument p.count.
type rowEffect struct {
	p    *precond
	sign float64
}

// learnEffects learns a write's effects on the listings' rows (see above). Of the per-row relations its arguments
// could hold, the one with the most sightings is kept; none when another as well supported moves a different
// number or counts a different list (the sightings cannot tell them apart).
func learnEffects(t *rtTool, ls []*listing) []*rowEffect {
	var best *rowEffect
	bestN, tied := 0, false
	for _, p := range perRowCandidates(t.all, ls) {
		n, sign := p.sightings(t.all)
		switch {
		case n < minPrecondSuccesses || n < bestN:
		case n == bestN:
			tied = true
		default:
			best, bestN, tied = &rowEffect{p: p, sign: sign}, n, false
		}
	}
	if best == nil || tied {
		return nil
	}
	return []*rowEffect{best}
}

// sightings counts the rows a successful call named that one trace shows before and after it (with no other
// successful call of the tool naming the row between), each moved by the same sign times the counted list's
// length; 0 when one moved otherwise.
func (p *precond) sightings(all []*rec) (int, float64) {
	n, sign := 0, 0.0
	for _, r := range all {
		a, ok := r.args.(*jsonvalue.Object)
		if r.isErr || !ok {
			continue
		}
		elems, ok := listArg(a, p.list)
		counted, ok2 := listArg(a, p.count)
		if !ok || !ok2 || len(counted) == 0 {
			continue
		}
		for _, e := range elems {
			id, ok := p.l.idOf(e)
			if !ok {
				continue
			}
			before, after, ok := p.l.around(r, id)
			if !ok || namedBetween(all, p, id, r, before.call, after.call) {
				continue
			}
			x, ok1 := p.member(before.row, a)
			y, ok2 := p.member(after.row, a)
			if !ok1 || !ok2 {
				continue
			}
			k := (y - x) / float64(len(counted))
			if (k != 1 && k != -1) || (sign != 0 && k != sign) {
				return 0, 0
			}
			sign = k
			n++
		}
	}
	return n, sign
}

// around answers the last sighting of row id before recording r in its trace and the first after it.
func (l *listing) around(r *rec, id string) (before, after sighting, ok bool) {
	var hasBefore, hasAfter bool
	for _, s := range l.seen[r.trace] {
		if s.id != id {
			continue
		}
		switch {
		case s.call < r.call:
			before, hasBefore = s, true
		case s.call > r.call && !hasAfter:
			after, hasAfter = s, true
		}
	}
	return before, after, hasBefore && hasAfter
}

// namedBetween tells whether another successful call of the tool in r's trace, strictly between calls from and
// to, names row id.
func namedBetween(all []*rec, p *precond, id string, r *rec, from, to int) bool {
	for _, o := range all {
		if o == r || o.isErr || o.trace != r.trace || o.call <= from || o.call >= to {
			continue
		}
		a, ok := o.args.(*jsonvalue.Object)
		if !ok {
			continue
		}
		elems, _ := listArg(a, p.list)
		for _, e := range elems {
			if oid, ok := p.l.idOf(e); ok && oid == id {
				return true
			}
		}
	}
	return false
}

// applyEffects changes the rows a successful write names in the session's world, as its effects say.
func (s *Session) applyEffects(t *rtTool, args *jsonvalue.Object) bool {
	changed := false
	for _, ef := range t.effects {
		p := ef.p
		elems, ok := listArg(args, p.list)
		counted, ok2 := listArg(args, p.count)
		sv, _ := args.Get(p.sel)
		sel, ok3 := sv.(string)
		if !ok || !ok2 || !ok3 {
			continue
		}
		view := s.listedView(p.l)
		for _, e := range elems {
			id, ok := p.l.idOf(e)
			if !ok {
				continue
			}
			row, ok := view(id)
			if !ok {
				continue
			}
			x, ok := p.member(row, args)
			if !ok {
				continue
			}
			fv, _ := row.Get(p.field)
			c := jsonvalue.Clone(row).(*jsonvalue.Object)
			m := jsonvalue.Clone(fv).(*jsonvalue.Object)
			m.Set(sel, jsonvalue.Number(formatNumber(x+ef.sign*float64(len(counted)))))
			c.Set(p.field, m)
			s.putListed(p.l, id, c)
			changed = true
		}
	}
	return changed
}
