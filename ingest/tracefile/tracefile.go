// Package tracefile reads trace files (a collect body, a JSON array of traces, or traces one after another) a trace at a time.
package tracefile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// Layout is how a trace file holds its traces.
type Layout int

const (
	// Body is a collect body, {"project": …, "traces": […]}: an object whose first field is project or traces.
	Body Layout = iota + 1
	// Array is a JSON array of traces.
	Array
	// Stream is traces one after another: JSON Lines, or JSON values concatenated with any whitespace between.
	Stream
)

func (l Layout) String() string {
	switch l {
	case Body:
		return "a collect body"
	case Array:
		return "an array of traces"
	case Stream:
		return "traces one after another"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// DefaultMaxTraceBytes is Options.MaxTraceBytes's default: above collect's 32 MiB request cap, so that no trace
// collect would take is refused here.
const DefaultMaxTraceBytes = 64 << 20

// Errors a Reader wraps, for errors.Is; their texts are in the errors themselves.
var (
	ErrEmpty        = errors.New("the file is empty")
	ErrNotTraceFile = errors.New("not a trace file")
	ErrNoTraces     = errors.New("the file holds no traces")
	// ErrProjectLater is NewReader's answer, with Options.FindProject, for a collect body whose project field
	// does not come before its traces when the source cannot be read again (it is no io.Seeker).
	ErrProjectLater = errors.New("the project field does not come before the traces")
)

// Options configure a Reader.
type Options struct {
	// Name is the file's name: a .jsonl or .ndjson extension makes the file a Stream whatever its first field.
	Name string
	// FindProject asks NewReader for a collect body's project even when it comes after the traces: the source is
	// then read through once to find it and rewound (ErrProjectLater when it is no io.Seeker). Without it, such a
	// project is known once Next has answered io.EOF.
	FindProject bool
	// MaxTraceBytes bounds one trace, and any other field of a collect body (default DefaultMaxTraceBytes).
	MaxTraceBytes int
}

// Trace is one trace of a file.
type Trace struct {
	// Raw is the trace's JSON as the file spells it: one valid JSON value (whether it is a valid trace is
	// ingest's to say). It is the caller's: the Reader does not reuse it.
	Raw []byte
	// Index is the trace's position in the file, from 0.
	Index int
	// Line is the line (from 1) the trace starts on.
	Line int
	// Label names the trace for messages: "traces[3] (line 9)" in a collect body, "[3] (line 9)" in an array,
	// "trace #4 (line 9)" in a stream.
	Label string
}

// Reader streams a trace file: it holds one trace at a time, never the file.
type Reader struct {
	src    io.Reader
	opts   Options
	br     *bufio.Reader
	line   int // the line of the next unread byte
	layout Layout

	project    string
	sawProject bool
	sawTraces  bool
	inArray    bool // inside the traces array (Body) or the array (Array)
	firstInArr bool // no element read yet in the array
	done       bool
	n          int // traces read
}

// NewReader begins reading a trace file: it skips a UTF-8 byte order mark, tells the file's layout from its first
// byte (and, for an object, its first field name and opts.Name), and for a collect body reads the fields before
// its traces.
func NewReader(src io.Reader, opts Options) (*Reader, error) {
	if opts.MaxTraceBytes <= 0 {
		opts.MaxTraceBytes = DefaultMaxTraceBytes
	}
	r := &Reader{src: src, opts: opts}
	if err := r.start(); err != nil {
		return nil, err
	}
	if r.layout != Body || !opts.FindProject || r.sawProject || !r.inArray {
		return r, nil
	}
	// A body whose traces come first: find its project, then read it again.
	seeker, ok := src.(io.Seeker)
	if !ok {
		return nil, fmt.Errorf("%w: it cannot be read twice", ErrProjectLater)
	}
	if _, err := seeker.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	first := Options{Name: opts.Name, MaxTraceBytes: opts.MaxTraceBytes}
	scan, err := NewReader(src, first)
	if err != nil {
		return nil, err
	}
	for {
		if _, err := scan.Next(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
	}
	if _, err := seeker.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	r2, err := NewReader(src, first)
	if err != nil {
		return nil, err
	}
	r2.opts = opts
	r2.project = scan.project
	return r2, nil
}

// Layout answers the file's layout.
func (r *Reader) Layout() Layout { return r.layout }

// Project answers the project a collect body names ("" when none, and for arrays and streams): known after
// NewReader when the field comes before the traces or with Options.FindProject, else once Next has answered io.EOF.
func (r *Reader) Project() string { return r.project }

func (r *Reader) start() error {
	r.br = bufio.NewReaderSize(r.src, 64<<10)
	r.line = 1
	if b, err := r.br.Peek(3); err == nil && string(b) == "\xef\xbb\xbf" {
		_, _ = r.br.Discard(3)
	}
	c, err := r.skipSpace()
	if errors.Is(err, io.EOF) {
		return ErrEmpty
	}
	if err != nil {
		return err
	}
	switch c {
	case '[':
		r.layout = Array
		r.consume(1)
		r.inArray, r.firstInArr = true, true
		return nil
	case '{':
		if ext := strings.ToLower(filepath.Ext(r.opts.Name)); ext == ".jsonl" || ext == ".ndjson" {
			r.layout = Stream
			return nil
		}
		if key, err := r.firstKey(); err != nil {
			return err
		} else if key != "project" && key != "traces" {
			r.layout = Stream
			return nil
		}
		r.layout = Body
		r.consume(1)
		return r.fields(true)
	}
	return fmt.Errorf("%w: line %d starts with %q; want a collect body {\"project\", \"traces\"}, a JSON array of traces, or JSON Lines of traces",
		ErrNotTraceFile, r.line, c)
}

// firstKey peeks at the first field name of the object the reader is at, without consuming anything ("" when
// the object does not start with a plain string).
func (r *Reader) firstKey() (string, error) {
	for n := 64; ; n *= 4 {
		n = min(n, r.br.Size())
		b, err := r.br.Peek(n)
		rest := bytes.TrimLeft(b[1:], " \t\r\n")
		if len(rest) > 0 && rest[0] != '"' {
			return "", nil
		}
		if len(rest) > 0 {
			if end := bytes.IndexByte(rest[1:], '"'); end >= 0 {
				return string(rest[1 : 1+end]), nil
			}
		}
		switch {
		case errors.Is(err, io.EOF) || n == r.br.Size():
			return "", nil // the stream reader reports what is wrong, if anything
		case err != nil:
			return "", err
		}
	}
}

// Next answers the next trace, or io.EOF after the last one of a well-formed file. A file that holds no trace
// answers ErrNoTraces rather than io.EOF. Errors name the line, and the trace where there is one.
func (r *Reader) Next() (Trace, error) {
	if r.done {
		return Trace{}, io.EOF
	}
	switch {
	case r.inArray:
		c, err := r.skipSpace()
		if err != nil {
			return Trace{}, r.eof(err, "the array is not closed")
		}
		if c == ']' {
			r.consume(1)
			r.inArray = false
			if r.layout == Body {
				if err := r.fields(false); err != nil {
					return Trace{}, err
				}
			}
			return r.closed()
		}
		switch {
		case !r.firstInArr && c != ',':
			return Trace{}, r.unexpected(c, "',' or ']' after a trace")
		case !r.firstInArr:
			r.consume(1)
			if c, err = r.skipSpace(); err != nil {
				return Trace{}, r.eof(err, "the array is not closed")
			}
			if c == ']' || c == ',' {
				return Trace{}, r.unexpected(c, "a trace")
			}
		case c == ',':
			return Trace{}, r.unexpected(c, "a trace or ']'")
		}
		r.firstInArr = false
		return r.trace()
	case r.layout == Stream:
		if _, err := r.skipSpace(); errors.Is(err, io.EOF) {
			return r.end()
		} else if err != nil {
			return Trace{}, err
		}
		return r.trace()
	}
	// A collect body closed before any traces field.
	return r.closed()
}

// closed goes on once the array or the collect body is closed: only whitespace may follow.
func (r *Reader) closed() (Trace, error) {
	c, err := r.skipSpace()
	if errors.Is(err, io.EOF) {
		return r.end()
	}
	if err != nil {
		return Trace{}, err
	}
	what := "the array"
	if r.layout == Body {
		what = "the collect body"
	}
	return Trace{}, fmt.Errorf("line %d: %q after %s: a file holds one body or one array (or traces one after another)", r.line, c, what)
}

func (r *Reader) end() (Trace, error) {
	r.done = true
	if r.n == 0 {
		return Trace{}, ErrNoTraces
	}
	return Trace{}, io.EOF
}

func (r *Reader) trace() (Trace, error) {
	line := r.line
	label := r.label(r.n, line)
	raw, err := r.value(label)
	if err != nil {
		return Trace{}, err
	}
	t := Trace{Raw: raw, Index: r.n, Line: line, Label: label}
	r.n++
	return t, nil
}

func (r *Reader) label(i, line int) string {
	switch {
	case r.layout == Stream:
		return fmt.Sprintf("trace #%d (line %d)", i+1, line)
	case r.layout == Body:
		return fmt.Sprintf("traces[%d] (line %d)", i, line)
	}
	return fmt.Sprintf("[%d] (line %d)", i, line)
}

// fields reads a collect body's fields up to its traces array (leaving the reader in it) or its end. first says
// the reader is just past the body's '{'.
func (r *Reader) fields(first bool) error {
	for {
		c, err := r.skipSpace()
		if err != nil {
			return r.eof(err, "the collect body is not closed")
		}
		switch {
		case c == '}':
			r.consume(1)
			return nil
		case !first && c == ',':
			r.consume(1)
			if c, err = r.skipSpace(); err != nil {
				return r.eof(err, "the collect body is not closed")
			}
		case !first:
			return r.unexpected(c, "',' or '}' in the collect body")
		}
		first = false
		if c != '"' {
			return r.unexpected(c, "a field name in the collect body")
		}
		line := r.line
		raw, err := r.value("a field name")
		if err != nil {
			return err
		}
		var key string
		_ = json.Unmarshal(raw, &key) // valid: value checked it
		if c, err = r.skipSpace(); err != nil {
			return r.eof(err, "the collect body is not closed")
		}
		if c != ':' {
			return r.unexpected(c, "':' after field "+string(raw))
		}
		r.consume(1)
		if c, err = r.skipSpace(); err != nil {
			return r.eof(err, "the collect body is not closed")
		}
		switch key {
		case "traces":
			if r.sawTraces {
				return fmt.Errorf("line %d: the body has a second traces field", line)
			}
			if c != '[' {
				return r.unexpected(c, "'[' opening the traces array")
			}
			r.consume(1)
			r.sawTraces, r.inArray, r.firstInArr = true, true, true
			return nil
		case "project":
			if r.sawProject {
				return fmt.Errorf("line %d: the body has a second project field", line)
			}
			raw, err := r.value("project")
			if err != nil {
				return err
			}
			var p *string
			if json.Unmarshal(raw, &p) != nil {
				return fmt.Errorf("line %d: project: must be a string, not %s", line, raw)
			}
			if p != nil {
				r.project = *p
			}
			r.sawProject = true
		default:
			if _, err := r.value(key); err != nil {
				return err
			}
		}
	}
}

// value reads one JSON value, the reader being at its first byte, and checks it is valid JSON.
func (r *Reader) value(what string) ([]byte, error) {
	line := r.line
	var out []byte
	b, err := r.br.Peek(1)
	if err != nil {
		return nil, r.eof(err, "the file ends where "+what+" belongs")
	}
	c := b[0]
	if c != '{' && c != '[' && c != '"' {
		// A number or a literal: up to the next delimiter.
		for {
			b, err := r.br.Peek(1)
			if err != nil || !literalByte(b[0]) {
				break
			}
			out = append(out, b[0])
			r.consume(1)
			if len(out) > 64 {
				break
			}
		}
		if len(out) == 0 {
			return nil, r.unexpected(c, "a JSON value for "+what)
		}
		return out, checkJSON(out, line, what)
	}
	depth, inStr, esc := 0, false, false
	for {
		if _, err := r.br.Peek(1); err != nil {
			if errors.Is(err, io.EOF) {
				if err := checkJSON(out, line, what); err != nil && !strings.Contains(err.Error(), "unexpected end of JSON input") {
					return nil, err
				}
				return nil, fmt.Errorf("%s: not closed before the end of the file", at(what, line))
			}
			return nil, err
		}
		chunk, _ := r.br.Peek(r.br.Buffered())
		end := -1
	scan:
		for i, b := range chunk {
			if inStr {
				switch {
				case esc:
					esc = false
				case b == '\\':
					esc = true
				case b == '"':
					inStr = false
					if depth == 0 {
						end = i + 1
						break scan
					}
				}
				continue
			}
			switch b {
			case '"':
				inStr = true
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					end = i + 1
					break scan
				}
			}
		}
		n := end
		if n < 0 {
			n = len(chunk)
		}
		out = append(out, chunk[:n]...)
		r.consume(n)
		if end >= 0 && len(out) <= r.opts.MaxTraceBytes {
			return out, checkJSON(out, line, what)
		}
		if len(out) > r.opts.MaxTraceBytes {
			if err := checkJSON(out, line, what); err != nil && !strings.Contains(err.Error(), "unexpected end of JSON input") {
				return nil, err
			}
			return nil, fmt.Errorf("%s: over %d bytes (or not closed)", at(what, line), r.opts.MaxTraceBytes)
		}
	}
}

func literalByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '+' || b == '-'
}

// checkJSON reports whether b, read from line on, is one valid JSON value, naming the line of a syntax error.
func checkJSON(b []byte, line int, what string) error {
	if json.Valid(b) {
		return nil
	}
	var v json.RawMessage
	err := json.Unmarshal(b, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		off := min(max(se.Offset-1, 0), int64(len(b)))
		errLine := line + bytes.Count(b[:off], []byte("\n"))
		if errLine != line {
			return fmt.Errorf("%s: line %d: %s", at(what, line), errLine, se)
		}
		return fmt.Errorf("%s: %s", at(what, line), se)
	}
	return fmt.Errorf("%s: %v", at(what, line), err)
}

// at names what is at line, once: trace labels already carry their line.
func at(what string, line int) string {
	if strings.Contains(what, "(line ") {
		return what
	}
	return fmt.Sprintf("line %d: %s", line, what)
}

// skipSpace steps over JSON whitespace and answers the next byte, unread.
func (r *Reader) skipSpace() (byte, error) {
	for {
		if _, err := r.br.Peek(1); err != nil {
			return 0, err
		}
		chunk, _ := r.br.Peek(r.br.Buffered())
		i := 0
		for i < len(chunk) && (chunk[i] == ' ' || chunk[i] == '\t' || chunk[i] == '\r' || chunk[i] == '\n') {
			i++
		}
		if i < len(chunk) {
			c := chunk[i]
			r.consume(i)
			return c, nil
		}
		r.consume(i)
	}
}

// consume discards n buffered bytes, counting their lines.
func (r *Reader) consume(n int) {
	b, _ := r.br.Peek(n)
	r.line += bytes.Count(b, []byte("\n"))
	_, _ = r.br.Discard(n)
}

// eof turns the end of the file inside a structure into an error saying so.
func (r *Reader) eof(err error, msg string) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("line %d: %s", r.line, msg)
	}
	return err
}

func (r *Reader) unexpected(c byte, want string) error {
	return fmt.Errorf("line %d: found %q where %s belongs", r.line, c, want)
}
