package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/danielgtaylor/huma/v2"
	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/control"
	"github.com/doppel-dev/doppel/cred"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/toolplane"
)

// OpenEnvCommit is the meta-pytorch/OpenEnv commit whose server this interface follows (docs/openenv.md).
const OpenEnvCommit = "685de411e5f77286b0fd94798d42c4467cf8a1bc"

// DefaultOpenEnvConcurrent is the most WebSocket episodes one process serves at once when none is configured.
const DefaultOpenEnvConcurrent = 4096

// OpenEnvRoutes serve every environment over OpenEnv's environment-server interface under /openenv/envs/{slug}/:
// the /ws episode channel, the stateless HTTP /reset, /step and /state, /schema, /metadata, /health and the
// openenv.yaml manifest. Actions are OpenEnv's MCP tool actions (list_tools, call_tool); every episode is a doppel
// session opened, called and closed through the tool plane, with the workspace key's credentials.
type OpenEnvRoutes struct {
	Plane *toolplane.Plane
	// Model says a model is configured (the tools listing then includes tools only the simulate rung answers).
	Model bool
	// MaxConcurrent is the most WebSocket episodes this process serves at once (0: DefaultOpenEnvConcurrent).
	MaxConcurrent int

	db     *bun.DB
	auth   *Authenticator
	logger *slog.Logger
	active atomic.Int64
}

const openEnvPrefix = "/openenv/envs/{slug}/"

// Register mounts the routes on d.Mux.
func (o *OpenEnvRoutes) Register(_ huma.API, d *Deps) {
	if o.Plane == nil {
		o.Plane = toolplane.New(toolplane.Options{DB: d.DB})
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = DefaultOpenEnvConcurrent
	}
	o.db, o.auth, o.logger = d.DB, d.Auth, d.Logger
	d.Mux.HandleFunc("GET "+openEnvPrefix+"health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "healthy"})
	})
	d.Mux.Handle("GET "+openEnvPrefix+"metadata", o.guard(o.metadata))
	d.Mux.Handle("GET "+openEnvPrefix+"schema", o.guard(o.schema))
	d.Mux.Handle("GET "+openEnvPrefix+"state", o.guard(o.httpState))
	d.Mux.Handle("POST "+openEnvPrefix+"reset", o.guard(o.httpReset))
	d.Mux.Handle("POST "+openEnvPrefix+"step", o.guard(o.httpStep))
	d.Mux.Handle("GET "+openEnvPrefix+"openenv.yaml", o.guard(o.manifest))
	d.Mux.Handle("GET "+openEnvPrefix+"ws", o.guard(o.websocket))
}

// oeEnv is the environment a request addresses, with its principal and tools.
type oeEnv struct {
	principal *Principal
	env       *schema.Environment
	build     *schema.Build
	tools     ToolList
}

// guard authenticates the workspace key (as REST's environment routes do) and reads the environment.
func (o *OpenEnvRoutes) guard(next func(http.ResponseWriter, *http.Request, *oeEnv)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		p, err := o.auth.Key(ctx, r.Header.Get("Authorization"), cred.KindWorkspace)
		if err != nil {
			WriteError(w, r, err)
			return
		}
		slug := r.PathValue("slug")
		env, build, err := (&control.Envs{DB: o.db}).Active(ctx, p.Workspace.ID, slug)
		if err != nil {
			WriteError(w, r, err)
			return
		}
		e := &oeEnv{principal: p, env: env, build: build}
		b, err := o.Plane.Bundles().Get(ctx, e.build)
		if err != nil {
			WriteError(w, r, err)
			return
		}
		if e.tools, err = ToolEntries(b, e.build, FormatAnthropic, o.Model); err != nil {
			WriteError(w, r, err)
			return
		}
		next(w, r.WithContext(WithPrincipal(ctx, p)), e)
	})
}

// ---- metadata, schema, manifest ----

