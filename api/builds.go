package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/toolplane"
	"github.com/doppel-dev/doppel/twin"
)

// BuildRoutes serve the multipart build route, build status and reports, and tools' handler source.
type BuildRoutes struct {
	Blobs   blob.Store
	Starter control.BuildStarter
	// MaxUploadBytes bounds a build upload (default 32 MiB); larger answers 413.
	MaxUploadBytes int64
	// Bundles caches decoded bundles (nil: a cache over Blobs is made).
	Bundles *toolplane.Bundles
	// Traces are the collect limits that trace files named by traces_upload are stored under (their Blobs
	// defaults to Blobs; the rate limit and the scheduler do not apply).
	Traces CollectOptions

	traces *collect
}

// BuildForm is the multipart body of POST /v1/envs/{slug}/builds. Every part is optional.
type BuildForm struct {
	Tools  huma.FormFile   `form:"tools" required:"false" contentType:"application/json,application/octet-stream" doc:"Tool definitions as JSON: an array (or {tools: [...]}) in the native {name, description, inputSchema}, OpenAI {type: function, function: {...}} or Anthropic {name, description, input_schema} shape. Uploaded definitions win over what the traces show. Its content type may be application/json or application/octet-stream (a file part's default)."`
	Code   []huma.FormFile `form:"code" required:"false" contentType:"text/plain,text/x-python,application/octet-stream" doc:"Provided tool code in Starlark, one file per tool named <tool>.star (or .py); it runs first for that tool, labelled A_executed. Its content type may be text/plain, text/x-python or application/octet-stream (a file part's default)."`
	Config huma.FormFile   `form:"config" required:"false" contentType:"application/json,application/octet-stream" doc:"Build config JSON: name, framework, language, scenarios {name: seed instructions}, bindings {tool: provided|synthesized|simulated}, clock (RFC 3339), world (open|closed: the policy for ids the world does not hold; default open), terminal_tools [tool names that end an episode when called, e.g. transfer_to_human_agents]. May also be sent as a plain form value. Its content type may be application/json or application/octet-stream (a file part's default)."`
}

// StartBuildInput is POST /v1/envs/{slug}/builds.
type StartBuildInput struct {
	Slug    string `path:"slug" minLength:"1" maxLength:"63" doc:"Environment slug."`
	RawBody huma.MultipartFormFiles[BuildForm]
}

// BuildStarted is the 202 answer of the build route.
type BuildStarted struct {
	BuildID    string `json:"build_id" doc:"Prefixed bld_." example:"bld_0123456789abcdef"`
	BuildIDB   string `json:"buildId" doc:"The same id, camelCase variant."`
	Status     string `json:"status" enum:"queued"`
	Env        string `json:"env" doc:"Environment slug."`
	Poll       string `json:"poll" doc:"Path to GET for status and progress."`
	WorkflowID string `json:"workflow_id" doc:"The Temporal workflow running the build (visible in the Temporal UI)."`
}

// StartBuildOutput wraps BuildStarted.
type StartBuildOutput struct {
	Status int
	Body   BuildStarted
}

// BuildDetail is a build as its GET shows it.
type BuildDetail struct {
	BuildSummary
	Env        string               `json:"env" doc:"Environment slug."`
	Active     bool                 `json:"active" doc:"Whether this is the environment's active build."`
	BundleKey  string               `json:"bundle_key" doc:"Blob key of the immutable, content-addressed bundle."`
	InputsKey  string               `json:"inputs_key" doc:"Blob key of the inputs (tool definitions, provided code, config) the build used: the environment's current inputs when it was queued, with the parts its form gave. Empty: none."`
	StartedAt  *time.Time           `json:"started_at" nullable:"true" format:"date-time"`
	WorkflowID string               `json:"workflow_id"`
	Summary    *schema.BuildFigures `json:"summary,omitempty" doc:"Inference and self-check summary of a succeeded build."`
}

