package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/danielgtaylor/huma/v2"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/envinputs"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// inputsAttempts bounds how often queueBuild starts over when a concurrent build replaced the inputs it read.
const inputsAttempts = 3

// queueBuild creates build row b over the environment's inputs. With parts (nil: the form gave none), the parts
// replace the current inputs' (infer.Upload.With), the result is validated as a whole and stored, and it becomes
// the environment's current inputs in the transaction that creates the row. Invalid inputs answer 422 naming the
// part and change nothing.
func (br *BuildRoutes) queueBuild(ctx context.Context, d *Deps, env *schema.Environment, parts *infer.Upload, b *schema.Build) error {
	if parts == nil {
		return store.CreateBuild(ctx, d.DB, b)
	}
	what := "environment " + env.Slug
	for attempt := 1; ; attempt++ {
		cur, err := br.inputs(ctx, env.InputsKey)
		if err != nil {
			return err
		}
		next := cur.With(*parts)
		if _, err := next.Options(); err != nil {
			return inputsError(err)
		}
		data, err := json.Marshal(next)
		if err != nil {
			return fmt.Errorf("encode build inputs: %w", err)
		}
		key, err := blob.PutContent(ctx, br.Blobs, "uploads/", data, "application/json")
		if err != nil {
			loggerFrom(ctx).WarnContext(ctx, "build: store inputs", slog.String("request_id", RequestID(ctx)), slog.Any("error", err))
			return Unavailable("the blob store is not answering; no build was started, retry")
		}
		err = store.CreateBuildWithInputs(ctx, d.DB, b, env.InputsKey, key)
		if !errors.Is(err, store.ErrConflict) || attempt == inputsAttempts {
			return StoreError(err, what)
		}
		// Another build replaced the inputs since they were read: start over from the new ones.
		if env, err = store.GetEnvByID(ctx, d.DB, b.EnvID); err != nil {
			return StoreError(err, what)
		}
	}
}

// inputs reads the inputs blob key names ("" is no inputs).
func (br *BuildRoutes) inputs(ctx context.Context, key string) (infer.Upload, error) {
	return envinputs.Read(ctx, br.Blobs, key)
}

// inputsError is the 422 for inputs that do not validate, located at the part the message names (body.tools,
// body.code.<tool>, body.config.bindings.<tool>, …).
func inputsError(err error) error {
	loc, msg := "body", trimBadInput(err)
	if field, rest, ok := strings.Cut(msg, ": "); ok && !strings.Contains(field, " ") {
		loc, msg = "body."+field, rest
	}
	return Invalid(loc, msg)
}

// uploadReader reads a workspace's upload referenced by form field field.
type uploadReader func(field, id string) (*schema.Upload, []byte, error)

type codeFile struct {
	filename string
	data     []byte
}

// buildUploadRefs are the build inputs a form names by upload id.
type buildUploadRefs struct {
	tools, config []byte
	code          []codeFile
}

// uploadRefs reads the uploads the build form names: tools_upload and config_upload (one each) and code_upload (one
// per tool, the upload's filename naming it, as a code part's does).
func uploadRefs(form huma.MultipartFormFiles[BuildForm], read uploadReader) (buildUploadRefs, error) {
	var refs buildUploadRefs
	if form.Form == nil {
		return refs, nil
	}
	vals := form.Form.Value
	one := func(field string) ([]byte, error) {
		ids := vals[field]
		switch {
		case len(ids) == 0:
			return nil, nil
		case len(ids) > 1:
			return nil, Invalid("body."+field, "given more than once")
		}
		_, data, err := read("body."+field, strings.TrimSpace(ids[0]))
		return data, err
	}
	var err error
	if refs.tools, err = one("tools_upload"); err != nil {
		return refs, err
	}
	if refs.config, err = one("config_upload"); err != nil {
		return refs, err
	}
	for i, id := range vals["code_upload"] {
		u, data, err := read(fmt.Sprintf("body.code_upload[%d]", i), strings.TrimSpace(id))
		if err != nil {
			return refs, err
		}
		refs.code = append(refs.code, codeFile{u.Filename, data})
	}
	return refs, nil
}
