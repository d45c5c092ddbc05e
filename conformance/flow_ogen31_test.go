package conformance

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/go-faster/jx"
	"github.com/ogen-go/ogen/ogenerrors"

	"github.com/doppel-dev/doppel/conformance/ogen31"
)

// ogen31Keys answers ogen31's security source: the session token once a session is open, else the workspace key.
type ogen31Keys struct{ key, token string }

func (k *ogen31Keys) WorkspaceKey(context.Context, ogen31.OperationName) (ogen31.WorkspaceKey, error) {
	return ogen31.WorkspaceKey{Token: k.key}, nil
}

func (k *ogen31Keys) SessionToken(context.Context, ogen31.OperationName) (ogen31.SessionToken, error) {
	if k.token == "" {
		return ogen31.SessionToken{}, ogenerrors.ErrSkipClientSecurity
	}
	return ogen31.SessionToken{Token: k.token}, nil
}

func (k *ogen31Keys) AdminKey(context.Context, ogen31.OperationName) (ogen31.AdminKey, error) {
	return ogen31.AdminKey{}, ogenerrors.ErrSkipClientSecurity
}

// flowOgen31 runs the client ogen generated from the 3.1 document through envs → tools → open → call → read →
// transcript → close.
func flowOgen31(t *testing.T, d *doppel, slug string, hc *http.Client) {
	ctx := context.Background()
	keys := &ogen31Keys{key: d.key}
	c, err := ogen31.NewClient(d.url, keys, ogen31.WithClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	envs, err := c.EnvsList(ctx)
	list, ok := envs.(*ogen31.EnvsListOKApplicationJSON)
	if err != nil || !ok || len(*list) != 1 || (*list)[0].Slug != slug {
		t.Fatalf("envs.list: %#v %v", envs, err)
	}
	for _, format := range []ogen31.EnvsToolsFormat{"native", "openai", "openai-responses", "anthropic"} {
		tools, err := c.EnvsTools(ctx, ogen31.EnvsToolsParams{Slug: slug, Format: ogen31.NewOptEnvsToolsFormat(format)})
		entries, ok := tools.(*ogen31.EnvsToolsOKApplicationJSON)
		if err != nil || !ok || len(*entries) != 2 {
			t.Fatalf("envs.tools format=%s: %#v %v", format, tools, err)
		}
		e := (*entries)[1]
		name, desc := e.Name.Value, e.Description.Value
		if fn, ok := e.Function.Get(); ok {
			name, desc = fn.Name, fn.Description
		}
		if name != "get_order_details" || desc != "Get an order's status and items." {
			t.Errorf("envs.tools format=%s: entry %q %q", format, name, desc)
		}
	}
	open, err := c.SessionsOpen(ctx, ogen31.NewOptOpenSessionBody(ogen31.OpenSessionBody{
		Seed: ogen31.NewOptInt64(42), RecordOutputsA: ogen31.NewOptBool(true)}), ogen31.SessionsOpenParams{Slug: slug})
	created, ok := open.(*ogen31.SessionsOpenCreated)
	if err != nil || !ok {
		t.Fatalf("sessions.open: %#v %v", open, err)
	}
	one, ok := created.GetOpenSessionBodyOut()
	s := &one
	if !ok || !strings.HasPrefix(s.SessionId, "ses_") || s.SessionIdA != s.SessionId || s.Seed != 42 {
		t.Fatalf("sessions.open: %#v %v", open, err)
	}
	keys.token = s.SessionToken
	args := ogen31.CallBodyArguments{"order_id": jx.Raw(`"#W0000001"`)}
	called, err := c.SessionsCall(ctx, &ogen31.CallBody{Name: "get_order_details", Arguments: args}, ogen31.SessionsCallParams{SessionID: s.SessionId})
	res, ok := called.(*ogen31.CallResultHeaders)
	if err != nil || !ok || res.Response.Error || !strings.Contains(res.Response.Content, "#W0000001") {
		t.Fatalf("sessions.call: %#v %v", called, err)
	}
	got, err := c.SessionsGet(ctx, ogen31.SessionsGetParams{SessionID: s.SessionId})
	view, ok := got.(*ogen31.SessionView)
	if err != nil || !ok || view.ID != s.SessionId || view.NCalls != 1 {
		t.Fatalf("sessions.get: %#v %v", got, err)
	}
	tr, err := c.SessionsTranscript(ctx, ogen31.SessionsTranscriptParams{SessionID: s.SessionId})
	body, ok := tr.(*ogen31.TranscriptBody)
	if err != nil || !ok || len(body.Calls) != 1 || body.Calls[0].Name != "get_order_details" || !body.Calls[0].Result.Set {
		t.Fatalf("sessions.transcript: %#v %v", tr, err)
	}
	closed, err := c.SessionsClose(ctx, ogen31.SessionsCloseParams{SessionID: s.SessionId})
	if out, ok := closed.(*ogen31.CloseOutputBody); err != nil || !ok || !out.Existed {
		t.Fatalf("sessions.close: %#v %v", closed, err)
	}
}
