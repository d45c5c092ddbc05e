package twin

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/doppel-dev/doppel/jsonvalue"
	"go.starlark.net/starlark"
)

// renderStar writes a handler's answer as JSON text in style st straight from its Starlark value: the same text,
// and the same error, as Render(fromStar(v, st), st), without building the model value in between.
// sizeHint is the buffer it starts with (the tool's longest answer so far, say), so most answers are written
// without regrowing it.
func renderStar(v starlark.Value, st Style, sizeHint int) (string, error) {
	return renderStarMax(v, st, sizeHint, 0)
}

// errRenderTooLong stops a rendering past its maximum length.
var errRenderTooLong = errors.New("answer longer than the rendering's maximum")

// renderStarMax is renderStar stopping with errRenderTooLong once the text passes maxLen bytes (0: no maximum), so
// a value holding one list many times over is not written out whole.
func renderStarMax(v starlark.Value, st Style, sizeHint, maxLen int) (string, error) {
	var b strings.Builder
	b.Grow(sizeHint)
	r := starRender{b: &b, st: st, max: maxLen}
	if err := r.to(v, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

// starRender writes a value as renderStar does, within a maximum length.
type starRender struct {
	b   *strings.Builder
	st  Style
	max int // 0: none
}

func (r *starRender) to(v starlark.Value, depth int) error {
	b, st := r.b, r.st
	if depth > jsonvalue.MaxDepth {
		return errors.New("value nested too deeply")
	}
	if r.max > 0 && b.Len() > r.max {
		return errRenderTooLong
	}
	switch x := v.(type) {
	case starlark.NoneType:
		b.WriteString("null")
	case starlark.Bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case starlark.String:
		writeStyledString(b, string(x), st)
	case starlark.Int:
		if i, ok := x.Int64(); ok {
			var buf [20]byte
			b.Write(strconv.AppendInt(buf[:0], i, 10))
		} else {
			b.WriteString(x.String())
		}
	case starlark.Float:
		b.WriteString(st.FormatFloat(float64(x)))
	case *starlark.List:
		b.WriteByte('[')
		for i := 0; i < x.Len(); i++ {
			if i > 0 {
				b.WriteString(st.ItemSep)
			}
			if err := r.to(x.Index(i), depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case starlark.Tuple:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(st.ItemSep)
			}
			if err := r.to(e, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case *starlark.Dict:
		b.WriteByte('{')
		w := dictRender{r: r, depth: depth}
		x.Entries()(w.entry) // in order, without Items' copy of the entries
		if w.err != nil {
			return w.err
		}
		b.WriteByte('}')
	case *starlark.Set:
		b.WriteByte('[')
		iter := x.Iterate()
		defer iter.Done()
		var e starlark.Value
		for i := 0; iter.Next(&e); i++ {
			if i > 0 {
				b.WriteString(st.ItemSep)
			}
			if err := r.to(e, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	default:
		return fmt.Errorf("a %s cannot be part of an answer or a row", v.Type())
	}
	return nil
}

// dictRender writes a dict's entries, as starRender writes an object, stopping at the first error.
type dictRender struct {
	r     *starRender
	depth int
	n     int
	err   error
}

func (w *dictRender) entry(k, v starlark.Value) bool {
	b, st := w.r.b, w.r.st
	if w.n > 0 {
		b.WriteString(st.ItemSep)
	}
	w.n++
	if s, ok := k.(starlark.String); ok {
		writeStyledString(b, string(s), st)
	} else {
		writeStyledString(b, k.String(), st)
	}
	b.WriteString(st.KeySep)
	w.err = w.r.to(v, w.depth+1)
	return w.err == nil
}
