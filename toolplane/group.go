package toolplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/usage"
)

// DefaultMaxGroup is the most sessions one group open or group fork makes when Options.MaxGroup is not set.
const DefaultMaxGroup = 256

// MaxGroup is the most sessions one group open or group fork makes.
func (p *Plane) MaxGroup() int { return p.maxGroup }

// checkGroup refuses a group size outside 1…MaxGroup, naming field.
func (p *Plane) checkGroup(field string, n int) error {
	if n < 1 || n > p.maxGroup {
		return invalid(field, fmt.Sprintf("must be from 1 to %d (config session.max_group), not %d", p.maxGroup, n))
	}
	return nil
}

// admitGroup holds a group of n opens to the workspace's plan, all or none, before anything is opened: it answers
// the most sessions the workspace may have open at once (0: no cap), which the group's rows are written within.
func (p *Plane) admitGroup(ctx context.Context, workspaceID string, n int) (int, error) {
	if p.quota == nil {
		return 0, nil
	}
	maxOpen, err := p.quota.AdmitOpen(ctx, workspaceID)
	if err != nil {
		return 0, err
	}
	if maxOpen > 0 && n > 1 {
		open, err := store.OpenSessions(ctx, p.db, workspaceID)
		if err != nil {
			return 0, err
		}
		if open+n > maxOpen {
			return 0, usage.OpenLimit(open, maxOpen)
		}
	}
	return maxOpen, nil
}

// OpenGroup opens n identical worlds (one spec, one seed: the same world hash) as n sessions, each with its own
// id and token, answered in order. The first world opens through the session-open workflow as Open's does; the
// others are copy-on-write copies of it on the same twin. The workspace's plan admits all n or none, and the rows
// are written in one transaction: either every session opens or none does (the worlds made are dropped).
func (p *Plane) OpenGroup(ctx context.Context, req OpenRequest, n int) ([]*Opened, error) {
	if err := p.checkGroup("body.n", n); err != nil {
		return nil, err
	}
	pend, err := p.checkOpen(ctx, req)
	if err != nil {
		return nil, err
	}
	if p.opener == nil {
		return nil, errorf(Unavailable, "sessions cannot be opened: no workflow client configured")
	}
	if pend.MaxOpen, err = p.admitGroup(ctx, pend.WorkspaceID, n); err != nil {
		return nil, err
	}
	pend.World.SessionID = schema.NewID(schema.PrefixSession)
	res, err := p.opener.Open(ctx, pend.World)
	if err != nil {
		return nil, openError(err)
	}
	rc := res.Receipts
	receipts, err := json.Marshal(rc)
	if err != nil {
		return nil, err
	}
	w := pend.World
	buildID := res.BuildID
	if buildID == "" {
		buildID = pend.ActiveBuildID
	}
	ss := make([]*schema.Session, n)
	for i := range ss {
		ss[i] = &schema.Session{
			EnvID: w.EnvID, WorkspaceID: pend.WorkspaceID, BuildID: buildID, OpenedByKeyID: pend.KeyID,
			Seed: w.Spec.Seed, SeedInstructions: w.Spec.SeedInstructions, Scenario: w.Spec.Scenario,
			Clock: rc.Clock, RecordOutputs: pend.RecordOutputs, Seeded: rc.Seeded, SeedNote: deref(rc.Note),
			WorldHash: rc.WorldHash, StateHash: res.StateHash, Receipts: receipts, Faults: pend.Faults,
			Episode: pend.Episode, ExpiresAt: schema.Now().Add(p.idle),
		}
	}
	ss[0].ID = w.SessionID
	var te *twinEntry
	if n > 1 {
		if te, err = p.groupTwin(ctx, ss[0], res.TwinAddr); err != nil {
			p.DropWorld(context.WithoutCancel(ctx), ss[0])
			return nil, err
		}
	}
	zero := int64(0)
	for i := 1; i < n; i++ {
		ss[i].ID = schema.NewID(schema.PrefixSession)
		r, err := te.c.Fork(ctx, ss[0].ID, rpc.ForkRequest{ID: ss[i].ID, ExpectCalls: &zero})
		if err == nil && r.StateHash != res.StateHash {
			err = fmt.Errorf("world copy %d of %s hashes %s, not %s", i, ss[0].ID, r.StateHash, res.StateHash)
		}
		if err != nil {
			p.dropWorlds(ctx, ss[:i+1])
			return nil, twinError(err)
		}
	}
	env := &schema.Environment{ID: w.EnvID, WorkspaceID: pend.WorkspaceID, Slug: pend.EnvSlug}
	tokens, kick, err := p.createSessions(ctx, env, ss, pend.MaxOpen)
	if err != nil {
		p.dropWorlds(ctx, ss)
		return nil, groupRowError(err)
	}
	p.kick(kick)
	if rc.Pinned == nil {
		rc.Pinned = map[string][]string{}
	}
	out := make([]*Opened, n)
	p.mu.Lock()
	for i, s := range ss {
		p.live[s.ID] = &liveSession{calls: 0, lastUsed: s.CreatedAt}
		out[i] = &Opened{Session: s, Token: tokens[i], Receipts: rc, Env: pend.EnvSlug}
	}
	if te == nil && res.TwinAddr != "" && p.clients[buildID] == nil {
		p.clients[buildID] = &twinEntry{c: rpc.Dial(res.TwinAddr, p.hc, p.locals)}
	}
	p.mu.Unlock()
	return out, nil
}