// BuildIDInput names a build in the path.
type BuildIDInput struct {
	Slug    string `path:"slug" minLength:"1" maxLength:"63" doc:"Environment slug."`
	BuildID string `path:"build_id" minLength:"1" maxLength:"64" doc:"Build id (bld_…)."`
}

// BuildDetailOutput wraps BuildDetail.
type BuildDetailOutput struct {
	Body BuildDetail
}

// ListBuildsOutput is GET /v1/envs/{slug}/builds.
type ListBuildsOutput struct {
	Body []BuildSummary
}

// BuildReportOutput is GET /v1/envs/{slug}/builds/{build_id}/report.
type BuildReportOutput struct {
	Body BuildReport
}

// BuildReport holds a finished build's full reports.
type BuildReport struct {
	Build     *infer.Report          `json:"build" doc:"Inference report: per tool binding, rung, kind, calls, fit; entity tables; warnings for messy input."`
	SelfCheck *infer.SelfCheckReport `json:"self_check" doc:"Leave-one-out self-check: per tool agreement with recorded answers and the fidelity mix."`
}

// ToolSourceInput names a tool of the active build.
type ToolSourceInput struct {
	Slug string `path:"slug" minLength:"1" maxLength:"63" doc:"Environment slug."`
	Name string `path:"name" minLength:"1" maxLength:"200" doc:"Tool name."`
}

// ToolSource is a tool's handler code as the active build holds it.
type ToolSource struct {
	Name     string `json:"name"`
	Binding  string `json:"binding" enum:"provided,synthesized,simulated"`
	Rung     string `json:"rung"`
	Kind     string `json:"kind" doc:"What the build recognised: read, lookup, write, constant, template, pure, state (reads state beyond rows: variables), query or unknown."`
	Language string `json:"language" enum:"starlark"`
	Source   string `json:"source" doc:"The synthesized Starlark handler; empty when none could be made."`
	Provided string `json:"provided" doc:"The caller's own code, when uploaded; it runs first."`
	Build    string `json:"build" doc:"The build the source belongs to."`
}

// ToolSourceOutput wraps ToolSource.
type ToolSourceOutput struct {
	Body ToolSource
}

