package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/schema"
)

// uploadRefMax bounds the bodies looked at for an upload reference: {"project": …, "upload": "upl_…"} is small.
const uploadRefMax = 4 << 10

// fromUpload turns a collect body that references an upload ({"project": …, "upload": "upl_…"}) into the collect
// body it stands for: the project and the upload's traces (the upload is a collect body, a JSON array of traces or
// JSON Lines of traces). Any other body is returned as is.
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
	_, data, err := readUpload(ctx, c.deps.DB, c.opts.Blobs, ws, *ref.Upload, "body.upload")
	if err != nil {
		return nil, err
	}
	traces, err := uploadedTraces(data)
	if err != nil {
		return nil, Invalid("body.upload", err.Error())
	}
	out, err := json.Marshal(struct {
		Project json.RawMessage `json:"project"`
		Traces  json.RawMessage `json:"traces"`
	}{ref.Project, traces})
	if err != nil {
		return nil, Invalid("body.upload", "the upload's traces are not JSON: "+err.Error())
	}
	if int64(len(out)) > c.opts.MaxRequestBytes {
		return nil, TooLarge("the upload's traces make a batch of %d bytes, over the collect cap of %d; split it", len(out), c.opts.MaxRequestBytes)
	}
	return out, nil
}

// uploadedTraces finds the traces array of an uploaded trace file.
func uploadedTraces(data []byte) (json.RawMessage, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, errUploadNotTraces
	}
	if json.Valid(data) {
		switch data[0] {
		case '[':
			return data, nil
		case '{':
			var body struct {
				Traces json.RawMessage `json:"traces"`
			}
			if json.Unmarshal(data, &body) == nil && body.Traces != nil {
				return body.Traces, nil
			}
		}
		if data[0] != '{' {
			return nil, errUploadNotTraces
		}
	}
	// JSON Lines: one trace object a line.
	var buf bytes.Buffer
	buf.WriteByte('[')
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), len(data)+1)
	n := 0
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if !json.Valid(line) || line[0] != '{' {
			return nil, errUploadLine(n + 1)
		}
		if n > 0 {
			buf.WriteByte(',')
		}
		buf.Write(line)
		n++
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	buf.WriteByte(']')
	return buf.Bytes(), nil
}

var errUploadNotTraces = errors.New("the upload holds no traces: expected a collect body {traces: [...]}, a JSON array of traces, or JSON Lines of traces")

func errUploadLine(n int) error {
	return fmt.Errorf("the upload is not JSON Lines of trace objects: line %d is not a JSON object", n)
}

// collectTraces collects the trace files the build form names by traces_upload into env, as collect would (the
// same checks and caps; traces env already holds are skipped), before its build is queued.
func (br *BuildRoutes) collectTraces(ctx context.Context, env *schema.Environment, form huma.MultipartFormFiles[BuildForm]) error {
	if form.Form == nil {
		return nil
	}
	for i, id := range form.Form.Value["traces_upload"] {
		field := fmt.Sprintf("body.traces_upload[%d]", i)
		_, data, err := readUpload(ctx, br.traces.deps.DB, br.traces.opts.Blobs, env.WorkspaceID, strings.TrimSpace(id), field)
		if err != nil {
			return err
		}
		traces, err := uploadedTraces(data)
		if err != nil {
			return Invalid(field, err.Error())
		}
		body, err := json.Marshal(struct {
			Project string          `json:"project"`
			Traces  json.RawMessage `json:"traces"`
		}{env.Name, traces})
		if err != nil {
			return Invalid(field, "the upload's traces are not JSON: "+err.Error())
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
