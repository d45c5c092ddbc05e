package usage

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
)

// LimitError refuses work that a meter over its hard limit does not allow (an HTTP 402).
type LimitError struct {
	Meter       string
	Used, Limit float64
	Unit        string
	// CardWouldLift says a card on file would lift the limit.
	CardWouldLift bool
}

func (e *LimitError) Error() string {
	s := fmt.Sprintf("the %s meter is at %g of its limit of %g %s this period", e.Meter, e.Used, e.Limit, e.Unit)
	if e.Meter == MeterOpenSessions {
		s = fmt.Sprintf("%g sessions are open, the most this workspace's plan allows at once is %g: close one first", e.Used, e.Limit)
	}
	if e.CardWouldLift {
		s += "; a card on file would lift it"
	}
	return s
}

// DefaultRefresh is how stale a gate's reading of a workspace may grow before it is read again.
const DefaultRefresh = time.Second

// Gate holds workspaces to their plans before work starts: a session open, a tool call. It decides from a
// reading of the durable records at most Refresh old, read again in the background; between readings the open
// sessions' time is extrapolated and this process's calls are added, so a runaway loop is stopped within one
// Refresh of crossing a limit. What is billed is never the gate's figure: it is Source.Read's.
type Gate struct {
	Source  *Source
	Refresh time.Duration
	// Now is the clock (default schema.Now).
	Now func() time.Time
	// Thresholds, when set, is told when a reading finds a period meter at 80% or 100% of its limit.
	Thresholds ThresholdSink

	mu    sync.Mutex
	snaps map[string]*snapshot
	told  map[string]bool // thresholds the sink took, by its key: not offered again by this process
}

// ThresholdSink records that a workspace's period meter reached percent (80 or 100) of its limit. It must record
// each (workspace, period, meter, percent) once however often it is told (the gate tells it again after a
// restart), e.g. by a dedup key.
type ThresholdSink interface {
	Threshold(ctx context.Context, ws *schema.Workspace, r *Reading, m Value, percent int) error
}

// thresholdMeters are the meters whose thresholds are reported: the period's consumption, not the quota of open
// sessions or the per-environment byte caps.
var thresholdMeters = []string{MeterTaskMinutes, MeterToolCalls, MeterQueries, MeterModelTokens}

// ThresholdKey names one threshold of one period: the dedup key of its event.
func ThresholdKey(workspaceID string, periodStart time.Time, meter string, percent int) string {
	return fmt.Sprintf("usage.threshold/%s/%s/%s/%d", workspaceID, periodStart.UTC().Format(time.RFC3339), meter, percent)
}

// thresholds offers the sink every threshold r shows reached that this process has not offered yet.
func (g *Gate) thresholds(ctx context.Context, ws *schema.Workspace, r *Reading) {
	if g.Thresholds == nil {
		return
	}
	for _, name := range thresholdMeters {
		m, ok := r.Meter(name, "")
		if !ok || m.Limit <= 0 {
			continue
		}
		for _, pct := range []int{80, 100} {
			if m.Used*100 < m.Limit*float64(pct) {
				continue
			}
			key := ThresholdKey(ws.ID, r.Start, name, pct)
			g.mu.Lock()
			done := g.told[key]
			g.mu.Unlock()
			if done {
				continue
			}
			if err := g.Thresholds.Threshold(ctx, ws, r, m, pct); err != nil {
				continue // offered again at the next reading
			}
			g.mu.Lock()
			if g.told == nil {
				g.told = map[string]bool{}
			}
			g.told[key] = true
			g.mu.Unlock()
		}
	}
}

type snapshot struct {
	ws         *schema.Workspace
	r          *Reading
	localCalls int64 // calls this process answered since r was read
	refreshing bool
}

func (g *Gate) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return schema.Now()
}

func (g *Gate) refresh() time.Duration {
	if g.Refresh > 0 {
		return g.Refresh
	}
	return DefaultRefresh
}

// read reads a workspace and its usage afresh.
func (g *Gate) read(ctx context.Context, workspaceID string) (*schema.Workspace, *Reading, error) {
	ws, err := store.GetWorkspace(ctx, g.Source.DB, workspaceID)
	if err != nil {
		return nil, nil, fmt.Errorf("usage: %w", err)
	}
	now := g.now()
	if _, plan := g.Source.Plans.Of(ws); plan.TaskMinutes <= 0 && plan.ToolCalls <= 0 && plan.Queries <= 0 && plan.ModelTokens <= 0 {
		return ws, &Reading{At: now}, nil // no period limit to hold it to: the workspace row is all the gate needs
	}
	r, err := g.Source.Read(ctx, ws, now)
	if err != nil {
		return nil, nil, err
	}
	g.thresholds(ctx, ws, r)
	return ws, r, nil
}

