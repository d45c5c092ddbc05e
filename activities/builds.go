package activities

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/uptrace/bun"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/infer"
	"github.com/doppel-dev/doppel/ingest"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/store"
	"github.com/doppel-dev/doppel/trace"
)

// BlobStore is the part of the blob store builds use.
type BlobStore interface {
	Put(ctx context.Context, key string, r io.Reader, size int64, contentType string) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	Delete(ctx context.Context, key string) error
}

// Builds holds what build activities need; the worker registers a filled one.
type Builds struct {
	DB    *bun.DB
	Blobs BlobStore
	Log   *slog.Logger
	// Observer, when set, is told of builds that start running and that end (telemetry.Metrics is one).
	Observer BuildObserver
	// Events records build.succeeded, build.failed and env.ready with the change (nil: none).
	Events *EventLog
}

// BuildObserver counts builds.
type BuildObserver interface {
	BuildStarted()
	BuildFinished(ok bool)
}

func (b *Builds) logger() *slog.Logger {
	if b.Log == nil {
		return slog.Default()
	}
	return b.Log
}

func badInput(format string, args ...any) error {
	return temporal.NewNonRetryableApplicationError(fmt.Sprintf(format, args...), ErrTypeBadInput, nil)
}

// QueueBuild creates a queued build row for envID and returns its id.
func (b *Builds) QueueBuild(ctx context.Context, envID string) (string, error) {
	env, err := store.GetEnvByID(ctx, b.DB, envID)
	if err != nil {
		return "", fmt.Errorf("queue build: %w", err)
	}
	bl := &schema.Build{EnvID: env.ID, WorkspaceID: env.WorkspaceID, Status: schema.BuildQueued, Stage: "queued"}
	if err := store.CreateBuild(ctx, b.DB, bl); err != nil {
		return "", fmt.Errorf("queue build: %w", err)
	}
	return bl.ID, nil
}

// PlanBuild marks the build running and gathers the blob keys of its inputs.
func (b *Builds) PlanBuild(ctx context.Context, envID, buildID string) (BuildPlan, error) {
	bl, err := store.GetBuildByID(ctx, b.DB, buildID)
	if err != nil {
		return BuildPlan{}, fmt.Errorf("plan build: %w", err)
	}
	batches, err := store.ListTraceBatches(ctx, b.DB, envID)
	if err != nil {
		return BuildPlan{}, fmt.Errorf("plan build: %w", err)
	}
	n, err := store.CountTraces(ctx, b.DB, envID)
	if err != nil {
		return BuildPlan{}, fmt.Errorf("plan build: %w", err)
	}
	plan := BuildPlan{EnvID: envID, BuildID: buildID, UploadKey: bl.UploadKey, NTraces: int(n)}
	for _, tb := range batches {
		plan.BatchKeys = append(plan.BatchKeys, tb.BlobKey)
		plan.BatchIDs = append(plan.BatchIDs, tb.ID)
	}
	now := schema.Now()
	bl.Status, bl.Stage, bl.Progress, bl.StartedAt = schema.BuildRunning, "planning", 0, &now
	if err := store.UpdateBuild(ctx, b.DB, bl, "status", "stage", "progress", "started_at"); err != nil {
		return BuildPlan{}, fmt.Errorf("plan build: %w", err)
	}
	if b.Observer != nil {
		b.Observer.BuildStarted()
	}
	if err := b.setEnvStatus(ctx, envID, schema.EnvBuilding); err != nil {
		return BuildPlan{}, err
	}
	return plan, nil
}

// setEnvStatus moves the environment to status unless it already has an active build (then it stays ready).
func (b *Builds) setEnvStatus(ctx context.Context, envID, status string) error {
	env, err := store.GetEnvByID(ctx, b.DB, envID)
	if err != nil {
		return fmt.Errorf("env %s: %w", envID, err)
	}
	if env.ActiveBuildID != "" {
		status = schema.EnvReady
	}
	if env.Status == status {
		return nil
	}
	env.Status = status
	if err := store.UpdateEnv(ctx, b.DB, env, "status"); err != nil {
		return fmt.Errorf("env %s: %w", envID, err)
	}
	return nil
}

func (b *Builds) stage(ctx context.Context, buildID, stage string, progress float64) {
	bl, err := store.GetBuildByID(ctx, b.DB, buildID)
	if err == nil {
		bl.Stage, bl.Progress = stage, progress
		err = store.UpdateBuild(ctx, b.DB, bl, "stage", "progress")
	}
	if err != nil {
		b.logger().Warn("record build progress", "build", buildID, "error", err)
	}
}

