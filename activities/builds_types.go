package activities

import "github.com/doppel-dev/doppel/schema"

// BuildPlan is what a build reads: blob keys of its inputs, never the inputs themselves.
type BuildPlan struct {
	EnvID   string
	BuildID string
	// BatchKeys are the environment's trace batch blobs, in collection order.
	BatchKeys []string
	// BatchIDs are the batches' ids, parallel to BatchKeys: a trace is read from the batch that first stored it.
	BatchIDs []string
	// UploadKey is the blob of the build's inputs (an infer.Upload: tool definitions, code, config), the
	// environment's current inputs when the build was queued; may be empty.
	UploadKey string
	// NTraces counts the traces behind the build.
	NTraces int
}

// Inferred is the result of inference: the bundle's key and hash and the summary the environment shows.
type Inferred struct {
	BundleKey    string
	BundleHash   string
	ReportKey    string
	NTools       int
	SchemaSource string
	Warnings     int
	CoveredPct   float64
	SimulatedPct float64
	Headline     string
	// HasAgent, Framework and Language are what the traces and the build config show of the agent (see
	// twin.Agent). Framework and Language are the build config's; Detected* are what the traces' system prompts
	// tell (ingest.Detect). The environment shows the config's, else what collect saw, else the detected.
	HasAgent                            bool
	Framework, Language                 string
	DetectedFramework, DetectedLanguage string
}

// SelfChecked is the result of the leave-one-out self-check.
type SelfChecked struct {
	ReportKey string
	// Agreement is the percentage of scored calls whose answer equalled the recorded one.
	Agreement float64
	Calls     int
	Headline  string
}

// NewBuildFigures summarises a succeeded build.
func NewBuildFigures(inf Inferred, chk SelfChecked) schema.BuildFigures {
	return schema.BuildFigures{
		Inferred: schema.InferredFigures{
			BundleKey: inf.BundleKey, BundleHash: inf.BundleHash, ReportKey: inf.ReportKey, NTools: inf.NTools,
			SchemaSource: inf.SchemaSource, Warnings: inf.Warnings, CoveredPct: inf.CoveredPct,
			SimulatedPct: inf.SimulatedPct, Headline: inf.Headline,
		},
		SelfCheck: schema.SelfCheckFigures{ReportKey: chk.ReportKey, AgreementPct: chk.Agreement, Calls: chk.Calls, Headline: chk.Headline},
	}
}