// current returns the workspace's snapshot, reading it when there is none and starting a background read when it
// is stale. The returned values must not be changed.
func (g *Gate) current(ctx context.Context, workspaceID string) (*schema.Workspace, *Reading, int64, error) {
	g.mu.Lock()
	if g.snaps == nil {
		g.snaps = map[string]*snapshot{}
	}
	s := g.snaps[workspaceID]
	if s != nil {
		if !s.refreshing && g.now().Sub(s.r.At) >= g.refresh() {
			s.refreshing = true
			go g.reread(workspaceID, s.localCalls)
		}
		ws, r, local := s.ws, s.r, s.localCalls
		g.mu.Unlock()
		return ws, r, local, nil
	}
	g.mu.Unlock()
	ws, r, err := g.read(ctx, workspaceID)
	if err != nil {
		return nil, nil, 0, err
	}
	g.mu.Lock()
	if g.snaps[workspaceID] == nil {
		g.snaps[workspaceID] = &snapshot{ws: ws, r: r}
	}
	g.mu.Unlock()
	return ws, r, 0, nil
}

// reread replaces a stale snapshot; calls counted locally before the read began are in the records it read.
func (g *Gate) reread(workspaceID string, localBefore int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, r, err := g.read(ctx, workspaceID)
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.snaps[workspaceID]
	if s == nil {
		return
	}
	s.refreshing = false
	if err != nil {
		return // keep the stale reading; the next check tries again
	}
	s.ws, s.r = ws, r
	s.localCalls -= localBefore
}

// Forget drops a workspace's snapshot, so the next check reads it afresh (after an admin changes its plan).
func (g *Gate) Forget(workspaceID string) {
	g.mu.Lock()
	delete(g.snaps, workspaceID)
	g.mu.Unlock()
}

// check refuses when any of meters is at or over its limit.
func (g *Gate) check(ws *schema.Workspace, r *Reading, local int64, meters ...string) error {
	_, plan := g.Source.Plans.Of(ws)
	lifted := plan.CardLifts && ws.CardOnFile
	for _, m := range meters {
		limit := plan.limit(m)
		if limit <= 0 || lifted {
			continue
		}
		var used float64
		unit := ""
		switch m {
		case MeterTaskMinutes:
			secs := r.TaskSeconds
			if el := g.now().Sub(r.At); el > 0 {
				secs += r.openSessions * int64((el+time.Second-1)/time.Second)
			}
			used, unit = float64(secs)/60, "minutes"
		case MeterToolCalls:
			used, unit = float64(r.calls+local), "calls"
		case MeterQueries:
			used, unit = float64(r.queries.Queries), "queries"
		case MeterModelTokens:
			used, unit = float64(r.queries.Tokens), "tokens"
		default:
			continue
		}
		if used >= float64(limit) {
			return &LimitError{Meter: m, Used: used, Limit: float64(limit), Unit: unit, CardWouldLift: plan.CardLifts}
		}
	}
	return nil
}

// AdmitCall answers nil when a tool call in a session of workspaceID may run: task-minutes and tool calls are
// under their limits.
func (g *Gate) AdmitCall(ctx context.Context, workspaceID string) error {
	ws, r, local, err := g.current(ctx, workspaceID)
	if err != nil {
		return err
	}
	return g.check(ws, r, local, MeterTaskMinutes, MeterToolCalls)
}

// AdmitQuery answers nil when workspaceID may start a one-shot query: task-minutes (its session's open time is
// billed as any session's), queries and model tokens are under their limits. Queries are counted from their rows,
// read at most the gate's refresh time ago.
func (g *Gate) AdmitQuery(ctx context.Context, workspaceID string) error {
	ws, r, local, err := g.current(ctx, workspaceID)
	if err != nil {
		return err
	}
	return g.check(ws, r, local, MeterTaskMinutes, MeterQueries, MeterModelTokens)
}

// Called counts a call this process answered, until the next reading holds it.
func (g *Gate) Called(workspaceID string) {
	g.mu.Lock()
	if s := g.snaps[workspaceID]; s != nil {
		s.localCalls++
	}
	g.mu.Unlock()
}

// AdmitOpen answers nil when workspaceID may open a session, with the most sessions it may have open at once (0:
// no cap), which the open must hold to atomically as it writes the session (store.CreateSessionWithin). The open
// count is read exactly here, so a session closed a moment ago frees its place at once.
func (g *Gate) AdmitOpen(ctx context.Context, workspaceID string) (int, error) {
	ws, r, local, err := g.current(ctx, workspaceID)
	if err != nil {
		return 0, err
	}
	if err := g.check(ws, r, local, MeterTaskMinutes, MeterToolCalls); err != nil {
		return 0, err
	}
	_, plan := g.Source.Plans.Of(ws)
	if plan.OpenSessions <= 0 {
		return 0, nil
	}
	open, err := store.OpenSessions(ctx, g.Source.DB, workspaceID)
	if err != nil {
		return 0, fmt.Errorf("usage: %w", err)
	}
	if int64(open) >= plan.OpenSessions {
		return 0, OpenLimit(open, int(plan.OpenSessions))
	}
	return int(plan.OpenSessions), nil
}

// OpenLimit is the refusal of a session past the open-sessions quota, which a card never lifts.
func OpenLimit(open, limit int) *LimitError {
	return &LimitError{Meter: MeterOpenSessions, Used: float64(open), Limit: float64(limit), Unit: "sessions"}
}
