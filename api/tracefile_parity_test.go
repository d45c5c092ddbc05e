package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/api"
	"github.com/doppel-dev/doppel/cli"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// TestTraceFileParity: one trace file is accepted or refused alike by doppel collect (cli.Collect, streaming the
// file) and by the server's uploads, referenced from a collect body or from the build form's traces_upload: the
// same traces are stored, and a file the reader refuses is refused with the same words.
func TestTraceFileParity(t *testing.T) {
	tr := func(id string) string {
		return fmt.Sprintf(`{"id":%q,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]}`, id)
	}
	pretty := "{\n  \"id\": \"p1\",\n  \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]\n}\n"
	bad := `{"id":"bad","messages":[{"role":"robot","content":"x"}]}`
	cases := []struct {
		name, file, content string
		traces              int    // stored when accepted; 0 means refused
		readerErr           string // the reader's words, in both refusals ("" when ingest refuses, or none does)
	}{
		{"body, project first", "a.json", `{"project":"ignored","traces":[` + tr("a") + "," + tr("b") + `]}`, 2, ""},
		{"body, project last", "a.json", `{"traces":[` + tr("a") + `],"project":"ignored"}`, 1, ""},
		{"array", "a.json", "[\n" + tr("a") + ",\n" + tr("b") + ",\n" + tr("c") + "\n]\n", 3, ""},
		{"jsonl, blank lines, crlf", "a.jsonl", tr("a") + "\r\n\r\n" + tr("b") + "\r\n", 2, ""},
		{"concatenated objects", "a.json", pretty + strings.ReplaceAll(pretty, "p1", "p2"), 2, ""},
		{"bom body", "a.json", "\xef\xbb\xbf" + `{"project":"x","traces":[` + tr("a") + `]}`, 1, ""},
		{"bom jsonl", "a.jsonl", "\xef\xbb\xbf" + tr("a") + "\n" + tr("b"), 2, ""},
		// By its name, a line of a .jsonl file is a trace, even one that looks like a collect body.
		{"jsonl of a body", "a.jsonl", `{"project":"x","traces":[` + tr("a") + `]}`, 0, ""},
		{"the same body in a .json file", "a.json", `{"project":"x","traces":[` + tr("a") + `]}`, 1, ""},
		{"empty", "a.json", "\n", 0, "the file is empty"},
		{"not json", "a.csv", "id,messages\n", 0, "not a trace file: line 1 starts with 'i'"},
		{"bad line 3", "a.jsonl", tr("a") + "\n" + tr("b") + "\n{\"id\": x}\n", 0, "trace #3 (line 3): invalid character 'x'"},
		{"trailing garbage", "a.json", `{"project":"x","traces":[` + tr("a") + "]}\n]", 0, "line 2: ']' after the collect body"},
		{"no traces", "a.json", `[]`, 0, "the file holds no traces"},
		{"an invalid trace", "a.json", "[" + tr("a") + "," + bad + "]", 0, ""},
	}

	fx := newUploadFx(t, schema.DriverSQLite)
	srv := httptest.NewServer(fx.h)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// doppel collect FILE --project …
			path := filepath.Join(dir, fmt.Sprintf("%d-%s", i, c.file))
			if err := os.WriteFile(path, []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
			res, cliErr := cli.Collect(context.Background(), cli.CollectOptions{Endpoint: srv.URL, Key: fx.key,
				Files: []string{path}, Project: fmt.Sprintf("cli-%d", i), Retries: -1})

			// {"project": …, "upload": …}
			up := fx.upload(t, fx.key, [2]string{c.file, c.content})[0]
			body, _ := json.Marshal(map[string]string{"project": fmt.Sprintf("upload-%d", i), "upload": up.ID})
			w := fx.do(http.MethodPost, "/api/collect", fx.key, bytes.NewReader(body), "application/json")
			var acc api.CollectAccepted
			_ = json.Unmarshal(w.Body.Bytes(), &acc)
			var refusal api.Envelope
			if w.Code != http.StatusAccepted {
				refusal = wantEnvelope(t, w, http.StatusUnprocessableEntity, "invalid")
			}

			// traces_upload on the build form
			env, err := store.UpsertEnvByProject(bg, fx.db, fx.ws, fmt.Sprintf("form-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			form, ct := multipartBody(t, part{"traces_upload", "", up.ID})
			fw := fx.do(http.MethodPost, "/v1/envs/"+env.Slug+"/builds", fx.key, form, ct)
			var formRefusal api.Envelope
			if fw.Code != http.StatusAccepted {
				formRefusal = wantEnvelope(t, fw, http.StatusUnprocessableEntity, "invalid")
			}
			stored, err := store.CountTraces(bg, fx.db, env.ID)
			if err != nil {
				t.Fatal(err)
			}

			if c.traces > 0 {
				if cliErr != nil || res.Accepted != int64(c.traces) {
					t.Errorf("doppel collect: %d accepted, %v; want %d", res.Accepted, cliErr, c.traces)
				}
				if w.Code != http.StatusAccepted || acc.Accepted != c.traces {
					t.Errorf("collect from the upload: %d %s; want %d accepted", w.Code, w.Body, c.traces)
				}
				if fw.Code != http.StatusAccepted || stored != int64(c.traces) {
					t.Errorf("traces_upload: %d %s, %d traces stored; want %d", fw.Code, fw.Body, stored, c.traces)
				}
				return
			}
			if cliErr == nil || w.Code == http.StatusAccepted || fw.Code == http.StatusAccepted || stored != 0 {
				t.Fatalf("refusals: doppel collect %v; collect from the upload %d; traces_upload %d (%d stored)", cliErr, w.Code, fw.Code, stored)
			}
			if c.readerErr == "" {
				return
			}
			for what, msg := range map[string]string{"doppel collect": cliErr.Error(), "collect from the upload": refusal.Detail,
				"traces_upload": formRefusal.Detail} {
				if !strings.Contains(msg, c.readerErr) {
					t.Errorf("%s: %q does not say %q", what, msg, c.readerErr)
				}
			}
			// The same words: the server's detail, without the field it names, ends the CLI's error.
			if _, words, _ := strings.Cut(refusal.Detail, "body.upload: "); !strings.HasSuffix(cliErr.Error(), words) {
				t.Errorf("doppel collect says %q, the server %q", cliErr, refusal.Detail)
			}
		})
	}
}