// Register adds the build routes.
func (br *BuildRoutes) Register(a huma.API, d *Deps) {
	if br.MaxUploadBytes == 0 {
		br.MaxUploadBytes = 32 << 20
	}
	if br.Bundles == nil {
		br.Bundles = &toolplane.Bundles{Blob: br.Blobs}
	}
	topts := br.Traces.withDefaults()
	if topts.Blobs == nil {
		topts.Blobs = br.Blobs
	}
	topts.Scheduler = nil
	br.traces = &collect{opts: topts, deps: d}
	envs := &control.Envs{DB: d.DB}
	builds := &control.Builds{DB: d.DB, Blobs: br.Blobs, Starter: br.Starter, Log: requestLogger}
	huma.Register(a, huma.Operation{
		OperationID: "builds.start",
		Metadata:    map[string]any{MetaVerb: false}, // plain HTTP (spec §1): a multipart upload, not a verb
		Method:      http.MethodPost,
		Path:        "/v1/envs/{slug}/builds",
		Summary:     "Start a build",
		Description: "Builds the environment from its collected traces and its inputs: tool definitions, provided " +
			"Starlark code and config. The inputs persist per environment until replaced: the parts this multipart form " +
			"gives replace the environment's (`tools` replaces all tool definitions, `config` the whole config, each " +
			"`code` file the code of its tool) and the rest is carried forward; a form with no parts rebuilds with the " +
			"current inputs. A part may instead name an upload (POST /api/uploads) by id in the form values " +
			"`tools_upload`, `config_upload` or `code_upload` (repeatable; the upload's filename names the tool); " +
			"`traces_upload` (repeatable) names trace files (a collect body, a JSON array or JSON Lines of traces) that are " +
			"collected into the environment, under collect's rules, before the build is queued. " +
			"Automatic rebuilds after collected traces use the current inputs too. Each build records " +
			"the inputs it used (`inputs_key`). Bad parts, alone or with the current inputs, are a 422 naming the part, " +
			"and change nothing. Answers 202 with a build id to poll; the build runs as a Temporal workflow. A failed " +
			"build leaves the previous active build in place and says why.",
		Tags:          []string{"builds"},
		Security:      WorkspaceKeyAuth(),
		DefaultStatus: http.StatusAccepted,
		MaxBodyBytes:  br.MaxUploadBytes,
		Middlewares:   huma.Middlewares{limitBody(br.MaxUploadBytes), removeFormFiles},
	}, mapped(func(ctx context.Context, in *StartBuildInput) (*StartBuildOutput, error) {
		defer closeParts(in.RawBody.Data())
		p := PrincipalFrom(ctx)
		env, err := envs.Lookup(ctx, p.Workspace.ID, in.Slug)
		if err != nil {
			return nil, err
		}
		up, err := readBuildForm(in.RawBody, func(field, id string) (*schema.Upload, []byte, error) {
			return readUpload(ctx, d.DB, br.Blobs, p.Workspace.ID, id, field)
		})
		if err != nil {
			return nil, err
		}
		if err := br.collectTraces(ctx, env, in.RawBody); err != nil {
			return nil, err
		}
		b, err := builds.Start(ctx, env, up)
		if err != nil {
			return nil, err
		}
		return &StartBuildOutput{Status: http.StatusAccepted, Body: BuildStarted{
			BuildID: b.ID, BuildIDB: b.ID, Status: b.Status, Env: env.Slug, WorkflowID: b.WorkflowID,
			Poll: "/v1/envs/" + env.Slug + "/builds/" + b.ID,
		}}, nil
	}))
	defaultEncodings(a.OpenAPI().Paths["/v1/envs/{slug}/builds"].Post)

	huma.Register(a, huma.Operation{
		OperationID: "builds.list",
		Method:      http.MethodGet,
		Path:        "/v1/envs/{slug}/builds",
		Summary:     "List builds",
		Description: "The environment's builds, newest first (at most 100).",
		Tags:        []string{"builds"},
		Security:    WorkspaceKeyAuth(),
	}, mapped(func(ctx context.Context, in *SlugInput) (*ListBuildsOutput, error) {
		bs, err := builds.List(ctx, PrincipalFrom(ctx).Workspace.ID, in.Slug)
		if err != nil {
			return nil, err
		}
		out := &ListBuildsOutput{Body: make([]BuildSummary, 0, len(bs))}
		for i := range bs {
			out.Body = append(out.Body, *BuildSummaryOf(&bs[i]))
		}
		return out, nil
	}))

	huma.Register(a, huma.Operation{
		OperationID: "builds.get",
		Method:      http.MethodGet,
		Path:        "/v1/envs/{slug}/builds/{build_id}",
		Summary:     "Show a build",
		Description: "Status, stage and progress (0–1) of a build; the summary once it finished; the reason when it failed.",
		Tags:        []string{"builds"},
		Security:    WorkspaceKeyAuth(),
	}, mapped(func(ctx context.Context, in *BuildIDInput) (*BuildDetailOutput, error) {
		env, b, err := builds.Get(ctx, PrincipalFrom(ctx).Workspace.ID, in.Slug, in.BuildID)
		if err != nil {
			return nil, err
		}
		det := BuildDetail{BuildSummary: *BuildSummaryOf(b), Env: env.Slug, Active: env.ActiveBuildID == b.ID,
			BundleKey: b.BundleKey, InputsKey: b.UploadKey, WorkflowID: b.WorkflowID}
		if len(b.Report) > 0 && string(b.Report) != "null" {
			if det.Summary, err = schema.DecodeBuildFigures(b.Report); err != nil {
				return nil, fmt.Errorf("build %s: %w", b.ID, err)
			}
		}
		if b.StartedAt != nil {
			t := b.StartedAt.UTC()
			det.StartedAt = &t
		}
		return &BuildDetailOutput{Body: det}, nil
	}))

	huma.Register(a, huma.Operation{
		OperationID: "builds.report",
		Method:      http.MethodGet,
		Path:        "/v1/envs/{slug}/builds/{build_id}/report",
		Summary:     "Show a build's report",
		Description: "The full inference report and the leave-one-out self-check of a succeeded build: per tool binding, " +
			"rung and agreement with the recorded answers. 409 while the build has not succeeded.",
		Tags:     []string{"builds"},
		Security: WorkspaceKeyAuth(),
	}, mapped(func(ctx context.Context, in *BuildIDInput) (*BuildReportOutput, error) {
		_, b, err := builds.Get(ctx, PrincipalFrom(ctx).Workspace.ID, in.Slug, in.BuildID)
		if err != nil {
			return nil, err
		}
		if b.Status != schema.BuildSucceeded {
			return nil, Conflict("build %s is %s: its report exists once it has succeeded", b.ID, b.Status)
		}
		sum, err := schema.DecodeBuildFigures(b.Report)
		if err != nil {
			return nil, fmt.Errorf("build %s: %w", b.ID, err)
		}
		out := &BuildReportOutput{}
		if err := br.getJSON(ctx, sum.Inferred.ReportKey, &out.Body.Build); err != nil {
			return nil, err
		}
		if err := br.getJSON(ctx, b.ReportKey, &out.Body.SelfCheck); err != nil {
			return nil, err
		}
		return out, nil
	}))

	huma.Register(a, huma.Operation{
		OperationID: "tools.source",
		Method:      http.MethodGet,
		Path:        "/v1/envs/{slug}/tools/{name}/source",
		Summary:     "Read a tool's handler code",
		Description: "The Starlark handler the active build synthesized for a tool (and the provided code, if any): " +
			"readable, and the starting point for code you upload to override it.",
		Tags:     []string{"tools"},
		Security: WorkspaceKeyAuth(),
	}, mapped(func(ctx context.Context, in *ToolSourceInput) (*ToolSourceOutput, error) {
		env, b, err := envs.Active(ctx, PrincipalFrom(ctx).Workspace.ID, in.Slug)
		if err != nil {
			return nil, err
		}
		bundle, err := br.Bundles.Get(ctx, b)
		if err != nil {
			return nil, err
		}
		for _, t := range bundle.Tools {
			if t.Name == in.Name {
				return &ToolSourceOutput{Body: ToolSource{Name: t.Name, Binding: t.Binding, Rung: t.Rung, Kind: t.Kind,
					Language: "starlark", Source: t.Source, Provided: t.Provided, Build: b.ID}}, nil
			}
		}
		return nil, NotFound("tool %q is not in environment %s", in.Name, env.Slug)
	}))
}

