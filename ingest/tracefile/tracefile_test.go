package tracefile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

const (
	t1 = `{"id":"a","messages":[{"role":"user","content":"hi"}]}`
	t2 = `{"id":"b","messages":[{"role":"user","content":"a ]} \"{ in a string"}]}`
	t3 = "{\n  \"id\": \"c\",\n  \"messages\": []\n}"
)

// got is what reading a whole file gives.
type got struct {
	layout  Layout
	project string // after the end
	traces  []string
	lines   []int
	labels  []string
}

func readAll(src io.Reader, opts Options) (got, error) {
	var g got
	r, err := NewReader(src, opts)
	if err != nil {
		return g, err
	}
	g.layout = r.Layout()
	for {
		t, err := r.Next()
		if errors.Is(err, io.EOF) {
			g.project = r.Project()
			return g, nil
		}
		if err != nil {
			return g, err
		}
		g.traces = append(g.traces, string(t.Raw))
		g.lines = append(g.lines, t.Line)
		g.labels = append(g.labels, t.Label)
		if t.Index != len(g.traces)-1 {
			return g, fmt.Errorf("trace %d has index %d", len(g.traces)-1, t.Index)
		}
	}
}

func TestReader(t *testing.T) {
	cases := []struct {
		name, file, content string
		layout              Layout
		project             string
		traces              []string
		lines               []int
		labels              []string
		err                 string // a part of the error's text; "" when the file is fine
		is                  error
	}{
		{name: "body, project first", content: `{"project":"shop","traces":[` + t1 + "," + t2 + `]}`,
			layout: Body, project: "shop", traces: []string{t1, t2}, lines: []int{1, 1}, labels: []string{"traces[0] (line 1)", "traces[1] (line 1)"}},
		{name: "body, project last, other fields skipped", content: "{\"traces\": [\n" + t1 + ",\n" + t3 + "\n],\n\"extra\": {\"x\": [1]},\n\"project\": \"late\"}\n",
			layout: Body, project: "late", traces: []string{t1, t3}, lines: []int{2, 3}},
		{name: "body without project", content: `{"traces":[` + t1 + `]}`, layout: Body, traces: []string{t1}},
		{name: "body, project null", content: `{"project":null,"traces":[` + t1 + `]}`, layout: Body, traces: []string{t1}},
		{name: "array", content: "[\n" + t1 + ",\n  " + t2 + "\n]\n", layout: Array, traces: []string{t1, t2}, lines: []int{2, 3},
			labels: []string{"[0] (line 2)", "[1] (line 3)"}},
		{name: "jsonl", file: "t.jsonl", content: t1 + "\n" + t2 + "\n", layout: Stream, traces: []string{t1, t2}, lines: []int{1, 2},
			labels: []string{"trace #1 (line 1)", "trace #2 (line 2)"}},
		{name: "jsonl of bodies by extension", file: "t.NDJSON", content: `{"project":"p","traces":[]}` + "\n", layout: Stream,
			traces: []string{`{"project":"p","traces":[]}`}},
		{name: "blank lines and crlf", content: "\r\n" + t1 + "\r\n\r\n\t \r\n" + t2 + "\r\n", layout: Stream, traces: []string{t1, t2}, lines: []int{2, 5}},
		{name: "concatenated objects", content: t3 + t1 + " " + t3, layout: Stream, traces: []string{t3, t1, t3}, lines: []int{1, 4, 4}},
		{name: "bom", content: "\xef\xbb\xbf" + `{"project":"p","traces":[` + t1 + `]}`, layout: Body, project: "p", traces: []string{t1}},
		{name: "bom before jsonl", content: "\xef\xbb\xbf" + t1 + "\n" + t2, layout: Stream, traces: []string{t1, t2}},
		{name: "object not a body", content: `{"id":"x"}`, layout: Stream, traces: []string{`{"id":"x"}`}},
		{name: "values that are not traces are ingest's to refuse", content: "[1, \"s\", null, {}]", layout: Array,
			traces: []string{"1", `"s"`, "null", "{}"}},

		{name: "empty", content: "", err: "the file is empty", is: ErrEmpty},
		{name: "only whitespace", content: " \r\n\n", err: "the file is empty", is: ErrEmpty},
		{name: "only a bom", content: "\xef\xbb\xbf", is: ErrEmpty},
		{name: "not json", content: "id,messages\n1,hi\n", err: `not a trace file: line 1 starts with 'i'`, is: ErrNotTraceFile},
		{name: "not json after blank lines", content: "\n\n# traces\n", err: "line 3 starts with '#'", is: ErrNotTraceFile},
		{name: "empty array", content: "[ ]", err: "the file holds no traces", is: ErrNoTraces},
		{name: "body without traces", content: `{"project":"p"}`, err: "the file holds no traces", is: ErrNoTraces},
		{name: "bad line 3", content: t1 + "\n" + t2 + "\n{\"id\": x}\n" + t1, traces: []string{t1, t2},
			err: "trace #3 (line 3): invalid character 'x' looking for beginning of value"},
		{name: "bad line inside a trace", content: "[\n" + t1 + ",\n{\"id\": \"c\",\n \"messages\": [}\n]", traces: []string{t1},
			err: "[1] (line 3): line 4: invalid character '}' looking for beginning of value"},
		{name: "a line that is not closed", content: t1 + "\n{\"id\":\n", traces: []string{t1},
			err: "trace #2 (line 2): not closed before the end of the file"},
		{name: "garbage line", content: t1 + "\nnope\n", traces: []string{t1}, err: "trace #2 (line 2): invalid character 'o' in literal null"},
		{name: "trailing garbage after a body", content: `{"project":"p","traces":[` + t1 + "]}\n}", traces: []string{t1},
			err: "line 2: '}' after the collect body"},
		{name: "a second body", content: `{"project":"p","traces":[` + t1 + "]}\n" + `{"project":"p","traces":[` + t2 + "]}", traces: []string{t1},
			err: "line 2: '{' after the collect body"},
		{name: "trailing garbage after an array", content: "[" + t1 + "] x", traces: []string{t1}, err: "line 1: 'x' after the array"},
		{name: "array not closed", content: "[" + t1 + ",\n" + t2, traces: []string{t1, t2}, err: "line 2: the array is not closed"},
		{name: "missing comma", content: "[" + t1 + " " + t2 + "]", traces: []string{t1}, err: "line 1: found '{' where ',' or ']' after a trace belongs"},
		{name: "leading comma", content: "[," + t1 + "]", err: "line 1: found ',' where a trace or ']' belongs"},
		{name: "project not a string", content: `{"project":7,"traces":[` + t1 + `]}`, err: "line 1: project: must be a string, not 7"},
		{name: "two traces fields", content: `{"traces":[` + t1 + `],` + "\n" + `"traces":[]}`, traces: []string{t1},
			err: "line 2: the body has a second traces field"},
		{name: "traces not an array", content: `{"project":"p","traces":{}}`, err: "found '{' where '[' opening the traces array belongs"},
		{name: "bad other field", content: `{"project":"p","meta":{"a":},"traces":[` + t1 + `]}`, err: "line 1: meta: invalid character '}'"},
		{name: "body not closed", content: `{"project":"p","traces":[` + t1 + `]`, traces: []string{t1}, err: "the collect body is not closed"},
	}
	for _, c := range cases {
		for _, mode := range []string{"whole", "one byte a read"} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				var src io.Reader = strings.NewReader(c.content)
				if mode != "whole" {
					src = iotest.OneByteReader(src)
				}
				g, err := readAll(src, Options{Name: c.file})
				switch {
				case c.err == "" && c.is == nil && err != nil:
					t.Fatalf("error %v, want none", err)
				case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
					t.Fatalf("error %v, want one containing %q", err, c.err)
				case c.is != nil && !errors.Is(err, c.is):
					t.Fatalf("error %v, want one that is %v", err, c.is)
				}
				if fmt.Sprint(g.traces) != fmt.Sprint(c.traces) {
					t.Errorf("traces\n%q\nwant\n%q", g.traces, c.traces)
				}
				if err != nil {
					return
				}
				if g.layout != c.layout || g.project != c.project {
					t.Errorf("layout %v, project %q; want %v, %q", g.layout, g.project, c.layout, c.project)
				}
				if c.lines != nil && fmt.Sprint(g.lines) != fmt.Sprint(c.lines) {
					t.Errorf("lines %v, want %v", g.lines, c.lines)
				}
				if c.labels != nil && fmt.Sprint(g.labels) != fmt.Sprint(c.labels) {
					t.Errorf("labels %q, want %q", g.labels, c.labels)
				}
			})
		}
	}
}

