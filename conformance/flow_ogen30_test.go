package conformance

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/go-faster/jx"
	"github.com/ogen-go/ogen/ogenerrors"

	"github.com/doppel-dev/doppel/conformance/ogen30"
)

// ogen30Keys answers ogen30's security source: the session token once a session is open, else the workspace key.
type ogen30Keys struct{ key, token string }

func (k *ogen30Keys) WorkspaceKey(context.Context, ogen30.OperationName) (ogen30.WorkspaceKey, error) {
	return ogen30.WorkspaceKey{Token: k.key}, nil
}

func (k *ogen30Keys) SessionToken(context.Context, ogen30.OperationName) (ogen30.SessionToken, error) {
	if k.token == "" {
		return ogen30.SessionToken{}, ogenerrors.ErrSkipClientSecurity
	}
	return ogen30.SessionToken{Token: k.token}, nil
}

func (k *ogen30Keys) AdminKey(context.Context, ogen30.OperationName) (ogen30.AdminKey, error) {
	return ogen30.AdminKey{}, ogenerrors.ErrSkipClientSecurity
}

// flowOgen30 runs the client ogen generated from the 3.0 document through envs → tools → open → call → read →
// transcript → close.
func flowOgen30(t *testing.T, d *doppel, slug string, hc *http.Client) {
	ctx := context.Background()
	keys := &ogen30Keys{key: d.key}
	c, err := ogen30.NewClient(d.url, keys, ogen30.WithClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	envs, err := c.EnvsList(ctx)
	list, ok := envs.(*ogen30.EnvsListOKApplicationJSON)
	if err != nil || !ok || len(*list) != 1 || (*list)[0].Slug != slug {
		t.Fatalf("envs.list: %#v %v", envs, err)
	}
	for _, format := range []ogen30.EnvsToolsFormat{"native", "openai", "openai-responses", "anthropic"} {
		tools, err := c.EnvsTools(ctx, ogen30.EnvsToolsParams{Slug: slug, Format: ogen30.NewOptEnvsToolsFormat(format)})
		entries, ok := tools.(*ogen30.EnvsToolsOKApplicationJSON)
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
	open, err := c.SessionsOpen(ctx, ogen30.NewOptOpenSessionBody(ogen30.OpenSessionBody{
		Seed: ogen30.NewOptInt64(42), RecordOutputsA: ogen30.NewOptBool(true)}), ogen30.SessionsOpenParams{Slug: slug})
	created, ok := open.(*ogen30.SessionsOpenCreated)
	if err != nil || !ok {
		t.Fatalf("sessions.open: %#v %v", open, err)
	}
	one, ok := created.GetOpenSessionBodyOut()
	s := &one
	if !ok || !strings.HasPrefix(s.SessionId, "ses_") || s.SessionIdA != s.SessionId || s.Seed != 42 {
		t.Fatalf("sessions.open: %#v %v", open, err)
	}
	keys.token = s.SessionToken
	args := ogen30.CallBodyArguments{"order_id": jx.Raw(`"#W0000001"`)}
	called, err := c.SessionsCall(ctx, &ogen30.CallBody{Name: "get_order_details", Arguments: args}, ogen30.SessionsCallParams{SessionID: s.SessionId})
	res, ok := called.(*ogen30.CallResultHeaders)
	if err != nil || !ok || res.Response.Error || !strings.Contains(res.Response.Content, "#W0000001") {
		t.Fatalf("sessions.call: %#v %v", called, err)
	}
	got, err := c.SessionsGet(ctx, ogen30.SessionsGetParams{SessionID: s.SessionId})
	view, ok := got.(*ogen30.SessionView)
	if err != nil || !ok || view.ID != s.SessionId || view.NCalls != 1 {
		t.Fatalf("sessions.get: %#v %v", got, err)
	}
	tr, err := c.SessionsTranscript(ctx, ogen30.SessionsTranscriptParams{SessionID: s.SessionId})
	body, ok := tr.(*ogen30.TranscriptBody)
	if err != nil || !ok || len(body.Calls) != 1 || body.Calls[0].Name != "get_order_details" || !body.Calls[0].Result.Set {
		t.Fatalf("sessions.transcript: %#v %v", tr, err)
	}
	closed, err := c.SessionsClose(ctx, ogen30.SessionsCloseParams{SessionID: s.SessionId})
	if out, ok := closed.(*ogen30.CloseOutputBody); err != nil || !ok || !out.Existed {
		t.Fatalf("sessions.close: %#v %v", closed, err)
	}
}
