package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
)

// render writes a verb's answer: a table for a list of objects (or with --output table), indented JSON otherwise.
func render(w io.Writer, data json.RawMessage, output string) error {
	rows, cols, isList := objectRows(data)
	if output == "table" || (output == "" && isList && len(rows) > 0) {
		t := table.NewWriter()
		t.SetOutputMirror(w)
		t.SetStyle(table.StyleLight)
		if isList {
			hdr := table.Row{}
			for _, c := range cols {
				hdr = append(hdr, strings.ToUpper(c))
			}
			t.AppendHeader(hdr)
			for _, r := range rows {
				row := table.Row{}
				for _, c := range cols {
					row = append(row, cell(r[c]))
				}
				t.AppendRow(row)
			}
			t.Render()
			return nil
		}
		if obj, keys, ok := object(data); ok {
			t.AppendHeader(table.Row{"FIELD", "VALUE"})
			for _, k := range keys {
				t.AppendRow(table.Row{k, cell(obj[k])})
			}
			t.Render()
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

// cell renders one value in a table: strings bare, null as -, the rest compact JSON cut at 60 characters.
func cell(v json.RawMessage) string {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s
	}
	t := strings.TrimSpace(string(v))
	if t == "" || t == "null" {
		return "-"
	}
	var b bytes.Buffer
	if json.Compact(&b, v) == nil {
		t = b.String()
	}
	if r := []rune(t); len(r) > 60 {
		t = string(r[:59]) + "…"
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
