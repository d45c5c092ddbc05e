package conformance

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/doppel-dev/doppel/conformance/oapi30"
)

// flowOapi30 runs the client oapi-codegen generated from the 3.0 document through envs → tools → open → call →
// read → transcript → close.
func flowOapi30(t *testing.T, d *doppel, slug string, hc *http.Client) {
	ctx := context.Background()
	bearer := func(tok string) oapi30.RequestEditorFn {
		return func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+tok)
			return nil
		}
	}
	key := bearer(d.key)
	c, err := oapi30.NewClientWithResponses(d.url, oapi30.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	envs, err := c.EnvsListWithResponse(ctx, key)
	if err != nil || envs.JSON200 == nil || len(*envs.JSON200) != 1 || (*envs.JSON200)[0].Slug != slug {
		t.Fatalf("envs.list: %v %v", envs, err)
	}
	for _, format := range []oapi30.EnvsToolsParamsFormat{"native", "openai", "openai-responses", "anthropic"} {
		tools, err := c.EnvsToolsWithResponse(ctx, slug, &oapi30.EnvsToolsParams{Format: &format}, key)
		if err != nil || tools.JSON200 == nil || len(*tools.JSON200) != 2 {
			t.Fatalf("envs.tools format=%s: %v %v", format, tools, err)
		}
		e := (*tools.JSON200)[1]
		var name, desc string
		if e.Function != nil {
			name, desc = e.Function.Name, e.Function.Description
		} else if e.Name != nil && e.Description != nil {
			name, desc = *e.Name, *e.Description
		}
		if name != "get_order_details" || desc != "Get an order's status and items." {
			t.Errorf("envs.tools format=%s: entry %q %q", format, name, desc)
		}
	}
	seed, record := int64(42), true
	open, err := c.SessionsOpenWithResponse(ctx, slug, oapi30.SessionsOpenJSONRequestBody{Seed: &seed, RecordOutputsA: &record}, key)
	if err != nil || open.JSON201 == nil {
		t.Fatalf("sessions.open: %v %v", open, err)
	}
	one, err := open.JSON201.AsOpenSessionBodyOut()
	if err != nil || !strings.HasPrefix(one.SessionId, "ses_") || one.SessionIdA != one.SessionId {
		t.Fatalf("sessions.open: %+v %v", one, err)
	}
	s := &one
	tok := bearer(s.SessionToken)
	call, err := c.SessionsCallWithResponse(ctx, s.SessionId, oapi30.SessionsCallJSONRequestBody{Name: "get_order_details",
		Arguments: map[string]any{"order_id": "#W0000001"}}, tok)
	if err != nil || call.JSON200 == nil || call.JSON200.Error || !strings.Contains(call.JSON200.Content, "#W0000001") {
		t.Fatalf("sessions.call: %v %v", call, err)
	}
	get, err := c.SessionsGetWithResponse(ctx, s.SessionId, tok)
	if err != nil || get.JSON200 == nil || get.JSON200.Id != s.SessionId || get.JSON200.NCalls != 1 {
		t.Fatalf("sessions.get: %v %v", get, err)
	}
	tr, err := c.SessionsTranscriptWithResponse(ctx, s.SessionId, nil, tok)
	if err != nil || tr.JSON200 == nil || tr.JSON200.Calls == nil || len(*tr.JSON200.Calls) != 1 || (*tr.JSON200.Calls)[0].Name != "get_order_details" {
		t.Fatalf("sessions.transcript: %v %v", tr, err)
	}
	closed, err := c.SessionsCloseWithResponse(ctx, s.SessionId, tok)
	if err != nil || closed.JSON200 == nil || !closed.JSON200.Existed {
		t.Fatalf("sessions.close: %v %v", closed, err)
	}
}
