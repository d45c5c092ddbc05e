// Package schema holds doppel's metadata models and the embedded migrations that create them on SQLite and PostgreSQL.
package schema

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/uptrace/bun"
)

// Workspace access states (spec §5: 403 with access pending|denied).
const (
	AccessGranted = "granted"
	AccessPending = "pending"
	AccessDenied  = "denied"
)

// API key kinds. Session tokens live on their session row, not here.
const (
	KeyKindWorkspace = "workspace" // mk_live_…
	KeyKindMCP       = "mcp"       // mcp_at_…
)

// Environment status values.
const (
	EnvCollecting = "collecting"
	EnvBuilding   = "building"
	EnvReady      = "ready"
	EnvFailed     = "failed"
)

// Build status values.
const (
	BuildQueued    = "queued"
	BuildRunning   = "running"
	BuildSucceeded = "succeeded"
	BuildFailed    = "failed"
)

// Session status values.
const (
	SessionOpen    = "open"
	SessionClosed  = "closed"
	SessionExpired = "expired"
	SessionBroken  = "broken"
)

// Query status values.
const (
	QueryRunning   = "running"
	QuerySucceeded = "succeeded"
	QueryFailed    = "failed"
)

// Fidelity labels of a call result (spec §2.5); sessions count calls per label.
const (
	FidelityAExecuted  = "A_executed"
	FidelityBTwin      = "B_twin"
	FidelityBReplayed  = "B_replayed"
	FidelityBInferred  = "B_inferred"
	FidelityBSimulated = "B_simulated"
)

// Workspace is a tenant. Every other row belongs to one.
type Workspace struct {
	bun.BaseModel `bun:"table:workspaces"`

	ID        string    `bun:"id,pk"`
	Name      string    `bun:"name,notnull"`
	Access    string    `bun:"access,notnull"`
	CreatedAt time.Time `bun:"created_at,notnull"`
	// Plan names a plan of the plans configuration ("": usage.default_plan).
	Plan string `bun:"plan,notnull"`
	// Entitlements are the gated features the workspace may use, comma-separated (EntitlementMCP, …).
	Entitlements string `bun:"entitlements,notnull"`
	// CardOnFile says a payment card is on file: a plan whose limits a card lifts then meters past them.
	CardOnFile bool `bun:"card_on_file,notnull"`
}

// HasEntitlement reports whether the workspace holds entitlement e (EntitlementMCP, EntitlementQuery).
func (w *Workspace) HasEntitlement(e string) bool {
	for _, have := range strings.Split(w.Entitlements, ",") {
		if have == e {
			return true
		}
	}
	return false
}

// Entitlements a workspace may hold (an admin sets them).
const (
	EntitlementMCP   = "mcp"   // the MCP server at /mcp
	EntitlementQuery = "query" // one-shot queries (POST /v1/envs/{slug}/query)
)

// DefaultEntitlements are a new workspace's entitlements when none are given.
const DefaultEntitlements = EntitlementMCP + "," + EntitlementQuery

// APIKey is a workspace key or an MCP access token, stored only as a hash.
type APIKey struct {
	bun.BaseModel `bun:"table:api_keys"`

	ID          string     `bun:"id,pk"`
	WorkspaceID string     `bun:"workspace_id,notnull"`
	Kind        string     `bun:"kind,notnull"`
	Hash        string     `bun:"hash,notnull"`   // hex SHA-256 of the plaintext
	Prefix      string     `bun:"prefix,notnull"` // display form, e.g. "mk_live_abcd…"
	Name        string     `bun:"name,notnull"`
	CreatedAt   time.Time  `bun:"created_at,notnull"`
	RevokedAt   *time.Time `bun:"revoked_at"`
	LastUsedAt  *time.Time `bun:"last_used_at"`
	// ExpiresAt ends an OAuth-issued MCP token (nil: the key lives until revoked).
	ExpiresAt *time.Time `bun:"expires_at"`
	// OAuthClientID and OAuthCodeID name the client an OAuth-issued token went to and the code it was issued
	// from ("" for keys minted directly).
	OAuthClientID string `bun:"oauth_client_id,notnull"`
	OAuthCodeID   string `bun:"oauth_code_id,notnull"`
	// ParentKeyID is the credential a derived key was derived from: the key that minted an mcp_at_ token, the key
	// whose consent an OAuth token was issued on ("" for a workspace key, which derives from nothing). RootKeyID is
	// the workspace key at the root of its chain ("" when the key is a root). A derived key ends with either.
	ParentKeyID string `bun:"parent_key_id,notnull"`
	RootKeyID   string `bun:"root_key_id,notnull"`
	// Resource is the MCP address (without its query) an OAuth-issued token is bound to (RFC 8707); "" for a token
	// usable on every MCP address (minted with keys.create, or issued without a resource).
	Resource string `bun:"resource,notnull"`
}

