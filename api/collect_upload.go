package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/ingest/tracefile"
	"github.com/doppel-dev/doppel/schema"
)

// uploadRefMax bounds the bodies looked at for an upload reference: {"project": …, "upload": "upl_…"} is small.
const uploadRefMax = 4 << 10

// fromUpload turns a collect body that references an upload ({"project": …, "upload": "upl_…"}) into the collect
// body it stands for: the project and the upload's traces (the upload is a trace file as doppel collect reads it:
// a collect body, a JSON array of traces, or JSON Lines of traces). Any other body is returned as is.
func (c *collect) fromUpload(ctx context.Context, ws string, body []byte) ([]byte, error) {
	if len(body) > uploadRefMax || !bytes.Contains(body, []byte(`"upload"`)) {
		return body, nil
	}
	var ref struct {
		Project json.RawMessage `json:"project"`
		Upload  *string         `json:"upload"`
		Traces  json.RawMessage `json:"traces"`
	}
	if json.Unmarshal(body, &ref) != nil || ref.Upload == nil {
		return body, nil // ingest.Decode says what is wrong with it
	}
	if ref.Traces != nil {
		return nil, Invalid("body.upload", "give traces or an upload, not both")
	}
	if ref.Project == nil {
		return nil, Invalid("body.project", "required")
	}
	up, data, err := readUpload(ctx, c.deps.DB, c.opts.Blobs, ws, *ref.Upload, "body.upload")
	if err != nil {
		return nil, err
	}
	out, err := uploadedBody(ref.Project, up.Filename, data)
	if err != nil {
		return nil, Invalid("body.upload", err.Error())
	}
	if int64(len(out)) > c.opts.MaxRequestBytes {
		return nil, TooLarge("the upload's traces make a batch of %d bytes, over the collect cap of %d; split it", len(out), c.opts.MaxRequestBytes)
	}
	return out, nil
}

// uploadedBody reads an uploaded trace file as doppel collect reads a file (ingest/tracefile: a collect body, a
// JSON array of traces, or traces one after another) into the collect body of its traces for project (raw JSON:
// collect's decoder says what is wrong with it). The file's own project, if any, is project's to replace; its
// name's extension counts as a file's does (.jsonl, .ndjson).
func uploadedBody(project json.RawMessage, filename string, data []byte) ([]byte, error) {
	rd, err := tracefile.NewReader(bytes.NewReader(data), tracefile.Options{Name: filename})
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(data)+len(project)+32)
	out = append(append(append(out, `{"project":`...), project...), `,"traces":[`...)
	for {
		t, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return append(out, "]}"...), nil
		}
		if err != nil {
			return nil, err
		}
		if t.Index > 0 {
			out = append(out, ',')
		}
		out = append(out, t.Raw...)
	}
}

// collectTraces collects the trace files the build form names by traces_upload into env, as collect would (the
// same checks and caps; traces env already holds are skipped), before its build is queued.
func (br *BuildRoutes) collectTraces(ctx context.Context, env *schema.Environment, form huma.MultipartFormFiles[BuildForm]) error {
	if form.Form == nil {
		return nil
	}
	for i, id := range form.Form.Value["traces_upload"] {
		field := fmt.Sprintf("body.traces_upload[%d]", i)
		up, data, err := readUpload(ctx, br.traces.deps.DB, br.traces.opts.Blobs, env.WorkspaceID, strings.TrimSpace(id), field)
		if err != nil {
			return err
		}
		project, _ := json.Marshal(env.Name)
		body, err := uploadedBody(project, up.Filename, data)
		if err != nil {
			return Invalid(field, err.Error())
		}
		if int64(len(body)) > br.traces.opts.MaxRequestBytes {
			return TooLarge("%s: its traces make a batch of %d bytes, over the collect cap of %d", field, len(body), br.traces.opts.MaxRequestBytes)
		}
		got, _, err := br.traces.storeBatch(ctx, env.WorkspaceID, body, ingest.Hints{})
		var e *Envelope
		if errors.As(err, &e) && e.status == http.StatusUnprocessableEntity {
			return Invalid(field, e.Detail)
		}
		if err != nil {
			return err
		}
		if got.ID != env.ID {
			return fmt.Errorf("traces of %s went to environment %s", env.ID, got.ID)
		}
	}
	return nil
}
