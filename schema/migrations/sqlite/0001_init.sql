-- doppel metadata, SQLite (STRICT tables; times are RFC 3339 UTC text, fixed width). Keep in step with ../postgres/0001_init.sql.

CREATE TABLE workspaces (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    access      TEXT NOT NULL DEFAULT 'granted' CHECK (access IN ('granted', 'pending', 'denied')),
    created_at  TEXT NOT NULL
) STRICT;

CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    kind          TEXT NOT NULL CHECK (kind IN ('workspace', 'mcp')),
    hash          TEXT NOT NULL UNIQUE,
    prefix        TEXT NOT NULL,
    name          TEXT NOT NULL DEFAULT '',
    created_at    TEXT NOT NULL,
    revoked_at    TEXT,
    last_used_at  TEXT
) STRICT;
CREATE INDEX api_keys_workspace_idx ON api_keys (workspace_id, created_at);

CREATE TABLE environments (
    id               TEXT PRIMARY KEY,
    workspace_id     TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    slug             TEXT NOT NULL,
    name             TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('collecting', 'building', 'ready', 'failed')),
    framework        TEXT NOT NULL DEFAULT '',
    language         TEXT NOT NULL DEFAULT '',
    n_traces         INTEGER NOT NULL DEFAULT 0,
    n_tools          INTEGER NOT NULL DEFAULT 0,
    schema_source    TEXT NOT NULL DEFAULT 'traces',
    covered_pct      REAL NOT NULL DEFAULT 0,
    simulated_pct    REAL NOT NULL DEFAULT 0,
    has_agent        INTEGER NOT NULL DEFAULT 0,
    headline         TEXT NOT NULL DEFAULT '',
    active_build_id  TEXT,
    collected_bytes  INTEGER NOT NULL DEFAULT 0,
    twin_state       TEXT NOT NULL DEFAULT 'stopped' CHECK (twin_state IN ('stopped', 'booting', 'ready')),
    twin_endpoint    TEXT NOT NULL DEFAULT '',
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL,
    UNIQUE (workspace_id, slug)
) STRICT;
CREATE INDEX environments_workspace_created_idx ON environments (workspace_id, created_at);

CREATE TABLE builds (
    id            TEXT PRIMARY KEY,
    env_id        TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    status        TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    progress      REAL NOT NULL DEFAULT 0,
    stage         TEXT NOT NULL DEFAULT '',
    bundle_key    TEXT NOT NULL DEFAULT '',
    bundle_hash   TEXT NOT NULL DEFAULT '',
    report        TEXT,
    report_key    TEXT NOT NULL DEFAULT '',
    error         TEXT NOT NULL DEFAULT '',
    workflow_id   TEXT NOT NULL DEFAULT '',
    created_at    TEXT NOT NULL,
    started_at    TEXT,
    finished_at   TEXT,
    updated_at    TEXT NOT NULL
) STRICT;
CREATE INDEX builds_env_created_idx ON builds (env_id, created_at);

CREATE TABLE trace_batches (
    id            TEXT PRIMARY KEY,
    env_id        TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    blob_key      TEXT NOT NULL,
    n_traces      INTEGER NOT NULL DEFAULT 0,
    n_duplicates  INTEGER NOT NULL DEFAULT 0,
    bytes         INTEGER NOT NULL DEFAULT 0,
    tools_seen    TEXT,
    created_at    TEXT NOT NULL
) STRICT;
CREATE INDEX trace_batches_env_created_idx ON trace_batches (env_id, created_at);

CREATE TABLE traces (
    env_id      TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    trace_id    TEXT NOT NULL,
    batch_id    TEXT NOT NULL REFERENCES trace_batches (id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (env_id, trace_id)
) STRICT;
CREATE INDEX traces_batch_idx ON traces (batch_id);

CREATE TABLE sessions (
    id                 TEXT PRIMARY KEY,
    env_id             TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    workspace_id       TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    build_id           TEXT NOT NULL DEFAULT '',
    token_hash         TEXT NOT NULL UNIQUE,
    opened_by_key_id   TEXT NOT NULL DEFAULT '',
    seed               INTEGER NOT NULL DEFAULT 0,
    seed_instructions  TEXT NOT NULL DEFAULT '',
    seeded             INTEGER NOT NULL DEFAULT 0,
    seed_note          TEXT NOT NULL DEFAULT '',
    scenario           TEXT NOT NULL DEFAULT '',
    clock              TEXT NOT NULL DEFAULT '',
    record_outputs     INTEGER NOT NULL DEFAULT 0,
    world_hash         TEXT NOT NULL DEFAULT '',
    state_hash         TEXT NOT NULL DEFAULT '',
    receipts           TEXT,
    status             TEXT NOT NULL CHECK (status IN ('open', 'closed', 'expired', 'broken')),
    n_calls            INTEGER NOT NULL DEFAULT 0,
    n_errors           INTEGER NOT NULL DEFAULT 0,
    n_a_executed       INTEGER NOT NULL DEFAULT 0,
    n_b_twin           INTEGER NOT NULL DEFAULT 0,
    n_b_replayed       INTEGER NOT NULL DEFAULT 0,
    n_b_inferred       INTEGER NOT NULL DEFAULT 0,
    n_b_simulated      INTEGER NOT NULL DEFAULT 0,
    n_downgraded       INTEGER NOT NULL DEFAULT 0,
    created_at         TEXT NOT NULL,
    last_used_at       TEXT NOT NULL,
    expires_at         TEXT NOT NULL,
    closed_at          TEXT
) STRICT;
CREATE INDEX sessions_env_created_idx ON sessions (env_id, created_at);
CREATE INDEX sessions_status_expires_idx ON sessions (status, expires_at);

CREATE TABLE calls (
    id          TEXT PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    tool        TEXT NOT NULL,
    arguments   TEXT NOT NULL,
    content     TEXT NOT NULL DEFAULT '',
    error       INTEGER NOT NULL DEFAULT 0,
    fidelity    TEXT NOT NULL,
    rung        TEXT NOT NULL DEFAULT '',
    downgraded  INTEGER NOT NULL DEFAULT 0,
    ms          INTEGER NOT NULL DEFAULT 0,
    requestor   TEXT NOT NULL DEFAULT '',
    state_hash  TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL,
    UNIQUE (session_id, seq)
) STRICT;

CREATE TABLE usage_meters (
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    period        TEXT NOT NULL,
    meter         TEXT NOT NULL,
    amount        REAL NOT NULL DEFAULT 0,
    updated_at    TEXT NOT NULL,
    PRIMARY KEY (workspace_id, period, meter)
) STRICT;