// Root is the workspace key at the root of k's chain: RootKeyID, or k itself when it is a root.
func (k *APIKey) Root() string {
	if k.RootKeyID != "" {
		return k.RootKeyID
	}
	return k.ID
}

// OAuthClient is an OAuth client registered dynamically (RFC 7591) to reach the MCP server. Clients are public:
// they prove possession with PKCE, not with a secret.
type OAuthClient struct {
	bun.BaseModel `bun:"table:oauth_clients"`

	ID           string    `bun:"id,pk"`
	Name         string    `bun:"name,notnull"`
	RedirectURIs []string  `bun:"redirect_uris,notnull"`
	CreatedAt    time.Time `bun:"created_at,notnull"`
}

// OAuthCode is an authorization code: single use, short-lived, bound to its client, redirect URI and PKCE S256
// challenge, and to the workspace whose key consented.
type OAuthCode struct {
	bun.BaseModel `bun:"table:oauth_codes"`

	ID          string     `bun:"id,pk"`
	Hash        string     `bun:"hash,notnull"` // hex SHA-256 of the code
	ClientID    string     `bun:"client_id,notnull"`
	WorkspaceID string     `bun:"workspace_id,notnull"`
	KeyID       string     `bun:"key_id,notnull"` // the workspace key that consented
	RedirectURI string     `bun:"redirect_uri,notnull"`
	Challenge   string     `bun:"challenge,notnull"` // PKCE S256 code_challenge
	Resource    string     `bun:"resource,notnull"`
	Scope       string     `bun:"scope,notnull"`
	CreatedAt   time.Time  `bun:"created_at,notnull"`
	ExpiresAt   time.Time  `bun:"expires_at,notnull"`
	UsedAt      *time.Time `bun:"used_at"`
}

// OAuthRefreshToken is an OAuth refresh token (mcp_rt_…), stored hashed. It is rotated on use: refreshing marks it
// rotated and issues a new one of the same family (the authorization code it descends from); a rotated token
// presented again revokes the family, its access tokens included. It derives from the consenting key (ParentKeyID)
// and its chain's root (RootKeyID) and ends with either.
type OAuthRefreshToken struct {
	bun.BaseModel `bun:"table:oauth_refresh_tokens"`

	ID          string     `bun:"id,pk"`
	Hash        string     `bun:"hash,notnull"`
	WorkspaceID string     `bun:"workspace_id,notnull"`
	ClientID    string     `bun:"client_id,notnull"`
	Family      string     `bun:"family,notnull"`
	ParentKeyID string     `bun:"parent_key_id,notnull"`
	RootKeyID   string     `bun:"root_key_id,notnull"`
	Resource    string     `bun:"resource,notnull"`
	Scope       string     `bun:"scope,notnull"`
	CreatedAt   time.Time  `bun:"created_at,notnull"`
	ExpiresAt   time.Time  `bun:"expires_at,notnull"`
	RotatedAt   *time.Time `bun:"rotated_at"`
	RevokedAt   *time.Time `bun:"revoked_at"`
}

// Environment is one project's mirror: its collected traces, builds and twin.
type Environment struct {
	bun.BaseModel `bun:"table:environments"`

	ID             string    `bun:"id,pk"`
	WorkspaceID    string    `bun:"workspace_id,notnull"`
	Slug           string    `bun:"slug,notnull"`
	Name           string    `bun:"name,notnull"` // the project name as collected
	Status         string    `bun:"status,notnull"`
	Framework      string    `bun:"framework,notnull"`
	Language       string    `bun:"language,notnull"`
	NTraces        int64     `bun:"n_traces,notnull"`
	NTools         int64     `bun:"n_tools,notnull"`
	SchemaSource   string    `bun:"schema_source,notnull"`
	CoveredPct     float64   `bun:"covered_pct,notnull"`
	SimulatedPct   float64   `bun:"simulated_pct,notnull"`
	HasAgent       bool      `bun:"has_agent,notnull"`
	Headline       string    `bun:"headline,notnull"`
	ActiveBuildID  string    `bun:"active_build_id,nullzero"`
	InputsKey      string    `bun:"inputs_key,notnull"` // blob of the current build inputs (an infer.Upload); "" for none
	CollectedBytes int64     `bun:"collected_bytes,notnull"`
	TwinState      string    `bun:"twin_state,notnull"`
	TwinEndpoint   string    `bun:"twin_endpoint,notnull"`
	CreatedAt      time.Time `bun:"created_at,notnull"`
	UpdatedAt      time.Time `bun:"updated_at,notnull"`
}