func (b *Builds) readBlob(ctx context.Context, key string) ([]byte, error) {
	rc, err := b.Blobs.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", key, err)
	}
	return data, nil
}

// inputs is a build's input: its traces, prepared batch by batch, and its options.
type inputs struct {
	traces *infer.Prepared
	opts   infer.Options
	// framework is the one a known system prompt names, from the first such trace by id.
	framework string
}

// loadInputs reads the plan's traces (each trace from the batch that first stored it) one batch blob at a time,
// preparing each batch while the next is read, so memory holds the prepared calls rather than every trace's
// text; then its upload.
func (b *Builds) loadInputs(ctx context.Context, plan BuildPlan) (*inputs, error) {
	in := &inputs{traces: &infer.Prepared{}}
	rows, err := store.ListTraces(ctx, b.DB, plan.EnvID)
	if err != nil {
		return nil, fmt.Errorf("list traces: %w", err)
	}
	owner := make(map[string]string, len(rows))
	for _, r := range rows {
		owner[r.TraceID] = r.BatchID
	}
	detectedBy := ""
	// Each batch is read and decoded while the one before it is prepared (infer.Prepared.AddAll).
	err = in.traces.AddAll(ctx, len(plan.BatchKeys), func(ctx context.Context, i int) ([]trace.Trace, error) {
		key := plan.BatchKeys[i]
		data, err := b.readBlob(ctx, key)
		if err != nil {
			return nil, err
		}
		batch, err := ingest.DecodeBlobCalls(data)
		if err != nil {
			return nil, badInput("trace batch %s: %v", key, err)
		}
		mine := batch.Traces[:0]
		for _, t := range batch.Traces {
			if owner[t.ID] == plan.BatchIDs[i] {
				mine = append(mine, t)
			}
		}
		for j := range mine {
			if detectedBy != "" && mine[j].ID >= detectedBy {
				continue
			}
			if det := ingest.Detect(&trace.Batch{Traces: mine[j : j+1]}, ingest.Hints{}); det.Framework != "" {
				in.framework, detectedBy = det.Framework, mine[j].ID
			}
		}
		return mine, nil
	})
	if err != nil {
		return nil, err
	}
	if plan.UploadKey != "" {
		data, err := b.readBlob(ctx, plan.UploadKey)
		if err != nil {
			return nil, err
		}
		var up infer.Upload
		if err := json.Unmarshal(data, &up); err != nil {
			return nil, badInput("build upload %s: %v", plan.UploadKey, err)
		}
		if in.opts, err = up.Options(); err != nil {
			return nil, badInput("build upload: %v", err)
		}
	}
	if in.traces.Len() == 0 {
		return nil, badInput("the environment has no traces to build from")
	}
	return in, nil
}

func (b *Builds) putJSON(ctx context.Context, prefix string, v any) (string, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return b.put(ctx, prefix, data, "application/json")
}

func (b *Builds) put(ctx context.Context, prefix string, data []byte, contentType string) (string, error) {
	key, err := blob.PutContent(ctx, b.Blobs, prefix, data, contentType)
	if err != nil {
		return "", fmt.Errorf("store %s: %w", key, err)
	}
	return key, nil
}

// InferBundle reads the traces and uploads, infers the bundle and stores it content-addressed. It heartbeats
// throughout and, once the bundle and report are stored, heartbeats its result: an attempt retried after its
// worker died past that point answers from it instead of inferring again.
func (b *Builds) InferBundle(ctx context.Context, plan BuildPlan) (Inferred, error) {
	var done Inferred
	if resumeFrom(ctx, &done) && done.BundleKey != "" && done.ReportKey != "" {
		b.logger().Info("build resumes: bundle already inferred", "build", plan.BuildID, "bundle", done.BundleKey)
		return done, nil
	}
	beat := startBeat(ctx, beatEvery, nil)
	defer beat.stop()
	b.stage(ctx, plan.BuildID, "inferring", 0.1)
	in, err := b.loadInputs(ctx, plan)
	if err != nil {
		return Inferred{}, err
	}
	bundle, report, err := infer.BuildFrom(in.traces, in.opts)
	if err != nil {
		return Inferred{}, badInput("inference: %v", err)
	}
	framework := in.framework
	in = nil // the prepared traces can go before the bundle is written
	// Spooled into the store (hashed on its way to a temporary file, which is then stored): the canonical
	// bytes of a large bundle are made once and never all in memory beside the bundle.
	bundleKey, sum, err := blob.PutContentSpooled(ctx, b.Blobs, "bundles/", "", bundle.WriteCanonical, "application/octet-stream")
	if err != nil {
		return Inferred{}, fmt.Errorf("store bundle %s: %w", bundleKey, err)
	}
	reportKey, err := b.putJSON(ctx, "reports/build/", report)
	if err != nil {
		return Inferred{}, err
	}
	warnings := 0
	for _, w := range report.Warnings {
		warnings += w.Count
	}
	done = Inferred{
		BundleKey: bundleKey, BundleHash: "sha256:" + sum, ReportKey: reportKey,
		NTools: len(bundle.Tools), SchemaSource: report.SchemaSource, Warnings: warnings,
		CoveredPct: report.CoveredPct, SimulatedPct: report.SimulatedPct, Headline: report.Headline,
	}
	if ag := bundle.Agent; ag != nil {
		done.HasAgent, done.Framework, done.Language = ag.HasAgent(), ag.Framework, ag.Language
	}
	done.DetectedFramework = framework // known framework system prompts
	beat.set(done)
	return done, nil
}

