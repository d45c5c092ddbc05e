package store

import (
	"context"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/schema"
)

// CreateQuery inserts a running query. The caller sets ID, WorkspaceID, EnvID and the request fields; Status and
// CreatedAt are filled in.
func CreateQuery(ctx context.Context, db bun.IDB, q *schema.Query) error {
	q.Status = schema.QueryRunning
	q.CreatedAt = now()
	q.FinishedAt = nil
	if _, err := db.NewInsert().Model(q).Exec(ctx); err != nil {
		return wrap(err, "create query %q", q.ID)
	}
	return nil
}

// GetQuery returns a workspace's query; another workspace's query is ErrNotFound.
func GetQuery(ctx context.Context, db bun.IDB, workspaceID, id string) (*schema.Query, error) {
	q := new(schema.Query)
	if err := db.NewSelect().Model(q).Where("id = ? AND workspace_id = ?", id, workspaceID).Scan(ctx); err != nil {
		return nil, wrap(err, "get query %q", id)
	}
	return q, nil
}

// QueryOutcome is how a query ended: its result (succeeded) or its error (failed), and the model's usage.
type QueryOutcome struct {
	Status           string
	SessionID        string
	Result           []byte
	Error, ErrorKind string
	ModelCalls       int64
	PromptTokens     int64
	CompletionTokens int64
}

// FinishQuery records a query's outcome. Finishing it again (a retried activity) rewrites the same outcome.
func FinishQuery(ctx context.Context, db bun.IDB, id string, o QueryOutcome) error {
	t := now()
	res, err := db.NewUpdate().Model((*schema.Query)(nil)).
		Set("status = ?", o.Status).Set("session_id = ?", o.SessionID).Set("result = ?", nullJSON(o.Result)).
		Set("error = ?", o.Error).Set("error_kind = ?", o.ErrorKind).Set("model_calls = ?", o.ModelCalls).
		Set("prompt_tokens = ?", o.PromptTokens).Set("completion_tokens = ?", o.CompletionTokens).
		Set("finished_at = ?", t).Where("id = ?", id).Exec(ctx)
	if err != nil {
		return wrap(err, "finish query %q", id)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return wrap(ErrNotFound, "finish query %q", id)
	}
	return nil
}

func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}
