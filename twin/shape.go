package twin

import (
	"sort"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
)

// Shape agreement. Two answers agree in shape when they have the same JSON types, objects the same keys and
// arrays elements of the same shapes — except where an object is a map: its keys are data (ids such as a
// user's payment methods or a product's variants, or the attributes one product's options name), so which
// keys it has is a value, not a shape, and a map is compared like an array, by the shapes of its members.
// Whether an object is a map is learned from the recordings (LearnMapPaths), never from the two answers.

// MapPaths are the paths of a tool's answers whose objects are maps. A path names the object's place:
// "" the answer itself, ".field" a field, "[]" an array's elements, "*" a map's members
// (".payment_methods", ".variants*.options", ".items[].options").
type MapPaths map[string]bool

// mapMinObjects is how many objects a path must show before their keys can tell a map.
const mapMinObjects = 3

// mapDepth bounds the rounds of LearnMapPaths (each finds maps nested in the last round's).
const mapDepth = 4

// keyStat is what the objects recorded at one path show of their keys.
type keyStat struct {
	objects int
	keys    map[string]int
	sets    map[string]bool
}

// LearnMapPaths answers the paths at which the recorded answers' objects are maps: at least mapMinObjects
// objects, with at least two different key sets, and no key that every one of them has — a record always
// has some field in common (its id, a name), a map keyed by data need not. Members of a map found are then
// walked together under "*", which finds maps inside them (a variant's options).
func LearnMapPaths(answers []any) MapPaths {
	maps := MapPaths{}
	for range mapDepth {
		stats := map[string]*keyStat{}
		for _, a := range answers {
			walkKeys(a, "", maps, stats)
		}
		grew := false
		paths := make([]string, 0, len(stats))
		for p := range stats {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			if st := stats[p]; !maps[p] && st.isMap() {
				maps[p] = true
				grew = true
			}
		}
		if !grew {
			break
		}
	}
	return maps
}

func (st *keyStat) isMap() bool {
	if st.objects < mapMinObjects || len(st.sets) < 2 {
		return false
	}
	for _, n := range st.keys {
		if n == st.objects {
			return false
		}
	}
	return true
}

// walkKeys records the key sets of the objects in v, by path; the members of maps already known are walked
// under "*".
func walkKeys(v any, path string, maps MapPaths, stats map[string]*keyStat) {
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			walkKeys(e, path+"[]", maps, stats)
		}
	case *jsonvalue.Object:
		if maps[path] {
			for _, m := range x.Vals {
				walkKeys(m, path+"*", maps, stats)
			}
			return
		}
		st := stats[path]
		if st == nil {
			st = &keyStat{keys: map[string]int{}, sets: map[string]bool{}}
			stats[path] = st
		}
		st.objects++
		ks := append([]string(nil), x.Keys...)
		sort.Strings(ks)
		for _, k := range ks {
			st.keys[k]++
		}
		st.sets[strings.Join(ks, "\x00")] = true
		for i, k := range x.Keys {
			walkKeys(x.Vals[i], path+"."+k, maps, stats)
		}
	}
}

// ShapesAgree compares two tool answers by shape, not value, knowing no maps (ShapesAgreeMaps).
func ShapesAgree(a, b string) bool { return ShapesAgreeMaps(a, b, nil) }

// ShapesAgreeMaps compares two tool answers by shape, not value. Where both parse as JSON they agree when
// they have the same shape: the same JSON type; objects with the same keys (in any order) whose values agree
// in shape; arrays whose elements agree in shape (each element of one matches some element of the other; an
// empty array matches any array, having no element shape to disagree with); and objects at the paths maps
// names compared as arrays of their members. Where either is text (not JSON) they agree when both are text and
// both are errors (IsErrorAnswer) or both are not.
func ShapesAgreeMaps(a, b string, maps MapPaths) bool {
	ja, jb := jsonvalue.LooksJSON(a), jsonvalue.LooksJSON(b)
	if ja && jb {
		va, err1 := jsonvalue.ParseString(a)
		vb, err2 := jsonvalue.ParseString(b)
		if err1 == nil && err2 == nil {
			return sameShape(va, vb, "", maps)
		}
		ja, jb = err1 == nil, err2 == nil
	}
	if ja != jb {
		return false
	}
	return IsErrorAnswer(a) == IsErrorAnswer(b)
}

// sameShape is ShapesAgreeMaps on parsed JSON values at path.
func sameShape(a, b any, path string, maps MapPaths) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool:
		_, ok := b.(bool)
		return ok
	case string:
		_, ok := b.(string)
		return ok
	case jsonvalue.Number:
		_, ok := b.(jsonvalue.Number)
		return ok
	case []any:
		y, ok := b.([]any)
		return ok && elemsCovered(x, y, path+"[]", maps) && elemsCovered(y, x, path+"[]", maps)
	case *jsonvalue.Object:
		y, ok := b.(*jsonvalue.Object)
		if !ok {
			return false
		}
		if maps[path] {
			return elemsCovered(x.Vals, y.Vals, path+"*", maps) && elemsCovered(y.Vals, x.Vals, path+"*", maps)
		}
		if x.Len() != y.Len() {
			return false
		}
		for i, k := range x.Keys {
			w, ok := y.Get(k)
			if !ok || !sameShape(x.Vals[i], w, path+"."+k, maps) {
				return false
			}
		}
		return true
	}
	return false
}

// elemsCovered reports whether every element of xs has the shape of some element of ys
// (true when either is empty).
func elemsCovered(xs, ys []any, path string, maps MapPaths) bool {
	if len(ys) == 0 {
		return true
	}
	for _, x := range xs {
		found := false
		for _, y := range ys {
			if sameShape(x, y, path, maps) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
