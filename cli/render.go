package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
	"github.com/mattn/go-runewidth"
)

// Table widths. A table fits its width (the terminal's, VerbOptions.Width): columns are kept in the answer's order
// while they fit, each cell cut to fit, and the rest are named under the table; --output wide shows every column
// with cells up to wideCell.
const (
	DefaultWidth = 80  // when the width is unknown (not a terminal, no COLUMNS)
	minCell      = 8   // a column narrower than this is not worth showing
	maxCell      = 40  // a cell's width in a fitted table
	wideCell     = 200 // a cell's width with --output wide
)

// render writes a verb's answer: a table for a list of objects (or with --output table or wide), indented JSON
// otherwise. width is the terminal's.
func render(w io.Writer, data json.RawMessage, output string, width int) error {
	if width <= 0 {
		width = DefaultWidth
	}
	wide := output == "wide"
	rows, cols, isList := objectRows(data)
	if wide || output == "table" || (output == "" && isList && len(rows) > 0) {
		if isList {
			writeTable(w, "", cols, rows, width, wide)
			return nil
		}
		if obj, keys, ok := object(data); ok {
			writeObject(w, obj, keys, width, wide)
			return nil
		}
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, data, "", "  "); err != nil {
		_, err = w.Write(append(data, '\n'))
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// writeObject renders an object as FIELD/VALUE rows; a field holding a list of objects (a transcript's calls)
// follows as a table of its own, titled with the field's name, so it is read as rows rather than cut JSON.
func writeObject(w io.Writer, obj map[string]json.RawMessage, keys []string, width int, wide bool) {
	var lists []string
	var rows []map[string]json.RawMessage
	for _, k := range keys {
		if r, _, ok := objectRows(obj[k]); ok && len(r) > 0 {
			lists = append(lists, k)
			continue
		}
		name, _ := json.Marshal(k)
		rows = append(rows, map[string]json.RawMessage{"field": name, "value": obj[k]})
	}
	writeTable(w, "", []string{"field", "value"}, rows, width, wide)
	for _, k := range lists {
		r, cols, _ := objectRows(obj[k])
		writeTable(w, strings.ToUpper(k), cols, r, width, wide)
	}
}

// writeTable renders rows under cols, fitted to width unless wide.
func writeTable(w io.Writer, title string, cols []string, rows []map[string]json.RawMessage, width int, wide bool) {
	limit := maxCell
	if wide {
		limit = wideCell
	}
	// Each column's natural width: its header's or its widest cell's, up to the limit.
	natural := make([]int, len(cols))
	for i, c := range cols {
		natural[i] = runewidth.StringWidth(c)
		for _, r := range rows {
			natural[i] = max(natural[i], min(limit, runewidth.StringWidth(cell(r[c], limit))))
		}
	}
	show := cols
	widths := natural
	if !wide {
		show, widths = fit(cols, natural, width)
	}
	t := table.NewWriter()
	t.SetOutputMirror(w)
	t.SetStyle(table.StyleLight)
	if title != "" {
		t.SetTitle(title)
	}
	hdr := table.Row{}
	var cfg []table.ColumnConfig
	for i, c := range show {
		hdr = append(hdr, strings.ToUpper(c))
		cfg = append(cfg, table.ColumnConfig{Number: i + 1, WidthMax: widths[i], WidthMaxEnforcer: text.Trim})
	}
	t.SetColumnConfigs(cfg)
	t.AppendHeader(hdr)
	for _, r := range rows {
		row := table.Row{}
		for i, c := range show {
			row = append(row, cell(r[c], widths[i]))
		}
		t.AppendRow(row)
	}
	if hidden := len(cols) - len(show); hidden > 0 && !wide {
		t.SetCaption("%d more column(s): --output wide or json", hidden)
	}
	if !wide {
		t.SetAllowedRowLength(width)
	}
	t.Render()
}

// fit picks the columns shown in width (a light table spends 3 characters a column and 1 more): in the answer's
// order, each at its natural width when it fits in the room left, skipped when it does not; the first column that
// does not fit whole is narrowed to the room left instead when that is at least a third of its width.
func fit(cols []string, natural []int, width int) ([]string, []int) {
	used := 1
	var show []string
	var widths []int
	narrowed := false
	for i, c := range cols {
		room := width - used - 3
		cw := natural[i]
		if cw > room {
			if narrowed || room < minCell || room < cw/3 {
				continue
			}
			cw, narrowed = room, true
		}
		show = append(show, c)
		widths = append(widths, cw)
		used += cw + 3
	}
	if len(show) == 0 && len(cols) > 0 { // one column, cut to the width
		return cols[:1], []int{max(minCell, width-4)}
	}
	return show, widths
}

// cell renders one value in a table: strings bare, null as -, the rest compact JSON; cut to limit characters.
func cell(v json.RawMessage, limit int) string {
	var t string
	if json.Unmarshal(v, &t) != nil {
		t = strings.TrimSpace(string(v))
		if t == "" || t == "null" {
			return "-"
		}
		var b bytes.Buffer
		if json.Compact(&b, v) == nil {
			t = b.String()
		}
	}
	t = strings.Join(strings.Fields(t), " ") // one line a row
	if runewidth.StringWidth(t) > limit {
		t = runewidth.Truncate(t, limit, "…")
	}
	return t
}

// object decodes a JSON object keeping its keys' order.
func object(data json.RawMessage) (map[string]json.RawMessage, []string, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if d, ok := tok.(json.Delim); err != nil || !ok || d != '{' {
		return nil, nil, false
	}
	obj := map[string]json.RawMessage{}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, false
		}
		k, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, false
		}
		if _, dup := obj[k]; !dup {
			keys = append(keys, k)
		}
		obj[k] = v
	}
	return obj, keys, true
}

// objectRows reads a JSON array of objects, with the union of their keys in first-seen order.
func objectRows(data json.RawMessage) (rows []map[string]json.RawMessage, cols []string, ok bool) {
	var items []json.RawMessage
	if json.Unmarshal(data, &items) != nil {
		return nil, nil, false
	}
	seen := map[string]bool{}
	for _, it := range items {
		obj, keys, isObj := object(it)
		if !isObj {
			return nil, nil, false
		}
		for _, k := range keys {
			if !seen[k] {
				seen[k] = true
				cols = append(cols, k)
			}
		}
		rows = append(rows, obj)
	}
	return rows, cols, true
}
