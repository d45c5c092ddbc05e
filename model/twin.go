package model

import (
	"context"

	"github.com/doppel-dev/doppel/twin"
)

// TwinSimulator serves the twin's simulate rung (twin.Simulator) with the model. The twin keeps its own
// answer cache per (state hash, tool, canonical arguments) and replays journaled answers on rebuild, so
// this adapter asks the model every time it is called; it validates the answer against the tool's output
// schema (one retry with the reason, then an error) and returns its text. An answer the model marks as an
// error is returned so that it reads as one (twin.IsErrorText), so the twin labels it error: true.
type TwinSimulator struct {
	S *Simulator
}

var _ twin.Simulator = TwinSimulator{}

// Simulate implements twin.Simulator.
func (t TwinSimulator) Simulate(ctx context.Context, req twin.SimRequest) (string, error) {
	r := SimRequest{
		Tool:         req.Tool,
		Description:  req.Description,
		InputSchema:  req.InputSchema,
		OutputSchema: req.OutputSchema,
		Rows:         req.Rows,
		Arguments:    req.Args,
	}
	for _, e := range req.Examples {
		r.Examples = append(r.Examples, Example{Arguments: e.Args, Content: e.Answer, Error: twin.IsErrorText(e.Answer)})
	}
	a, err := t.S.ask(ctx, r)
	if err != nil {
		return "", err
	}
	if a.Error && !twin.IsErrorText(a.Content) {
		return "Error: " + a.Content, nil
	}
	return a.Content, nil
}