// beatEvery is how often long build activities heartbeat; the workflow's heartbeat timeout is a few of these, so
// a build whose worker died is retried within seconds (issue 13, defect 9).
const beatEvery = 2 * time.Second

// checkpointEvery is how often SelfCheck stores the folds it has checked since its last checkpoint.
const checkpointEvery = 2 * time.Second

// SelfCheckpoint is SelfCheck's heartbeat progress: the blob keys of the parts holding the folds checked so far.
type SelfCheckpoint struct {
	Parts []string `json:"parts"`
}

// SelfCheck replays every trace against a world built without it or its task's other trials (leave-one-task-out,
// leave-one-out when ids name no task, or k-fold for large sets) and
// stores the report. Every few seconds it stores the folds checked since the last checkpoint as a blob and
// heartbeats the list of such parts; a retry (its worker died) reads them back and checks only the rest.
func (b *Builds) SelfCheck(ctx context.Context, plan BuildPlan, inf Inferred) (SelfChecked, error) {
	var cp SelfCheckpoint
	resumeFrom(ctx, &cp)
	beat := startBeat(ctx, beatEvery, cp)
	defer beat.stop()
	b.stage(ctx, plan.BuildID, "self-checking", 0.6)
	in, err := b.loadInputs(ctx, plan)
	if err != nil {
		return SelfChecked{}, err
	}
	var resume infer.Resume
	for _, key := range cp.Parts {
		var part []infer.FoldResult
		data, err := b.readBlob(ctx, key)
		if err == nil {
			err = json.Unmarshal(data, &part)
		}
		if err != nil {
			return SelfChecked{}, fmt.Errorf("self-check checkpoint: %w", err)
		}
		resume.Done = append(resume.Done, part...)
	}
	if len(cp.Parts) > 0 {
		b.logger().Info("build resumes self-check", "build", plan.BuildID, "folds_done", len(resume.Done))
	}
	var pending []infer.FoldResult
	var putErr error
	last := time.Now()
	flush := func() {
		if len(pending) == 0 || putErr != nil {
			return
		}
		key, err := b.putJSON(ctx, "checkpoints/selfcheck/"+plan.BuildID+"/", pending)
		if err != nil {
			putErr = err // the check goes on; only its resumability is lost
			b.logger().Warn("store self-check checkpoint", "build", plan.BuildID, "error", err)
			return
		}
		cp.Parts = append(cp.Parts, key)
		beat.set(SelfCheckpoint{Parts: append([]string(nil), cp.Parts...)})
		pending, last = nil, time.Now()
	}
	resume.OnFold = func(fr infer.FoldResult) {
		pending = append(pending, fr)
		if time.Since(last) >= checkpointEvery {
			flush()
		}
	}
	rep, err := infer.SelfCheckFrom(in.traces, in.opts, resume)
	if err != nil {
		return SelfChecked{}, fmt.Errorf("self-check: %w", err)
	}
	key, err := b.putJSON(ctx, "reports/selfcheck/", rep)
	if err != nil {
		return SelfChecked{}, err
	}
	for _, part := range cp.Parts {
		if err := b.Blobs.Delete(ctx, part); err != nil {
			b.logger().Warn("remove self-check checkpoint", "build", plan.BuildID, "key", part, "error", err)
		}
	}
	return SelfChecked{
		ReportKey: key, Agreement: rep.AgreementPct, Calls: rep.Calls,
		Headline: fmt.Sprintf("%s; self-check (%s) agreement %.1f%% of %d calls exact, %.1f%% shape, %.1f%% error%s",
			inf.Headline, rep.Mode, rep.AgreementPct, rep.Calls, rep.ShapeAgreePct, rep.ErrorAgreePct, rep.Reproduction.Headline()),
	}, nil
}