// limitBody answers 413 for a body over max bytes, whether or not it declares its length. Huma's own MaxBodyBytes
// does not cover multipart bodies, which it parses straight from the request.
func limitBody(max int64) func(huma.Context, func(huma.Context)) {
	return func(ctx huma.Context, next func(huma.Context)) {
		r, w := humago.Unwrap(ctx)
		tooLarge := func() {
			WriteError(w, r, TooLarge("the upload is over the %d-byte limit", max))
		}
		if r.ContentLength > max {
			tooLarge()
			return
		}
		data, err := io.ReadAll(io.LimitReader(r.Body, max+1))
		if err != nil {
			WriteError(w, r, Invalid("body", "could not read the body: "+err.Error()))
			return
		}
		if int64(len(data)) > max {
			tooLarge()
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(data))
		next(ctx)
	}
}

// removeFormFiles removes the temp files a multipart form spooled its large parts to once the route has answered,
// whatever it answered.
func removeFormFiles(ctx huma.Context, next func(huma.Context)) {
	r, _ := humago.Unwrap(ctx)
	defer func() {
		if r.MultipartForm != nil {
			_ = r.MultipartForm.RemoveAll()
		}
	}()
	next(ctx)
}

// closeParts closes the form's parts, which huma opened for the route.
func closeParts(f *BuildForm) {
	if f == nil {
		return
	}
	for _, p := range append([]huma.FormFile{f.Tools, f.Config}, f.Code...) {
		if p.File != nil {
			_ = p.File.Close()
		}
	}
}

