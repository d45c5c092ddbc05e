package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/collector"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/internal/sampledata"
	"github.com/doppel-dev/doppel/internal/tauformats"
	"github.com/doppel-dev/doppel/trace"
)

// server is a local collect endpoint that validates bodies with ingest.Decode and keeps each trace
// id once per project, as doppel does.
type server struct {
	mu       sync.Mutex
	requests int
	fail     int // status to answer every request with, when set
	traces   map[string]map[string]trace.Trace
	sizes    []int
}

func newServer(t *testing.T) (*server, string) {
	s := &server{traces: map[string]map[string]trace.Trace{}}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return s, hs.URL
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if r.Header.Get("Authorization") != "Bearer mk_live_k" {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if s.fail != 0 {
		w.WriteHeader(s.fail)
		fmt.Fprint(w, `{"detail":"down for the test"}`)
		return
	}
	// As doppel does: traces in another format are mapped to the chat format first.
	norm, err := ingest.NormalizeBody(body)
	if err != nil {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprintf(w, `{"detail":%q}`, err.Error())
		return
	}
	p, err := ingest.Decode(norm.Body, ingest.Options{})
	if err != nil {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprintf(w, `{"detail":%q}`, err.Error())
		return
	}
	env := s.traces[p.Slug]
	if env == nil {
		env = map[string]trace.Trace{}
		s.traces[p.Slug] = env
	}
	acc, dup := 0, 0
	for _, tr := range p.Batch.Traces {
		if _, ok := env[tr.ID]; ok {
			dup++
			continue
		}
		env[tr.ID] = tr
		acc++
	}
	s.sizes = append(s.sizes, len(p.Batch.Traces))
	w.WriteHeader(http.StatusAccepted)
	fmt.Fprintf(w, `{"accepted":%d,"duplicates":%d,"env":%q,"batch":"b"}`, acc, dup, p.Slug)
}

func opts(url string, files ...string) CollectOptions {
	return CollectOptions{Endpoint: url, Key: "mk_live_k", Files: files, Backoff: func(int) time.Duration { return time.Millisecond }}
}

func TestCollectRealTraces(t *testing.T) {
	s, url := newServer(t)
	retail, airline := sampledata.File(t, "tau-retail-dev.json"), sampledata.File(t, "tau-airline-dev.json")
	var out bytes.Buffer
	o := opts(url, retail, airline)
	o.Out = &out
	res, err := Collect(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 2 || res.Traces != 274 || res.Accepted != 274 || res.Duplicates != 0 || fmt.Sprint(res.Envs) != "[tau-airline tau2-retail]" {
		t.Fatalf("result %+v", res)
	}
	// 126 retail traces in batches of 50, then 148 airline ones: a batch never mixes projects.
	if fmt.Sprint(s.sizes) != "[50 50 26 50 50 48]" && !sameMultiset(s.sizes, []int{50, 50, 26, 50, 50, 48}) {
		t.Errorf("batch sizes %v", s.sizes)
	}
	for file, slug := range map[string]string{retail: "tau2-retail", airline: "tau-airline"} {
		data, _ := os.ReadFile(file)
		var want trace.Batch
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		got := s.traces[slug]
		if len(got) != len(want.Traces) {
			t.Fatalf("%s: server has %d traces, want %d", slug, len(got), len(want.Traces))
		}
		for _, tr := range want.Traces {
			if !reflect.DeepEqual(got[tr.ID], tr) {
				t.Fatalf("%s: trace %s differs after the trip", slug, tr.ID)
			}
		}
	}
	if !strings.Contains(out.String(), "collect: 274 traces (274 new, 0 duplicate)") {
		t.Errorf("progress output %q", out.String())
	}
	t.Logf("%d bytes in %v: %s", res.Bytes, res.Elapsed, strings.TrimSpace(out.String()))

	// Again: every trace is a duplicate, nothing is stored twice.
	res, err = Collect(context.Background(), opts(url, retail))
	if err != nil || res.Accepted != 0 || res.Duplicates != 126 || len(s.traces["tau2-retail"]) != 126 {
		t.Fatalf("second run: %+v, %v", res, err)
	}
}

func sameMultiset(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	count := map[int]int{}
	for _, x := range a {
		count[x]++
	}
	for _, x := range b {
		count[x]--
	}
	for _, v := range count {
		if v != 0 {
			return false
		}
	}
	return true
}

const (
	userMsg = `{"role":"user","content":"hi"}`
	callMsg = `{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}`
	toolMsg = `{"role":"tool","tool_call_id":"c","content":"ok"}`
)

func trc(id string) string {
	return fmt.Sprintf(`{"id":%q,"messages":[%s,%s,%s]}`, id, userMsg, callMsg, toolMsg)
}

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCollectFormats(t *testing.T) {
	jsonl := trc("a") + "\n\n" + trc("b") + "\n" + trc("c") + "\n"
	pretty := "{\n  \"id\": \"a\",\n  \"messages\": [" + userMsg + "]\n}\n{\"id\":\"b\",\"messages\":[" + userMsg + "]}"
	cases := []struct {
		name, file, content, project string
		stdin                        string
		traces                       int64
		slug                         string
		err                          string
	}{
		{"jsonl", "t.jsonl", jsonl, "Shop", "", 3, "shop", ""},
		{"jsonl without project", "t.jsonl", jsonl, "", "", 0, "", "names no project"},
		{"array", "t.json", "[" + trc("a") + "," + trc("b") + "]", "Shop", "", 2, "shop", ""},
		{"array without project", "t.json", "[" + trc("a") + "]", "", "", 0, "", "names no project"},
		{"concatenated pretty objects", "t.json", pretty, "Shop", "", 2, "shop", ""},
		{"body with bom", "t.json", "\xef\xbb\xbf" + `{"project":"Body Proj","traces":[` + trc("a") + `]}`, "", "", 1, "body-proj", ""},
		{"project given wins", "t.json", `{"project":"Body Proj","traces":[` + trc("a") + `]}`, "Other", "", 1, "other", ""},
		{"project after traces", "t.json", `{"traces":[` + trc("a") + `,` + trc("b") + `],"extra":{"x":[1]},"project":"Late"}`, "", "", 2, "late", ""},
		{"project after traces on stdin", "-", "", "", `{"traces":[` + trc("a") + `],"project":"Late"}`, 0, "", "pass the project explicitly"},
		{"stdin jsonl", "-", "", "Piped", trc("a") + "\n" + trc("b"), 2, "piped", ""},
		{"not json", "t.json", "id,messages\n", "", "", 0, "", "not a trace file: line 1 starts with 'i'"},
		{"empty", "t.json", " \n", "", "", 0, "", "empty"},
		{"broken json", "t.jsonl", trc("a") + "\n{\"id\":", "P", "", 0, "", "trace #2 (line 2)"},
		{"bad line", "t.jsonl", trc("a") + "\n" + trc("b") + "\n{\"id\": x}\n", "P", "", 0, "", "trace #3 (line 3): invalid character 'x'"},
		{"trailing data after a body", "t.json", `{"project":"P","traces":[` + trc("a") + `]} x`, "", "", 0, "", "'x' after the collect body"},
		{"no traces", "t.json", `{"project":"P","traces":[]}`, "", "", 0, "", "the file holds no traces"},
		{"crlf jsonl with a bom", "t.jsonl", "\xef\xbb\xbf" + trc("a") + "\r\n\r\n" + trc("b") + "\r\n", "P", "", 2, "p", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, url := newServer(t)
			file := c.file
			if file != "-" {
				file = write(t, c.file, c.content)
			}
			o := opts(url, file)
			o.Project = c.project
			o.Stdin = strings.NewReader(c.stdin)
			res, err := Collect(context.Background(), o)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("Collect = %v, want an error containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Traces != c.traces || len(s.traces[c.slug]) != int(c.traces) {
				t.Fatalf("result %+v, server %v; want %d traces in %q", res, s.traces, c.traces, c.slug)
			}
		})
	}
}

func TestCollectInvalidTrace(t *testing.T) {
	bad := `{"id":"bad","messages":[{"role":"robot","content":"x"}]}`
	content := `{"project":"P","traces":[` + trc("a") + `,` + trc("b") + `,` + trc("c") + `,` + bad + `,` + trc("d") + `]}`
	file := write(t, "t.json", content)

	s, url := newServer(t)
	_, err := Collect(context.Background(), opts(url, file))
	var ie *ingest.Error
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "t.json: traces[3] (line 1): messages[0].role: must be one of") {
		t.Fatalf("Collect = %v, want the field error of traces[3]", err)
	}
	if len(s.traces["p"]) != 3 {
		t.Errorf("the 3 valid traces before the bad one should be stored, server has %d", len(s.traces["p"]))
	}

	s, url = newServer(t)
	var out bytes.Buffer
	o := opts(url, file)
	o.SkipInvalid, o.Out = true, &out
	res, err := Collect(context.Background(), o)
	if err != nil || res.Skipped != 1 || res.Traces != 4 || len(s.traces["p"]) != 4 {
		t.Fatalf("SkipInvalid: %+v, %v", res, err)
	}
	if !strings.Contains(out.String(), "skipped "+file+": traces[3] (line 1): messages[0].role") {
		t.Errorf("output %q", out.String())
	}
}

