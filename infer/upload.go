package infer

import (
	"encoding/json"
	"fmt"
	"maps"
	"sort"

	"github.com/doppel-dev/doppel/twin"
)

// Upload is an environment's build inputs, stored as one blob: everything a build takes besides the collected
// traces. The build route stores the environment's current inputs with the parts it was given replacing theirs
// (see With); every build, automatic rebuilds included, records the inputs it used.
type Upload struct {
	// Tools are tool definitions in the native, OpenAI or Anthropic shape (see ParseToolDefs).
	Tools json.RawMessage `json:"tools,omitempty"`
	// Code maps a tool name to provided Starlark handler source.
	Code map[string]string `json:"code,omitempty"`
	// Config is the build configuration.
	Config *Config `json:"config,omitempty"`
}

// With returns u with the parts next gives replacing u's: next's tool definitions replace all of u's, its config
// replaces u's config, and each of its code files replaces u's code for that tool. What next does not give is
// carried forward from u. Neither u nor next is changed.
func (u Upload) With(next Upload) Upload {
	out := Upload{Tools: u.Tools, Config: u.Config}
	if len(next.Tools) > 0 {
		out.Tools = next.Tools
	}
	if next.Config != nil {
		out.Config = next.Config
	}
	if len(u.Code)+len(next.Code) > 0 {
		out.Code = make(map[string]string, len(u.Code)+len(next.Code))
		maps.Copy(out.Code, u.Code)
		maps.Copy(out.Code, next.Code)
	}
	return out
}

// Options validates the upload and turns it into build options. Errors wrap ErrBadInput and name the field.
func (u *Upload) Options() (Options, error) {
	var o Options
	if len(u.Tools) > 0 {
		defs, err := ParseToolDefs(u.Tools) // its errors wrap ErrBadInput and name the field
		if err != nil {
			return o, err
		}
		o.Tools = defs
	}
	names := make([]string, 0, len(u.Code))
	for name := range u.Code {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := twin.CheckHandler(name, u.Code[name]); err != nil {
			return o, fmt.Errorf("%w: code.%s: %w", ErrBadInput, name, err)
		}
	}
	o.Code = u.Code
	if u.Config != nil {
		o.Config = *u.Config
	}
	if err := o.validate(); err != nil {
		return o, err
	}
	return o, nil
}