// ActivateBuild marks the build succeeded and makes it the environment's active build, in one transaction.
func (b *Builds) ActivateBuild(ctx context.Context, plan BuildPlan, inf Inferred, chk SelfChecked) error {
	report, err := json.Marshal(NewBuildFigures(inf, chk))
	if err != nil {
		return err
	}
	var kick []string
	err = b.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		bl, err := store.GetBuildByID(ctx, tx, plan.BuildID)
		if err != nil {
			return err
		}
		now := schema.Now()
		bl.Status, bl.Stage, bl.Progress, bl.FinishedAt = schema.BuildSucceeded, "succeeded", 1, &now
		bl.BundleKey, bl.BundleHash, bl.ReportKey, bl.Report = inf.BundleKey, inf.BundleHash, chk.ReportKey, report
		if err := store.UpdateBuild(ctx, tx, bl, "status", "stage", "progress", "finished_at", "bundle_key",
			"bundle_hash", "report_key", "report"); err != nil {
			return err
		}
		env, err := store.GetEnvByID(ctx, tx, plan.EnvID)
		if err != nil {
			return err
		}
		wasReady := env.Status == schema.EnvReady
		env.Status, env.ActiveBuildID = schema.EnvReady, bl.ID
		env.NTools, env.SchemaSource = int64(inf.NTools), inf.SchemaSource
		env.CoveredPct, env.SimulatedPct, env.Headline = inf.CoveredPct, inf.SimulatedPct, chk.Headline
		env.HasAgent = inf.HasAgent
		env.Framework = cmp.Or(inf.Framework, env.Framework, inf.DetectedFramework)
		env.Language = cmp.Or(inf.Language, env.Language, inf.DetectedLanguage)
		if err := store.UpdateEnv(ctx, tx, env, "status", "active_build_id", "n_tools", "schema_source",
			"covered_pct", "simulated_pct", "headline", "has_agent", "framework", "language"); err != nil {
			return err
		}
		data := events.BuildData{EnvID: env.ID, Env: env.Slug, BuildID: bl.ID, BundleHash: bl.BundleHash,
			CoveredPct: env.CoveredPct, SimulatedPct: env.SimulatedPct, Headline: env.Headline}
		if kick, err = b.record(ctx, tx, env.WorkspaceID, events.BuildSucceeded, bl.ID, data); err != nil {
			return err
		}
		if !wasReady {
			ids, err := b.record(ctx, tx, env.WorkspaceID, events.EnvReady, bl.ID, data)
			if err != nil {
				return err
			}
			kick = append(kick, ids...)
		}
		return nil
	})
	if err == nil {
		b.Events.Kick(kick)
		if b.Observer != nil {
			b.Observer.BuildFinished(true)
		}
	}
	return err
}

// record records a build event in tx, once per build and type (a retried activity records nothing more).
func (b *Builds) record(ctx context.Context, tx bun.IDB, ws, typ, buildID string, data events.BuildData) ([]string, error) {
	if b.Events == nil {
		return nil, nil
	}
	ev, err := store.NewEvent(ws, typ, buildID, typ+":"+buildID, data)
	if err != nil {
		return nil, err
	}
	return b.Events.Record(ctx, tx, ev)
}

// FailBuild marks the build failed with reason; the environment keeps its previous active build.
func (b *Builds) FailBuild(ctx context.Context, envID, buildID, reason string) error {
	bl, err := store.GetBuildByID(ctx, b.DB, buildID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return temporal.NewNonRetryableApplicationError("build "+buildID+" not found", ErrTypeBadInput, err)
		}
		return err
	}
	now := schema.Now()
	bl.Status, bl.Stage, bl.Error, bl.FinishedAt = schema.BuildFailed, "failed", reason, &now
	var kick []string
	err = b.DB.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := store.UpdateBuild(ctx, tx, bl, "status", "stage", "error", "finished_at"); err != nil {
			return err
		}
		env, err := store.GetEnvByID(ctx, tx, envID)
		if err != nil {
			return err
		}
		kick, err = b.record(ctx, tx, env.WorkspaceID, events.BuildFailed, bl.ID,
			events.BuildData{EnvID: env.ID, Env: env.Slug, BuildID: bl.ID, Error: reason})
		return err
	})
	if err != nil {
		return err
	}
	b.Events.Kick(kick)
	if b.Observer != nil {
		b.Observer.BuildFinished(false)
	}
	return b.setEnvStatus(ctx, envID, schema.EnvFailed)
}