func (o *OpenEnvRoutes) metadata(w http.ResponseWriter, _ *http.Request, e *oeEnv) {
	name := e.env.Name
	if name == "" {
		name = e.env.Slug
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"name": name,
		"description": "The doppel twin of environment " + e.env.Slug + ": its production tools, answered in a " +
			"seeded, journaled doppel session per episode. Actions are MCP tool actions (list_tools, call_tool).",
		"readme_content": nil, "version": e.build.ID, "author": nil, "documentation_url": nil,
	})
}

func (o *OpenEnvRoutes) schema(w http.ResponseWriter, _ *http.Request, e *oeEnv) {
	names := make([]string, len(e.tools))
	for i, t := range e.tools {
		names[i] = t.(AnthropicTool).Name
	}
	meta := map[string]any{"type": "object", "additionalProperties": true, "description": "Additional metadata for the action"}
	writeJSON(w, http.StatusOK, map[string]any{
		"action": map[string]any{"oneOf": []any{
			map[string]any{"title": "ListToolsAction", "type": "object", "additionalProperties": false,
				"properties": map[string]any{"metadata": meta, "type": map[string]any{"const": "list_tools", "default": "list_tools"}}},
			map[string]any{"title": "CallToolAction", "type": "object", "additionalProperties": false, "required": []string{"tool_name"},
				"properties": map[string]any{"metadata": meta, "type": map[string]any{"const": "call_tool", "default": "call_tool"},
					"tool_name": map[string]any{"type": "string", "enum": names},
					"arguments": map[string]any{"type": "object", "additionalProperties": true}}},
		}},
		"observation": map[string]any{"title": "CallToolObservation", "type": "object", "properties": map[string]any{
			"done":      map[string]any{"type": "boolean", "default": false},
			"reward":    map[string]any{"anyOf": []any{map[string]any{"type": "number"}, map[string]any{"type": "null"}}},
			"metadata":  map[string]any{"type": "object", "description": "session_id, call_id, fidelity, rung, steps; when done, the verdicts"},
			"tool_name": map[string]any{"type": "string"},
			"result":    map[string]any{"description": "The tool's answer: {content: [{type: text, text}], data, is_error}"},
			"error": map[string]any{"anyOf": []any{map[string]any{"type": "null"}, map[string]any{"type": "object", "properties": map[string]any{
				"error_type": map[string]any{"enum": []string{"execution_error", "invalid_args", "transport_error", "tool_not_found", "timeout"}},
				"message":    map[string]any{"type": "string"}}}}},
			"tools": map[string]any{"type": "array", "description": "list_tools only: {name, description, input_schema}"},
		}},
		"state": map[string]any{"title": "State", "type": "object", "additionalProperties": true, "properties": map[string]any{
			"episode_id": map[string]any{"anyOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "null"}}},
			"step_count": map[string]any{"type": "integer", "minimum": 0},
		}},
	})
}

func (o *OpenEnvRoutes) manifest(w http.ResponseWriter, _ *http.Request, e *oeEnv) {
	w.Header().Set("Content-Type", "application/yaml")
	fmt.Fprintf(w, "spec_version: 1\nname: %s\ndescription: %q\ntype: space\nruntime: doppel\napp: doppel serve\nport: 8080\n"+
		"action: CallToolAction\nobservation: CallToolObservation\n"+
		"concurrency:\n  supports_concurrent_sessions: true\n  max_concurrent_envs: %d\n  session_timeout: %d\n"+
		"doppel:\n  env: %s\n  build: %s\n  openenv_commit: %s\n",
		strings.ReplaceAll(e.env.Slug, "-", "_")+"_env", "doppel twin of "+e.env.Slug, o.MaxConcurrent,
		int64(o.Plane.Idle().Seconds()), e.env.Slug, e.build.ID, OpenEnvCommit)
}

// ---- episodes ----

// oeEpisode is one OpenEnv episode: its doppel session (nil before reset) and its steps.
type oeEpisode struct {
	routes *OpenEnvRoutes
	env    *oeEnv
	opened *toolplane.Opened
	steps  int64
	done   bool
	reward *float64
}

// resetData is what a reset takes: OpenEnv's seed and episode_id, and doppel's open options at the top level or
// in options (Gymnasium's reset(seed, options)).
var resetOptions = []string{"seed_instructions", "seedInstructions", "scenario", "clock", "recordOutputs", "faults", "trace"}

// reset opens the episode's session from a reset's data, closing the one before.
func (ep *oeEpisode) reset(ctx context.Context, data map[string]any, where string) (map[string]any, error) {
	sp := openSpec{where: map[string]string{}}
	opts, _ := data["options"].(map[string]any)
	if v, ok := data["options"]; ok && v != nil && opts == nil {
		return nil, Invalid(where+".options", "expected an object")
	}
	var task *EpisodeTask
	for _, src := range []struct {
		m     map[string]any
		where string
	}{{data, where}, {opts, where + ".options"}} {
		for name, v := range src.m {
			switch name {
			case "seed":
				if v == nil {
					continue
				}
				if err := sp.set(src.where, name, v); err != nil {
					return nil, err
				}
			case "episode_id", "options":
			case "task", "expect", "expectations", "max_steps", "reward":
				if task == nil {
					task = &EpisodeTask{}
				}
				if err := taskField(task, src.where, name, v); err != nil {
					return nil, err
				}
			default:
				known := false
				for _, n := range resetOptions {
					known = known || n == name
				}
				if !known {
					continue // OpenEnv passes on only the parameters reset takes
				}
				if err := sp.set(src.where, name, v); err != nil {
					return nil, err
				}
			}
		}
	}
	req, err := sp.request(&envStart{principal: ep.env.principal, env: ep.env.env})
	if err != nil {
		return nil, err
	}
	req.Task = task.task()
	opened, err := ep.routes.Plane.Open(ctx, req)
	if err != nil {
		return nil, relocateTask(sp.relocate(err), where)
	}
	ep.end(ctx)
	ep.opened, ep.steps, ep.done, ep.reward = opened, 0, false, nil
	if s := opened.Session; s.ForkedAt > 0 {
		ep.steps = s.ForkedAt
	}
	return map[string]any{"observation": map[string]any{"metadata": ep.meta(nil)}, "reward": nil, "done": false}, nil
}

// taskField reads one episode option of a reset.
func taskField(t *EpisodeTask, where, name string, v any) error {
	field := where + "." + name
	raw, err := json.Marshal(v)
	if err != nil {
		return Invalid(field, err.Error())
	}
	switch name {
	case "task":
		err = json.Unmarshal(raw, t)
	case "expect", "expectations":
		err = json.Unmarshal(raw, &t.Expect)
	case "max_steps":
		err = json.Unmarshal(raw, &t.MaxSteps)
	case "reward":
		err = json.Unmarshal(raw, &t.Reward)
	}
	if err != nil {
		return Invalid(field, "not a task field: "+err.Error())
	}
	return nil
}

// relocateTask names a refused task field where the reset gave it.
func relocateTask(err error, where string) error {
	var pe *toolplane.Error
	if errors.As(err, &pe) && pe.Kind == toolplane.Invalid && strings.HasPrefix(pe.Field, "body.task") {
		return &toolplane.Error{Kind: pe.Kind, Field: where + strings.TrimPrefix(pe.Field, "body"), Detail: pe.Detail}
	}
	return err
}

// end closes the episode's session, if it has one.
func (ep *oeEpisode) end(ctx context.Context) {
	if ep.opened == nil {
		return
	}
	if _, err := ep.routes.Plane.Close(context.WithoutCancel(ctx), ep.opened.Session); err != nil {
		ep.routes.logger.Warn("close the session of an OpenEnv episode", "session", ep.opened.Session.ID, "error", err)
	}
	ep.opened = nil
}

// meta is an observation's metadata: the session (so it can be read, graded or continued over REST or MCP) and
// the call's labels.
func (ep *oeEpisode) meta(extra map[string]any) map[string]any {
	s, rc := ep.opened.Session, ep.opened.Receipts
	m := map[string]any{"session_id": s.ID, "session_token": ep.opened.Token, "env": ep.env.env.Slug,
		"seed": s.Seed, "world_hash": s.WorldHash, "clock": rc.Clock, "steps": ep.steps}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// oeAction is an OpenEnv action: ListToolsAction or CallToolAction.
type oeAction struct {
	Type      string          `json:"type"`
	ToolName  string          `json:"tool_name"`
	Arguments json.RawMessage `json:"arguments"`
	Metadata  map[string]any  `json:"metadata"`
}

// parseAction checks an action as OpenEnv's pydantic models do: a known type and no other fields.
func parseAction(raw json.RawMessage, where string) (*oeAction, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, Invalid(where, "expected an action object: {type: list_tools} or {type: call_tool, tool_name, arguments}")
	}
	var a oeAction
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, Invalid(where, err.Error())
	}
	allowed := map[string]bool{"type": true, "metadata": true}
	switch a.Type {
	case "list_tools":
	case "call_tool":
		allowed["tool_name"], allowed["arguments"] = true, true
		if a.ToolName == "" {
			return nil, Invalid(where+".tool_name", "required: the tool to call")
		}
		if len(a.Arguments) == 0 || string(a.Arguments) == "null" {
			a.Arguments = json.RawMessage("{}")
		}
	default:
		return nil, Invalid(where+".type", "expected list_tools or call_tool")
	}
	for k := range fields {
		if !allowed[k] {
			return nil, Invalid(where+"."+k, "extra fields not permitted")
		}
	}
	return &a, nil
}

