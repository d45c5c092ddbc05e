package activities

// BuildPlan is what a build reads: blob keys of its inputs, never the inputs themselves.
type BuildPlan struct {
	EnvID   string
	BuildID string
	// BatchKeys are the environment's trace batch blobs, in collection order.
	BatchKeys []string
	// BatchIDs are the batches' ids, parallel to BatchKeys: a trace is read from the batch that first stored it.
	BatchIDs []string
	// UploadKey is the blob of the build route's multipart upload (tool definitions, code, config, traces); may be empty.
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
}

// SelfChecked is the result of the leave-one-out self-check.
type SelfChecked struct {
	ReportKey string
	// Agreement is the percentage of scored calls whose answer equalled the recorded one.
	Agreement float64
	Calls     int
	Headline  string
}
