package toolplane

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/faults"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/twin"
	"github.com/doppel-dev/doppel/twin/rpc"
	"github.com/doppel-dev/doppel/usage"
)

// OpenRequest opens a session on an environment.
type OpenRequest struct {
	WorkspaceID string
	// KeyID is the workspace key that opens the session (recorded as its opener).
	KeyID string
	Env   string // the environment's slug
	// Seed pins generated values; nil draws one.
	Seed             *int64
	SeedInstructions string
	Scenario         string
	// Clock fixes the world's time, RFC 3339; "" keeps the build's.
	Clock         string
	RecordOutputs bool
	// Faults is the session's fault plan (nil: none), checked against the build's tools and recorded errors.
	Faults faults.Spec
	// World overrides the build's world policy: "open", "closed" or "" (the build's). The effective policy is
	// kept in the receipts, so a rebuilt world has the same one.
	World string
	// Trace opens the world a recorded conversation saw (traceopen.go): used instead of seed instructions or a
	// scenario. The calls it used are kept in the receipts, so a rebuilt world is the same.
	Trace *TraceParam
	// Task, when set, opens the session as an episode (episode.go).
	Task *Task
}

// Opened is an open session: its row, its token (shown once) and its receipts.
type Opened struct {
	Session  *schema.Session
	Token    string
	Receipts rpc.Receipts
	Env      string // the environment's slug
}

// DrawSeed draws a fresh world seed: a JSON-safe integer.
func DrawSeed() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:]) & (1<<53 - 1))
}

// PendingOpen is a session open the plane has checked and admitted but not yet opened: the world to open and what
// recording the session needs. It is plain data, so a workflow can carry it from BeginOpen to FinishOpen while a
// child workflow opens the world.
type PendingOpen struct {
	World         OpenWorld
	WorkspaceID   string
	EnvSlug       string
	ActiveBuildID string
	KeyID         string
	RecordOutputs bool
	// Faults is the session's fault plan as JSON (nil: none).
	Faults json.RawMessage `json:",omitempty"`
	// Episode is the session's task as JSON (nil: not an episode).
	Episode json.RawMessage `json:",omitempty"`
	// MaxOpen is the most sessions the workspace may have open at once (0: no cap), held to as the row is written.
	MaxOpen int
}

// Open opens an isolated world on the environment's twin (waking it when stopped) through the session-open
// workflow, and mints the session's token.
func (p *Plane) Open(ctx context.Context, req OpenRequest) (*Opened, error) {
	pend, err := p.checkOpen(ctx, req)
	if err != nil {
		return nil, err
	}
	if p.opener == nil {
		return nil, errorf(Unavailable, "sessions cannot be opened: no workflow client configured")
	}
	if err := p.admitOpen(ctx, pend); err != nil {
		return nil, err
	}
	res, err := p.opener.Open(ctx, pend.World)
	if err != nil {
		return nil, openError(err)
	}
	return p.FinishOpen(ctx, pend, res)
}