// Build is one run of the build workflow over an environment's traces.
type Build struct {
	bun.BaseModel `bun:"table:builds"`

	ID          string          `bun:"id,pk"`
	EnvID       string          `bun:"env_id,notnull"`
	WorkspaceID string          `bun:"workspace_id,notnull"`
	Status      string          `bun:"status,notnull"`
	Progress    float64         `bun:"progress,notnull"` // 0..1
	Stage       string          `bun:"stage,notnull"`
	BundleKey   string          `bun:"bundle_key,notnull"`
	BundleHash  string          `bun:"bundle_hash,notnull"`
	Report      json.RawMessage `bun:"report"`             // small report inline, or
	ReportKey   string          `bun:"report_key,notnull"` // a blob key for a large one
	Error       string          `bun:"error,notnull"`
	WorkflowID  string          `bun:"workflow_id,notnull"`
	UploadKey   string          `bun:"upload_key,notnull"` // blob of the inputs the build used (an infer.Upload); "" for none
	CreatedAt   time.Time       `bun:"created_at,notnull"`
	StartedAt   *time.Time      `bun:"started_at"`
	FinishedAt  *time.Time      `bun:"finished_at"`
	UpdatedAt   time.Time       `bun:"updated_at,notnull"`
}

// TraceBatch is one accepted collect request, stored whole as a content-addressed blob.
type TraceBatch struct {
	bun.BaseModel `bun:"table:trace_batches"`

	ID          string    `bun:"id,pk"`
	EnvID       string    `bun:"env_id,notnull"`
	BlobKey     string    `bun:"blob_key,notnull"`
	NTraces     int64     `bun:"n_traces,notnull"`     // traces new to the environment, or new versions of traces it holds (span assembly)
	NDuplicates int64     `bun:"n_duplicates,notnull"` // traces already present, skipped
	Bytes       int64     `bun:"bytes,notnull"`
	ToolsSeen   []string  `bun:"tools_seen"`
	CreatedAt   time.Time `bun:"created_at,notnull"`
}

// Trace records that a trace id is present in an environment and which batch holds it.
// The primary key (env_id, trace_id) is the dedupe guarantee.
type Trace struct {
	bun.BaseModel `bun:"table:traces"`

	EnvID     string    `bun:"env_id,pk"`
	TraceID   string    `bun:"trace_id,pk"`
	BatchID   string    `bun:"batch_id,notnull"`
	Idx       int64     `bun:"idx,notnull"` // position in the batch's traces array
	CreatedAt time.Time `bun:"created_at,notnull"`
}

// Session is one isolated, seeded world opened on an environment.
type Session struct {
	bun.BaseModel `bun:"table:sessions"`

	ID               string          `bun:"id,pk"`
	EnvID            string          `bun:"env_id,notnull"`
	WorkspaceID      string          `bun:"workspace_id,notnull"`
	BuildID          string          `bun:"build_id,notnull"`
	TokenHash        string          `bun:"token_hash,notnull"`
	OpenedByKeyID    string          `bun:"opened_by_key_id,notnull"`
	Seed             int64           `bun:"seed,notnull"`
	SeedInstructions string          `bun:"seed_instructions,notnull"`
	Seeded           bool            `bun:"seeded,notnull"`
	SeedNote         string          `bun:"seed_note,notnull"`
	Scenario         string          `bun:"scenario,notnull"`
	Clock            string          `bun:"clock,notnull"`
	RecordOutputs    bool            `bun:"record_outputs,notnull"`
	WorldHash        string          `bun:"world_hash,notnull"`
	StateHash        string          `bun:"state_hash,notnull"`
	Receipts         json.RawMessage `bun:"receipts"`
	Status           string          `bun:"status,notnull"`
	NCalls           int64           `bun:"n_calls,notnull"`
	NErrors          int64           `bun:"n_errors,notnull"`
	NAExecuted       int64           `bun:"n_a_executed,notnull"`
	NBTwin           int64           `bun:"n_b_twin,notnull"`
	NBReplayed       int64           `bun:"n_b_replayed,notnull"`
	NBInferred       int64           `bun:"n_b_inferred,notnull"`
	NBSimulated      int64           `bun:"n_b_simulated,notnull"`
	NDowngraded      int64           `bun:"n_downgraded,notnull"`
	CreatedAt        time.Time       `bun:"created_at,notnull"`
	LastUsedAt       time.Time       `bun:"last_used_at,notnull"`
	ExpiresAt        time.Time       `bun:"expires_at,notnull"`
	ClosedAt         *time.Time      `bun:"closed_at"`
	// ForkedFrom is the session this one was forked from ("" for none), after its call ForkedAt: the fork's journal
	// is the parent's first ForkedAt calls, then its own from seq ForkedAt+1.
	ForkedFrom string `bun:"forked_from,notnull"`
	ForkedAt   int64  `bun:"forked_at,notnull"`
	// Faults is the session's fault plan (faults.Spec as JSON; nil: none).
	Faults json.RawMessage `bun:"faults"`
	// RootKeyID is the workspace key at the root of the credential that opened the session, when that credential
	// is derived ("" when OpenedByKeyID is a root itself): the session's token ends with either.
	RootKeyID string `bun:"root_key_id,notnull"`
	// EndsWithParent marks a fork made with its parent's session token: it ends when ForkedFrom ends.
	EndsWithParent bool `bun:"ends_with_parent,notnull"`
	// Episode is the session's task when it was opened as an episode (toolplane.Episode as JSON; nil: none): its
	// expectations, step limit, terminal tools and reward mode, kept so any replica can grade it.
	Episode json.RawMessage `bun:"episode"`
}