func (br *BuildRoutes) getJSON(ctx context.Context, key string, v any) error {
	if key == "" {
		return nil
	}
	rc, err := br.Blobs.Get(ctx, key)
	if err != nil {
		return Unavailable("blob %s: %s", key, withoutPaths(err))
	}
	defer rc.Close()
	if err := json.NewDecoder(rc).Decode(v); err != nil {
		return fmt.Errorf("blob %s: %w", key, err)
	}
	return nil
}

// readBuildForm turns the multipart parts into an upload (nil when the form carries none), validating each part on
// its own; a 422 names the part (tools, code.<tool>, config). The inputs they make with the environment's current
// ones are validated as a whole by control.Builds.Start.
func readBuildForm(form huma.MultipartFormFiles[BuildForm], uploaded uploadReader) (*infer.Upload, error) {
	f := form.Data()
	up := &infer.Upload{}
	empty := true
	refs, err := uploadRefs(form, uploaded)
	if err != nil {
		return nil, err
	}
	if f.Tools.IsSet && refs.tools != nil {
		return nil, Invalid("body.tools_upload", "give the tools part or tools_upload, not both")
	}
	if f.Tools.IsSet || refs.tools != nil {
		data := refs.tools
		if f.Tools.IsSet {
			if data, err = io.ReadAll(f.Tools); err != nil {
				return nil, Invalid("body.tools", "could not read the part: "+withoutPaths(err))
			}
		}
		if !json.Valid(data) {
			return nil, Invalid("body.tools", "is not JSON")
		}
		if _, err := infer.ParseToolDefs(data); err != nil {
			return nil, Invalid("body.tools", control.TrimBadInput(err))
		}
		up.Tools, empty = data, false
	}
	codes := refs.code
	for _, c := range f.Code {
		data, err := io.ReadAll(c)
		if err != nil {
			return nil, Invalid("body.code", "could not read "+c.Filename+": "+withoutPaths(err))
		}
		codes = append(codes, codeFile{c.Filename, data})
	}
	for _, c := range codes {
		name := strings.TrimSuffix(strings.TrimSuffix(path.Base(c.filename), ".star"), ".py")
		data := c.data
		if name == "" || name == "." {
			return nil, Invalid("body.code", "each code part needs a filename naming its tool, e.g. get_order.star")
		}
		if up.Code == nil {
			up.Code = map[string]string{}
		}
		if _, dup := up.Code[name]; dup {
			return nil, Invalid("body.code."+name, "given twice")
		}
		if err := twin.CheckHandler(name, string(data)); err != nil {
			return nil, Invalid("body.code."+name, err.Error())
		}
		up.Code[name], empty = string(data), false
	}
	cfg := refs.config
	if cfg != nil && (f.Config.IsSet || (form.Form != nil && len(form.Form.Value["config"]) > 0)) {
		return nil, Invalid("body.config_upload", "give the config part or config_upload, not both")
	}
	if f.Config.IsSet {
		data, err := io.ReadAll(f.Config)
		if err != nil {
			return nil, Invalid("body.config", "could not read the part: "+withoutPaths(err))
		}
		cfg = data
	} else if form.Form != nil && len(form.Form.Value["config"]) > 0 {
		cfg = []byte(form.Form.Value["config"][0])
	}
	if len(cfg) > 0 {
		dec := json.NewDecoder(bytes.NewReader(cfg))
		dec.DisallowUnknownFields()
		var c infer.Config
		if err := dec.Decode(&c); err != nil {
			return nil, Invalid("body.config", "not a valid build config: "+err.Error())
		}
		up.Config, empty = &c, false
	}
	if empty {
		return nil, nil
	}
	return up, nil
}
