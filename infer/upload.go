package infer

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/doppel-dev/doppel/twin"
)

// Upload is what the build route stores as one blob: everything a build takes besides the collected traces.
type Upload struct {
	// Tools are tool definitions in the native, OpenAI or Anthropic shape (see ParseToolDefs).
	Tools json.RawMessage `json:"tools,omitempty"`
	// Code maps a tool name to provided Starlark handler source.
	Code map[string]string `json:"code,omitempty"`
	// Config is the build configuration.
	Config *Config `json:"config,omitempty"`
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
