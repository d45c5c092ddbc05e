package toolplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/doppel-dev/doppel/journal"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// ForkRequest forks a session.
type ForkRequest struct {
	// KeyID is the key that forks (a workspace key or MCP token): the fork is then a session of that key's, which
	// outlives its parent and ends with the key. "" when the session's token forks: the fork is then the parent's
	// opener's too, and ends when its parent ends (spec §5.7: what a leaked session token derives never outlives
	// the session).
	KeyID string
	// AtCall forks the world as it was after this call (0: the opening world); nil forks it as it is now.
	AtCall *int64
}

// maxLineage bounds how deep forks of forks go.
const maxLineage = 256

// Fork opens a new session whose world is exactly parent's after call AtCall: its own token, its own journal and
// receipts, the parent's build, twin, seed, clock and fault plan. A fork is an opened session: the quota admits it
// as it does an open (the same 402s), it counts among the open sessions and is metered from its opening, and its
// session.opened event is recorded. Forking the parent as it is now copies its world
// copy-on-write on the twin; an earlier point (or a parent the twin no longer holds, or one that ended) is rebuilt
// from the parent's journal. The fork's journal refers to the parent's first AtCall calls instead of copying them,
// and its own calls are numbered from AtCall+1, so call N+1 of the fork is call N+1 of the episode. The parent is
// not changed.
func (p *Plane) Fork(ctx context.Context, parent *schema.Session, req ForkRequest) (*Opened, error) {
	out, err := p.forkN(ctx, parent, req, 1, "")
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// ForkGroup makes n forks of parent at once, as Fork makes one: each its own session with its own id and token,
// answered in order, each world copy-on-write on the twin. The workspace's plan admits all n or none (the open's
// 402), and the rows are written in one transaction: either every fork opens or none does.
func (p *Plane) ForkGroup(ctx context.Context, parent *schema.Session, req ForkRequest, n int) ([]*Opened, error) {
	return p.forkN(ctx, parent, req, n, "body.n")
}

func (p *Plane) forkN(ctx context.Context, parent *schema.Session, req ForkRequest, n int, nField string) ([]*Opened, error) {
	if nField != "" {
		if err := p.checkGroup(nField, n); err != nil {
			return nil, err
		}
	}
	if parent.Status == schema.SessionBroken {
		return nil, errorf(Conflict, "session %s is broken: its journal does not rebuild its world, so it cannot be forked", parent.ID)
	}
	l := p.liveOf(parent.ID)
	l.mu.Lock()
	defer l.mu.Unlock()
	last, err := p.lastSeq(ctx, parent)
	if err != nil {
		return nil, err
	}
	at := last
	if req.AtCall != nil {
		at = *req.AtCall
		if at < 0 || at > last {
			return nil, invalid("body.at_call", fmt.Sprintf("session %s holds %d calls: fork at 0 (its opening world) to %d", parent.ID, last, last))
		}
	}
	bound := req.KeyID == ""
	if bound && parent.Status != schema.SessionOpen {
		return nil, errorf(NotFound, "session %s is %s", parent.ID, parent.Status)
	}
	env, err := store.GetEnvByID(ctx, p.db, parent.EnvID)
	if err != nil {
		return nil, notFoundOr(err, "environment "+parent.EnvID)
	}
	// As an open is: before the twin forks anything, so a refused fork does nothing.
	maxOpen, err := p.admitGroup(ctx, parent.WorkspaceID, n)
	if err != nil {
		return nil, err
	}
	if err := p.loadBuild(ctx, parent, l); err != nil {
		return nil, err
	}
	te, err := p.twin(ctx, parent, l, "")
	if err != nil {
		return nil, err
	}
	keyID, rootKeyID := req.KeyID, "" // the store fills in the key's root
	if bound {
		keyID, rootKeyID = parent.OpenedByKeyID, parent.RootKeyID
	}
	ss := make([]*schema.Session, n)
	for i := range ss {
		ss[i] = &schema.Session{
			ID: schema.NewID(schema.PrefixSession), EnvID: parent.EnvID, WorkspaceID: parent.WorkspaceID,
			BuildID: parent.BuildID, OpenedByKeyID: keyID, RootKeyID: rootKeyID, EndsWithParent: bound,
			Seed: parent.Seed, SeedInstructions: parent.SeedInstructions, Scenario: parent.Scenario, Clock: parent.Clock,
			RecordOutputs: parent.RecordOutputs, Seeded: parent.Seeded, SeedNote: parent.SeedNote,
			WorldHash: parent.WorldHash, Receipts: parent.Receipts,
			ForkedFrom: parent.ID, ForkedAt: at, Faults: parent.Faults, Episode: parent.Episode,
			ExpiresAt: schema.Now().Add(p.idle),
		}
	}
	// The first fork copies the parent's world as it is now (or is rebuilt from the journal at an earlier point);
	// the others copy the parent's (or the first fork's) world, copy-on-write.
	var res rpc.OpenResponse
	from, fromCalls := parent.ID, last
	forked := false
	if parent.Status == schema.SessionOpen && at == last {
		res, err = te.c.Fork(ctx, parent.ID, rpc.ForkRequest{ID: ss[0].ID, ExpectCalls: &fromCalls})
		switch {
		case err == nil:
			forked = true
		case errors.Is(err, rpc.ErrUnknownSession), errors.Is(err, rpc.ErrCallsMismatch):
			// The twin lost the parent (restart) or is behind its journal: rebuild the fork from the journal.
		default:
			return nil, twinError(err)
		}
	}
	if !forked {
		journal, err := p.lineage(ctx, parent, at, 0)
		if err != nil {
			return nil, err
		}
		res, err = te.c.Open(ctx, rpc.OpenRequest{ID: ss[0].ID, Spec: specOf(parent), Journal: journal})
		if errors.Is(err, rpc.ErrDiverged) {
			return nil, errorf(Conflict, "session %s cannot be forked at call %d: its journal rebuilds another world (%s)", parent.ID, at, twinDetail(err))
		}
		if err != nil {
			return nil, twinError(err)
		}
		from, fromCalls = ss[0].ID, int64(len(journal))
	}
	ss[0].StateHash = res.StateHash
	for i := 1; i < n; i++ {
		r, err := te.c.Fork(ctx, from, rpc.ForkRequest{ID: ss[i].ID, ExpectCalls: &fromCalls})
		if err == nil && r.StateHash != res.StateHash {
			err = fmt.Errorf("fork %d of %s hashes %s, not %s", i, parent.ID, r.StateHash, res.StateHash)
		}
		if err != nil {
			p.dropWorlds(ctx, ss[:i+1])
			return nil, twinError(err)
		}
		ss[i].StateHash = r.StateHash
	}
	tokens, kick, err := p.createSessions(ctx, env, ss, maxOpen)
	if err != nil {
		p.dropWorlds(ctx, ss)
		return nil, groupRowError(err)
	}
	p.kick(kick)
	p.mu.Lock()
	for _, s := range ss {
		p.live[s.ID] = &liveSession{calls: at, lastUsed: s.CreatedAt, build: l.build}
	}
	p.mu.Unlock()
	if bound {
		// The parent may have ended (in another process) while these forks were made: then its end did not see
		// them, and they end now.
		cur, err := store.GetSessionByID(ctx, p.db, parent.ID)
		if err != nil {
			return nil, err
		}
		if cur.Status != schema.SessionOpen {
			for _, s := range ss {
				if err := p.end(context.WithoutCancel(ctx), s, endedWith(cur.Status)); err != nil {
					return nil, err
				}
			}
			return nil, errorf(NotFound, "session %s is %s", parent.ID, cur.Status)
		}
	}
	var rc rpc.Receipts
	if len(parent.Receipts) > 0 {
		if err := json.Unmarshal(parent.Receipts, &rc); err != nil {
			return nil, fmt.Errorf("receipts of session %s: %w", parent.ID, err)
		}
	}
	if rc.Pinned == nil {
		rc.Pinned = map[string][]string{}
	}
	out := make([]*Opened, n)
	for i, s := range ss {
		out[i] = &Opened{Session: s, Token: tokens[i], Receipts: rc, Env: env.Slug}
	}
	return out, nil
}

// twinError is a twin's refusal of a world operation as the answer.
func twinError(err error) error {
	if rpc.IsRetryable(err) {
		return errorf(NotReady, "the session's twin is starting; retry in a moment")
	}
	return err
}

// lastSeq is the seq of a session's last call: its own last, or for a fork with none of its own yet the call it was
// forked after.
func (p *Plane) lastSeq(ctx context.Context, s *schema.Session) (int64, error) {
	n, err := journal.LastSeq(ctx, p.db, s.ID)
	if err != nil {
		return 0, err
	}
	return max(n, s.ForkedAt), nil
}

// loadBuild reads the session's build once per live session.
func (p *Plane) loadBuild(ctx context.Context, s *schema.Session, l *liveSession) error {
	if l.build != nil {
		return nil
	}
	b, err := store.GetBuildByID(ctx, p.db, s.BuildID)
	if err != nil {
		return notFoundOr(err, "build "+s.BuildID)
	}
	l.build = b
	return nil
}

// allCalls asks lineage for every call.
const allCalls = -1

// lineage is the journal that rebuilds a session's world after its call upTo (allCalls: every call): for a fork,
// its parent's first ForkedAt calls (read through the parent, recursively), then its own.
func (p *Plane) lineage(ctx context.Context, s *schema.Session, upTo int64, depth int) ([]rpc.JournalEntry, error) {
	if depth > maxLineage {
		return nil, fmt.Errorf("session %s: forks nest deeper than %d", s.ID, maxLineage)
	}
	var out []rpc.JournalEntry
	if s.ForkedFrom != "" {
		parent, err := store.GetSessionByID(ctx, p.db, s.ForkedFrom)
		if err != nil {
			return nil, fmt.Errorf("session %s was forked from %s: %w", s.ID, s.ForkedFrom, err)
		}
		from := s.ForkedAt
		if upTo != allCalls {
			from = min(from, upTo)
		}
		if from > 0 {
			if out, err = p.lineage(ctx, parent, from, depth+1); err != nil {
				return nil, err
			}
		}
	}
	limit := 0
	if upTo != allCalls {
		if upTo <= s.ForkedAt {
			return out, nil
		}
		limit = int(upTo - s.ForkedAt)
	}
	calls, err := journal.ListCalls(ctx, p.db, s.ID, s.ForkedAt, limit)
	if err != nil {
		return nil, err
	}
	for _, c := range calls {
		out = append(out, entryOf(c))
	}
	return out, nil
}

// entryOf is a journaled call as the twin replays it.
func entryOf(c schema.Call) rpc.JournalEntry {
	return rpc.JournalEntry{Tool: c.Tool, Arguments: c.Arguments, Content: c.Content, Error: c.Error,
		Fidelity: c.Fidelity, Rung: c.Rung, StateHash: c.StateHash, Injected: injected(c.Fault)}
}