// TestFindProject: with FindProject, a body's project is known before its first trace wherever the field is, by
// reading a seekable source twice; a source that cannot be read twice is refused with ErrProjectLater.
func TestFindProject(t *testing.T) {
	late := "{\"traces\": [" + t1 + ",\n" + t2 + "], \"project\": \"late\"}"
	for _, c := range []struct {
		name, content string
		seekable      bool
		project       string
		err           error
	}{
		{"project first", `{"project":"p","traces":[` + t1 + `]}`, false, "p", nil},
		{"project last", late, true, "late", nil},
		{"project last, not seekable", late, false, "", ErrProjectLater},
		{"no project", `{"traces":[` + t1 + `]}`, true, "", nil},
		{"an array", "[" + t1 + "]", false, "", nil},
		{"project last after a broken trace", `{"traces":[{"id":}],"project":"p"}`, true, "", errors.New("traces[0] (line 1): invalid character '}'")},
	} {
		t.Run(c.name, func(t *testing.T) {
			var src io.Reader = strings.NewReader(c.content)
			if !c.seekable {
				src = struct{ io.Reader }{src}
			}
			r, err := NewReader(src, Options{FindProject: true})
			switch {
			case c.err == nil && err != nil:
				t.Fatal(err)
			case c.err != nil && (err == nil || !errors.Is(err, c.err) && !strings.Contains(err.Error(), c.err.Error())):
				t.Fatalf("error %v, want %v", err, c.err)
			case c.err != nil:
				return
			}
			if r.Project() != c.project {
				t.Fatalf("project before the traces %q, want %q", r.Project(), c.project)
			}
			n := 0
			for {
				tr, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if tr.Index != n {
					t.Fatalf("index %d, want %d", tr.Index, n)
				}
				n++
			}
			if n == 0 || r.Project() != c.project {
				t.Fatalf("%d traces, project %q at the end", n, r.Project())
			}
		})
	}
}