// step runs one action in the episode; a call_tool before reset opens the session with a drawn seed first.
func (ep *oeEpisode) step(ctx context.Context, a *oeAction) (map[string]any, error) {
	if a.Type == "list_tools" {
		tools := make([]any, len(ep.env.tools))
		for i, t := range ep.env.tools {
			at := t.(AnthropicTool)
			tools[i] = map[string]any{"name": at.Name, "description": at.Description, "input_schema": objectSchema(at.InputSchema)}
		}
		obs := map[string]any{"tools": tools}
		if ep.opened != nil {
			obs["metadata"] = ep.meta(nil)
		}
		return map[string]any{"observation": obs, "reward": ep.rewardNow(), "done": ep.done}, nil
	}
	if ep.opened == nil {
		if _, err := ep.reset(ctx, map[string]any{}, "data"); err != nil {
			return nil, err
		}
	}
	res, err := ep.routes.Plane.Call(ctx, ep.opened.Session, toolplane.CallRequest{Tool: a.ToolName, Arguments: a.Arguments, Requestor: "assistant"})
	obs := map[string]any{"tool_name": a.ToolName, "result": nil, "error": nil}
	if err != nil {
		kind := ""
		var refusal *toolplane.Error
		if errors.As(err, &refusal) {
			switch {
			case refusal.Kind == toolplane.NotFound && strings.Contains(refusal.Detail, "tool"):
				kind = "tool_not_found"
			case refusal.Kind == toolplane.Invalid:
				kind = "invalid_args"
			}
		}
		if kind == "" {
			return nil, err // the episode cannot go on (done, closed, a twin down): the transport's error
		}
		obs["error"] = map[string]any{"error_type": kind, "message": refusal.Detail}
		obs["metadata"] = ep.meta(nil)
		return map[string]any{"observation": obs, "reward": nil, "done": false}, nil
	}
	ep.steps++
	extra := map[string]any{"call_id": res.CallID, "fidelity": res.Fidelity, "rung": res.Rung, "downgraded": res.Downgraded, "tool_error": res.Error}
	if res.Fault != nil {
		extra["fault"] = callFault(res.Fault)
	}
	if e := res.Episode; e != nil {
		ep.steps = e.Steps
		if e.Done {
			ep.done, ep.reward = true, e.Reward
			extra["done_reason"] = e.Reason
			extra["verdicts"] = verdicts(ep.opened.Session, e.Outcomes)
		}
	}
	obs["result"] = map[string]any{"content": []any{map[string]any{"type": "text", "text": res.Content}},
		"structured_content": nil, "meta": nil, "data": res.Content, "is_error": res.Error}
	obs["metadata"] = ep.meta(extra)
	return map[string]any{"observation": obs, "reward": ep.rewardNow(), "done": ep.done}, nil
}