// groupTwin is the twin that opened s's world: at addr when the open said where, else the build's as found.
func (p *Plane) groupTwin(ctx context.Context, s *schema.Session, addr string) (*twinEntry, error) {
	if addr != "" {
		te := &twinEntry{c: rpc.Dial(addr, p.hc, p.locals)}
		p.mu.Lock()
		if p.clients[s.BuildID] == nil {
			p.clients[s.BuildID] = te
		}
		p.mu.Unlock()
		return te, nil
	}
	l := p.liveOf(s.ID)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := p.loadBuild(ctx, s, l); err != nil {
		return nil, err
	}
	return p.twin(ctx, s, l, "")
}

// dropWorlds drops the worlds of sessions that were made on the twin but will not be recorded.
func (p *Plane) dropWorlds(ctx context.Context, ss []*schema.Session) {
	for _, s := range ss {
		if s.ID != "" {
			p.DropWorld(context.WithoutCancel(ctx), s)
		}
	}
}

// groupRowError is the answer to a group's rows that could not be written.
func groupRowError(err error) error {
	var over *store.OpenLimitError
	if errors.As(err, &over) {
		// Other opens took the places between the admission and the write.
		return usage.OpenLimit(over.Open, over.Limit)
	}
	return err
}

// createSessions stores a group's rows and, with events on, each one's session.opened event, in one transaction.
func (p *Plane) createSessions(ctx context.Context, env *schema.Environment, ss []*schema.Session, maxOpen int) (tokens, kick []string, err error) {
	if p.events == nil {
		tokens, err = store.CreateSessions(ctx, p.db, ss, maxOpen)
		return tokens, nil, err
	}
	err = p.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		var err error
		if tokens, err = store.CreateSessions(ctx, tx, ss, maxOpen); err != nil {
			return err
		}
		for _, s := range ss {
			seed, exp := s.Seed, s.ExpiresAt
			ev, err := store.NewEvent(s.WorkspaceID, events.SessionOpened, s.ID, "", events.SessionData{SessionID: s.ID,
				EnvID: env.ID, Env: env.Slug, BuildID: s.BuildID, Seed: &seed, WorldHash: s.WorldHash, ExpiresAt: &exp,
				ForkedFrom: s.ForkedFrom})
			if err != nil {
				return err
			}
			k, err := p.events.Record(ctx, tx, ev)
			if err != nil {
				return err
			}
			kick = append(kick, k...)
		}
		return nil
	})
	return tokens, kick, err
}