// countingSource serves n copies of a trace as JSONL, made as they are read, and counts the bytes it handed out.
type countingSource struct {
	line      []byte
	left      int
	pending   []byte
	handedOut int
}

func (s *countingSource) Read(p []byte) (int, error) {
	if len(s.pending) == 0 {
		if s.left == 0 {
			return 0, io.EOF
		}
		s.left--
		s.pending = s.line
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	s.handedOut += n
	return n, nil
}

// TestStreams: the reader holds a trace at a time: after each trace it has taken from its source at most its
// buffer and one trace more than it has answered, whatever the file's size.
func TestStreams(t *testing.T) {
	line := []byte(`{"id":"x","messages":[{"role":"user","content":"` + strings.Repeat("y", 1000) + `"}]}` + "\n")
	src := &countingSource{line: line, left: 5000}
	r, err := NewReader(src, Options{Name: "big.jsonl"})
	if err != nil {
		t.Fatal(err)
	}
	answered, n := 0, 0
	for {
		tr, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		answered += len(tr.Raw) + 1
		if ahead := src.handedOut - answered; ahead > 64<<10+len(line) {
			t.Fatalf("after trace %d the reader has read %d bytes ahead", n, ahead)
		}
		if !bytes.Equal(tr.Raw, line[:len(line)-1]) {
			t.Fatalf("trace %d: %.40q…", n, tr.Raw)
		}
	}
	if n != 5000 || src.handedOut != 5000*len(line) {
		t.Fatalf("%d traces of %d bytes read, want 5000 of %d", n, src.handedOut, 5000*len(line))
	}
}

// TestMaxTraceBytes: a trace over the bound, or one never closed, stops the reader at the bound.
func TestMaxTraceBytes(t *testing.T) {
	big := `{"id":"a","messages":[{"role":"user","content":"` + strings.Repeat("z", 5000) + `"}]}`
	for _, c := range []struct{ name, content, err string }{
		{"over", t1 + "\n" + big, "trace #2 (line 2): over 1024 bytes (or not closed)"},
		{"not closed", t1 + "\n{\"id\": \"" + strings.Repeat("z", 5000), "trace #2 (line 2): over 1024 bytes (or not closed)"},
		{"a syntax error before the bound", t1 + "\n{\"id\" 1, " + strings.Repeat(" ", 5000), "trace #2 (line 2): invalid character '1' after object key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := readAll(strings.NewReader(c.content), Options{MaxTraceBytes: 1024})
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("error %v, want %q", err, c.err)
			}
		})
	}
}

// BenchmarkReader reads a 4 MB file of 2,000 traces in each layout; "json.Decoder" is the reader doppel collect
// used before, on the same JSON Lines, for scale.
func BenchmarkReader(b *testing.B) {
	tr := `{"id":"t%d","messages":[{"role":"user","content":"` + strings.Repeat("where is my order? ", 100) + `"}]}`
	var lines, arr bytes.Buffer
	arr.WriteString(`{"project":"p","traces":[`)
	for i := range 2000 {
		fmt.Fprintf(&lines, tr+"\n", i)
		if i > 0 {
			arr.WriteByte(',')
		}
		fmt.Fprintf(&arr, tr, i)
	}
	arr.WriteString("]}")
	for _, c := range []struct {
		name string
		data []byte
	}{{"body", arr.Bytes()}, {"jsonl", lines.Bytes()}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.data)))
			for b.Loop() {
				if _, err := readAll(bytes.NewReader(c.data), Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("json.Decoder", func(b *testing.B) {
		b.SetBytes(int64(lines.Len()))
		for b.Loop() {
			dec := json.NewDecoder(bytes.NewReader(lines.Bytes()))
			for {
				var raw json.RawMessage
				if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
