package toolplane

import (
	"context"
	"errors"
	"strings"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
)

// Diff answers the entity-level change from against's world (nil: the session's opening world) to the session's
// world now, with the expectations that hold exactly for that end state. Sessions that ended are rebuilt from their
// journals for the comparison, so a grader can diff a run after closing it.
func (p *Plane) Diff(ctx context.Context, s, against *schema.Session) (*rpc.DiffResult, error) {
	var out rpc.DiffResult
	err := p.onWorlds(ctx, s, against, func(c *rpc.Client, id, other string) error {
		var err error
		out, err = c.Diff(ctx, id, rpc.DiffRequest{Against: other})
		return err
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Assert checks end-state expectations against the session's world now; the baseline of unchanged/changed is
// against's world, or the opening world when against is nil.
func (p *Plane) Assert(ctx context.Context, s, against *schema.Session, exps []twin.Expectation) (*rpc.AssertResult, error) {
	var out rpc.AssertResult
	err := p.onWorlds(ctx, s, against, func(c *rpc.Client, id, other string) error {
		var err error
		out, err = c.Assert(ctx, id, rpc.AssertRequest{Against: other, Expect: exps})
		return err
	})
	if errors.Is(err, rpc.ErrBadExpectation) {
		detail := twinDetail(err)
		if place, rest, ok := strings.Cut(detail, ": "); ok {
			return nil, invalid("body."+place, rest)
		}
		return nil, invalid("body.expect", detail)
	}
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// onWorlds runs fn on the twin that holds the worlds of s and against (nil: none), under the ids the twin knows them
// by. An open session the twin lost is rebuilt from its journal first; a session that ended is rebuilt under a
// temporary id, dropped after fn.
func (p *Plane) onWorlds(ctx context.Context, s, against *schema.Session, fn func(c *rpc.Client, id, other string) error) error {
	if against != nil && against.BuildID != s.BuildID {
		return invalid("body.against", "session "+against.ID+" runs build "+against.BuildID+", not "+s.BuildID+": worlds of different builds are not compared")
	}
	l := p.liveOf(s.ID)
	l.mu.Lock()
	err := p.loadBuild(ctx, s, l)
	var te *twinEntry
	if err == nil {
		te, err = p.twin(ctx, s, l, "")
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	id, done, err := p.hold(ctx, te.c, s)
	if err != nil {
		return err
	}
	defer done()
	other := ""
	if against != nil {
		var doneOther func()
		if other, doneOther, err = p.hold(ctx, te.c, against); err != nil {
			return err
		}
		defer doneOther()
	}
	if err := fn(te.c, id, other); err != nil {
		if errors.Is(err, rpc.ErrUnknownSession) {
			return errorf(NotReady, "the session's twin restarted meanwhile; retry")
		}
		if errors.Is(err, rpc.ErrBadExpectation) {
			return err
		}
		return twinError(err)
	}
	return nil
}

// hold makes sure the twin holds s's world and answers the id it holds it under, and what to do when done with it.
func (p *Plane) hold(ctx context.Context, tc *rpc.Client, s *schema.Session) (string, func(), error) {
	if s.Status == schema.SessionOpen {
		_, err := tc.Session(ctx, s.ID)
		if errors.Is(err, rpc.ErrUnknownSession) {
			l := p.liveOf(s.ID)
			l.mu.Lock()
			err = p.rebuild(ctx, tc, s, l)
			l.mu.Unlock()
		}
		if err != nil {
			return "", nil, twinError(err)
		}
		return s.ID, func() {}, nil
	}
	if s.Status == schema.SessionBroken {
		return "", nil, errorf(Conflict, "session %s is broken: its journal does not rebuild its world", s.ID)
	}
	journal, err := p.lineage(ctx, s, allCalls, 0)
	if err != nil {
		return "", nil, err
	}
	tmp := schema.NewID(schema.PrefixSession) + ".view"
	if _, err := tc.Open(ctx, rpc.OpenRequest{ID: tmp, Spec: specOf(s), Journal: journal}); err != nil {
		if errors.Is(err, rpc.ErrDiverged) {
			return "", nil, errorf(Conflict, "session %s's journal rebuilds another world: %s", s.ID, twinDetail(err))
		}
		return "", nil, twinError(err)
	}
	return tmp, func() { _, _ = tc.Close(context.WithoutCancel(ctx), tmp) }, nil
}