func TestCollectDuplicateIDsSplitBatches(t *testing.T) {
	s, url := newServer(t)
	file := write(t, "t.jsonl", trc("a")+"\n"+trc("b")+"\n"+trc("a")+"\n"+trc("c")+"\n")
	o := opts(url, file)
	o.Project = "P"
	res, err := Collect(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Accepted != 3 || res.Duplicates != 1 || fmt.Sprint(s.sizes) != "[2 2]" {
		t.Fatalf("result %+v, batch sizes %v", res, s.sizes)
	}
}

func TestCollectServerRefuses(t *testing.T) {
	s, url := newServer(t)
	s.fail = http.StatusServiceUnavailable
	file := write(t, "t.jsonl", trc("a")+"\n"+trc("b"))
	o := opts(url, file)
	o.Project = "P"
	_, err := Collect(context.Background(), o)
	var se *collector.StatusError
	if !errors.As(err, &se) || se.Code != 503 || !strings.Contains(err.Error(), "trace #1") {
		t.Fatalf("Collect = %v, want a 503 naming the batch", err)
	}
	if s.requests != 3 {
		t.Errorf("%d requests, want 3 (1 + 2 retries)", s.requests)
	}
}

func TestCollectBatchLimits(t *testing.T) {
	s, url := newServer(t)
	var lines []string
	for i := range 23 {
		lines = append(lines, trc(fmt.Sprint(i)))
	}
	file := write(t, "t.jsonl", strings.Join(lines, "\n"))
	o := opts(url, file)
	o.Project, o.BatchSize, o.Concurrency = "P", 10, 1
	if _, err := Collect(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(s.sizes) != "[10 10 3]" {
		t.Fatalf("batch sizes %v", s.sizes)
	}
	s.sizes = nil
	one := len(ingest.AppendTrace(nil, mustTrace(t, trc("0"))))
	o.MaxBatchBytes = 4 * (one + 1) // ids 0-9 encode to one byte, 10-22 to two
	if _, err := Collect(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(s.sizes) != "[4 4 4 4 4 3]" {
		t.Fatalf("batch sizes by bytes %v", s.sizes)
	}
}

func mustTrace(t *testing.T, s string) *trace.Trace {
	tr, err := ingest.DecodeTrace([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestCollectOtherFormats: a JSONL file of tau traces in the OpenAI Responses and Anthropic Messages shapes (and a
// chat trace carrying tools, sent as given) is collected; the server maps each to the trace collected in the chat
// format.
func TestCollectOtherFormats(t *testing.T) {
	traces, err := sampledata.Traces("retail")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := tauformats.Tools("retail")
	if err != nil {
		t.Fatal(err)
	}
	traces = traces[:10]
	var lines []string
	for i, tt := range traces {
		obj := tauformats.Responses(tt, tools)
		if i%2 == 1 {
			obj = tauformats.Messages(tt, tools)
		}
		b, _ := json.Marshal(obj)
		lines = append(lines, string(b))
	}
	s, url := newServer(t)
	o := opts(url, write(t, "t.jsonl", strings.Join(lines, "\n")))
	o.Project = "Shop"
	res, err := Collect(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Traces != int64(len(traces)) || len(s.traces["shop"]) != len(traces) {
		t.Fatalf("result %+v, server holds %d", res, len(s.traces["shop"]))
	}
	for i, tt := range traces {
		want := tauformats.CompactArgs(tt)
		if i%2 == 0 { // Responses carries arguments as strings: their spelling is kept
			want = tt
			for j := range want.Messages {
				for k := range want.Messages[j].ToolCalls {
					want.Messages[j].ToolCalls[k].Type = "function"
				}
			}
		}
		if got := s.traces["shop"][tt.ID]; !reflect.DeepEqual(got.Messages, want.Messages) {
			t.Errorf("%s: the server got other messages", tt.ID)
		}
	}
}
