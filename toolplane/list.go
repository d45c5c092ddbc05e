package toolplane

import (
	"context"

	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// Listed is a session as sessions.list shows it: its row, and what its journaled calls say (the journal is the
// record; the row's counters may lag it): its calls per fidelity label, and its last call (nil when it has none).
type Listed struct {
	Session schema.Session
	Counts  []journal.FidelityCount
	Last    *journal.SessionLastCall
}

// List lists an environment's sessions (of one status, or all when status is ""; at most limit, all when
// limit ≤ 0), newest first, after expiring the ones idle past their deadline so the listing says so at once (a
// call would). A missing environment is NotFound.
func (p *Plane) List(ctx context.Context, workspaceID, slug, status string, limit int) ([]Listed, error) {
	env, err := store.GetEnv(ctx, p.db, workspaceID, slug)
	if err != nil {
		return nil, notFoundOr(err, "environment "+slug)
	}
	if err := p.ExpireDue(ctx, env.ID, 0); err != nil {
		return nil, err
	}
	rows, err := store.ListSessions(ctx, p.db, env.ID, status, limit)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(rows))
	out := make([]Listed, len(rows))
	at := make(map[string]int, len(rows))
	for i := range rows {
		ids[i], out[i].Session, at[rows[i].ID] = rows[i].ID, rows[i], i
	}
	counts, last, err := journal.CountSessionsCalls(ctx, p.db, ids)
	if err != nil {
		return nil, err
	}
	for _, c := range counts {
		l := &out[at[c.SessionID]]
		l.Counts = append(l.Counts, c.FidelityCount)
	}
	for i := range last {
		out[at[last[i].SessionID]].Last = &last[i]
	}
	return out, nil
}

// Session answers a session of the workspace, whatever its status.
func (p *Plane) Session(ctx context.Context, workspaceID, id string) (*schema.Session, error) {
	s, err := store.GetSession(ctx, p.db, workspaceID, id)
	if err != nil {
		return nil, notFoundOr(err, "session "+id)
	}
	return s, nil
}