// BeginOpen checks and admits an open as Open does, without opening its world: the caller opens pend.World (a
// query's workflow does, with a child session-open workflow) and records the session with FinishOpen.
func (p *Plane) BeginOpen(ctx context.Context, req OpenRequest) (*PendingOpen, error) {
	pend, err := p.checkOpen(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := p.admitOpen(ctx, pend); err != nil {
		return nil, err
	}
	return pend, nil
}

// checkOpen checks an open's request against the environment and its active build, and draws its seed when none
// is given.
func (p *Plane) checkOpen(ctx context.Context, req OpenRequest) (*PendingOpen, error) {
	spec := rpc.SessionSpec{SeedInstructions: req.SeedInstructions}
	switch req.World {
	case "", twin.WorldOpen, twin.WorldClosed:
		spec.World = req.World
	default:
		return nil, invalid("body.world", fmt.Sprintf("must be %q or %q", twin.WorldOpen, twin.WorldClosed))
	}
	if req.Scenario != "" {
		if strings.TrimSpace(req.SeedInstructions) != "" {
			return nil, invalid("body.scenario", "a scenario is used instead of seed instructions: give one or the other")
		}
		spec.Scenario = req.Scenario
	}
	if req.Trace != nil && (strings.TrimSpace(req.SeedInstructions) != "" || req.Scenario != "") {
		return nil, invalid("body.trace", "a trace is used instead of seed instructions or a scenario: give one or the other")
	}
	if req.Clock != "" {
		t, err := time.Parse(time.RFC3339Nano, req.Clock)
		if err != nil {
			return nil, invalid("body.clock", "expected an RFC 3339 time such as 2025-03-01T09:00:00Z")
		}
		spec.Clock = t.UTC().Format(time.RFC3339Nano)
	}
	if req.Seed != nil {
		spec.Seed = *req.Seed
	} else {
		spec.Seed = DrawSeed()
	}

	env, err := store.GetEnv(ctx, p.db, req.WorkspaceID, req.Env)
	if err != nil {
		return nil, notFoundOr(err, "environment "+req.Env)
	}
	if env.ActiveBuildID == "" {
		return nil, errorf(NotReady, "environment %s has no build yet (status %s)", env.Slug, env.Status)
	}
	if req.Trace != nil {
		if spec.Trace, err = p.traceSpec(ctx, env.ID, env.Slug, req.Trace); err != nil {
			return nil, err
		}
	}
	pend := &PendingOpen{World: OpenWorld{EnvID: env.ID, Spec: spec, WorkspaceID: env.WorkspaceID, BuildID: env.ActiveBuildID},
		WorkspaceID: env.WorkspaceID, EnvSlug: env.Slug,
		ActiveBuildID: env.ActiveBuildID, KeyID: req.KeyID, RecordOutputs: req.RecordOutputs}
	if req.Task != nil {
		if pend.Episode, err = p.episodeOf(ctx, env.ActiveBuildID, req.Task); err != nil {
			return nil, err
		}
	}
	if len(req.Faults) > 0 {
		build, err := store.GetBuildByID(ctx, p.db, env.ActiveBuildID)
		if err != nil {
			return nil, notFoundOr(err, "build "+env.ActiveBuildID)
		}
		if err := p.checkFaults(ctx, req.Faults, build); err != nil {
			return nil, err
		}
		if pend.Faults, err = json.Marshal(req.Faults); err != nil {
			return nil, err
		}
	}
	return pend, nil
}

// admitOpen holds the open to the workspace's plan and names its session.
func (p *Plane) admitOpen(ctx context.Context, pend *PendingOpen) error {
	if p.quota != nil {
		// Before the twin is woken or a world seeded: a refused open does nothing.
		maxOpen, err := p.quota.AdmitOpen(ctx, pend.WorkspaceID)
		if err != nil {
			return err
		}
		pend.MaxOpen = maxOpen
	}
	pend.World.SessionID = schema.NewID(schema.PrefixSession)
	return nil
}

// FinishOpen records the session whose world res is: its row (and session.opened event) and its token. When the
// row cannot be written, the world is dropped.
func (p *Plane) FinishOpen(ctx context.Context, pend *PendingOpen, res OpenedWorld) (*Opened, error) {
	rc := res.Receipts
	receipts, err := json.Marshal(rc)
	if err != nil {
		return nil, err
	}
	w := pend.World
	s := &schema.Session{
		ID: w.SessionID, EnvID: w.EnvID, WorkspaceID: pend.WorkspaceID, BuildID: res.BuildID, OpenedByKeyID: pend.KeyID,
		Seed: w.Spec.Seed, SeedInstructions: w.Spec.SeedInstructions, Scenario: w.Spec.Scenario,
		Clock: rc.Clock, RecordOutputs: pend.RecordOutputs, Seeded: rc.Seeded, SeedNote: deref(rc.Note),
		WorldHash: rc.WorldHash, StateHash: res.StateHash, Receipts: receipts, Faults: pend.Faults,
		Episode: pend.Episode, ExpiresAt: schema.Now().Add(p.idle),
	}
	if s.BuildID == "" {
		s.BuildID = pend.ActiveBuildID
	}
	env := &schema.Environment{ID: w.EnvID, WorkspaceID: pend.WorkspaceID, Slug: pend.EnvSlug}
	token, kick, err := p.createSession(ctx, env, s, pend.MaxOpen)
	if err != nil {
		// The world exists on the twin but no row does: drop it.
		p.DropWorld(context.WithoutCancel(ctx), s)
		var over *store.OpenLimitError
		if errors.As(err, &over) {
			// Another open took the last place between the admission and the write.
			return nil, usage.OpenLimit(over.Open, over.Limit)
		}
		return nil, err
	}
	p.mu.Lock()
	p.live[s.ID] = &liveSession{calls: 0, lastUsed: s.CreatedAt}
	if res.TwinAddr != "" && p.clients[s.BuildID] == nil {
		p.clients[s.BuildID] = &twinEntry{c: rpc.Dial(res.TwinAddr, p.hc, p.locals)}
	}
	p.mu.Unlock()
	p.kick(kick)
	if rc.Pinned == nil {
		rc.Pinned = map[string][]string{}
	}
	return &Opened{Session: s, Token: token, Receipts: rc, Env: pend.EnvSlug}, nil
}

// createSession stores the session row and, with events on, its session.opened event in the same transaction.
func (p *Plane) createSession(ctx context.Context, env *schema.Environment, s *schema.Session, maxOpen int) (token string, kick []string, err error) {
	if p.events == nil {
		token, err = store.CreateSessionWithin(ctx, p.db, s, maxOpen)
		return token, nil, err
	}
	err = p.db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		var err error
		if token, err = store.CreateSessionWithin(ctx, tx, s, maxOpen); err != nil {
			return err
		}
		seed, exp := s.Seed, s.ExpiresAt
		ev, err := store.NewEvent(s.WorkspaceID, events.SessionOpened, s.ID, "", events.SessionData{SessionID: s.ID,
			EnvID: env.ID, Env: env.Slug, BuildID: s.BuildID, Seed: &seed, WorldHash: s.WorldHash, ExpiresAt: &exp,
			ForkedFrom: s.ForkedFrom})
		if err != nil {
			return err
		}
		kick, err = p.events.Record(ctx, tx, ev)
		return err
	})
	return token, kick, err
}

// kick starts the deliveries of events a committed change recorded (none with events off).
func (p *Plane) kick(ids []string) {
	if p.events != nil {
		p.events.Kick(ids)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// SpecRefusal is the refusal of a session spec the twin refused for reason msg: Invalid naming the field msg names
// (body.scenario, body.clock, body.seed_instructions, body.seed or body.trace), else the body.
func SpecRefusal(msg string) *Error {
	for _, f := range []string{"scenario", "clock", "seed_instructions", "seed", "trace"} {
		if i := strings.Index(msg, f+":"); i >= 0 {
			return invalid("body."+f, strings.TrimSpace(msg[i+len(f)+1:]))
		}
	}
	return invalid("body", msg)
}

// openError is a failed open's answer: the opener's refusals pass unchanged, the rest is an internal error.
func openError(err error) error {
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	return fmt.Errorf("open session: %w", err)
}