// rewardNow is the episode's reward: set once it is done, else null.
func (ep *oeEpisode) rewardNow() any {
	if ep.reward == nil {
		return nil
	}
	return *ep.reward
}

// state is OpenEnv's State: the episode id (the session's) and its steps, with doppel's session fields.
func (ep *oeEpisode) state(ctx context.Context) (map[string]any, error) {
	if ep.opened == nil {
		return map[string]any{"episode_id": nil, "step_count": 0}, nil
	}
	st, err := ep.routes.Plane.Read(ctx, ep.opened.Session)
	if err != nil {
		return nil, err
	}
	return map[string]any{"episode_id": ep.opened.Session.ID, "step_count": ep.steps, "session_id": ep.opened.Session.ID,
		"state_hash": st.StateHash, "world_hash": ep.opened.Session.WorldHash, "done": ep.done, "reward": ep.rewardNow()}, nil
}

// ---- stateless HTTP ----

// httpState is OpenEnv's GET /state of a stateless server: no episode runs between requests.
func (o *OpenEnvRoutes) httpState(w http.ResponseWriter, _ *http.Request, _ *oeEnv) {
	writeJSON(w, http.StatusOK, map[string]any{"episode_id": nil, "step_count": 0})
}

// httpReset is POST /reset: a short episode of its own, its session opened and closed again (its id in the
// metadata: it can be read and graded with the workspace key).
func (o *OpenEnvRoutes) httpReset(w http.ResponseWriter, r *http.Request, e *oeEnv) {
	var data map[string]any
	if r.ContentLength != 0 {
		if err := json.NewDecoder(r.Body).Decode(&data); err != nil && err.Error() != "EOF" {
			WriteError(w, r, Invalid("body", "expected a JSON object: {seed, episode_id, options}"))
			return
		}
	}
	ep := &oeEpisode{routes: o, env: e}
	out, err := ep.reset(r.Context(), data, "body")
	ep.end(r.Context())
	if err != nil {
		WriteError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// httpStep is POST /step: a short episode of its own (reset with the request's extra fields, the action, closed).
func (o *OpenEnvRoutes) httpStep(w http.ResponseWriter, r *http.Request, e *oeEnv) {
	var body map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		WriteError(w, r, Invalid("body", "expected a JSON object: {action, timeout_s, request_id}"))
		return
	}
	raw, ok := body["action"]
	if !ok {
		WriteError(w, r, Invalid("body.action", "required"))
		return
	}
	a, err := parseAction(raw, "body.action")
	if err != nil {
		WriteError(w, r, err)
		return
	}
	ep := &oeEpisode{routes: o, env: e}
	ctx := r.Context()
	defer ep.end(ctx)
	if a.Type == "call_tool" {
		data := map[string]any{}
		for k, v := range body {
			if k == "action" || k == "timeout_s" || k == "request_id" {
				continue
			}
			var x any
			if err := json.Unmarshal(v, &x); err == nil {
				data[k] = x
			}
		}
		if _, err := ep.reset(ctx, data, "body"); err != nil {
			WriteError(w, r, err)
			return
		}
	}
	out, err := ep.step(ctx, a)
	if err != nil {
		WriteError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