// Call is one tool call in a session's transcript (its journal entry).
type Call struct {
	bun.BaseModel `bun:"table:calls"`

	ID         string          `bun:"id,pk"`
	SessionID  string          `bun:"session_id,notnull"`
	Seq        int64           `bun:"seq,notnull"` // 1, 2, … per session
	Tool       string          `bun:"tool,notnull"`
	Arguments  json.RawMessage `bun:"arguments,notnull"`
	Content    string          `bun:"content,notnull"`
	Error      bool            `bun:"error,notnull"`
	Fidelity   string          `bun:"fidelity,notnull"`
	Rung       string          `bun:"rung,notnull"`
	Downgraded bool            `bun:"downgraded,notnull"`
	Ms         int64           `bun:"ms,notnull"`
	Requestor  string          `bun:"requestor,notnull"`
	StateHash  string          `bun:"state_hash,notnull"`
	CreatedAt  time.Time       `bun:"created_at,notnull"`
	// Fault labels a call an injected fault answered or delayed (JSON: kind, latency_ms; nil: none).
	Fault json.RawMessage `bun:"fault"`
}

// UsageMeter is a workspace's running total of one meter in one period (e.g. "2026-11").
type UsageMeter struct {
	bun.BaseModel `bun:"table:usage_meters"`

	WorkspaceID string    `bun:"workspace_id,pk"`
	Period      string    `bun:"period,pk"`
	Meter       string    `bun:"meter,pk"`
	Amount      float64   `bun:"amount,notnull"`
	UpdatedAt   time.Time `bun:"updated_at,notnull"`
}

// Models lists every model, for callers that register or inspect them.
func Models() []any {
	return []any{
		(*Workspace)(nil), (*APIKey)(nil), (*Environment)(nil), (*Build)(nil),
		(*TraceBatch)(nil), (*Trace)(nil), (*Session)(nil), (*Call)(nil), (*UsageMeter)(nil),
		(*OAuthClient)(nil), (*OAuthCode)(nil), (*OAuthRefreshToken)(nil),
		(*Event)(nil), (*WebhookEndpoint)(nil), (*WebhookDelivery)(nil), (*WebhookAttempt)(nil), (*Upload)(nil),
		(*WebSecret)(nil), (*WebSignout)(nil),
	}
}

// Query is one one-shot query: the agent run against a fresh seeded world by a QueryWorkflow (workflow id
// query/<id>). Result holds the query result (spec §2.2) once it finished; the token counts are the model's.
type Query struct {
	bun.BaseModel `bun:"table:queries"`

	ID               string          `bun:"id,pk"`
	WorkspaceID      string          `bun:"workspace_id,notnull"`
	EnvID            string          `bun:"env_id,notnull"`
	KeyID            string          `bun:"key_id,notnull"`
	BuildID          string          `bun:"build_id,notnull"`
	Status           string          `bun:"status,notnull"`
	Input            string          `bun:"input,notnull"`
	Model            string          `bun:"model,notnull"` // "replay" or the model id
	Seed             int64           `bun:"seed,notnull"`
	SessionID        string          `bun:"session_id,notnull"`
	Result           json.RawMessage `bun:"result"`
	Error            string          `bun:"error,notnull"`
	ErrorKind        string          `bun:"error_kind,notnull"`
	ModelCalls       int64           `bun:"model_calls,notnull"`
	PromptTokens     int64           `bun:"prompt_tokens,notnull"`
	CompletionTokens int64           `bun:"completion_tokens,notnull"`
	CreatedAt        time.Time       `bun:"created_at,notnull"`
	FinishedAt       *time.Time      `bun:"finished_at"`
}
