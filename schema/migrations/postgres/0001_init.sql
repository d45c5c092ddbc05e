-- doppel metadata, PostgreSQL. Keep in step with ../sqlite/0001_init.sql.

CREATE TABLE workspaces (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    access      TEXT NOT NULL DEFAULT 'granted' CHECK (access IN ('granted', 'pending', 'denied')),
    created_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    kind          TEXT NOT NULL CHECK (kind IN ('workspace', 'mcp')),
    hash          TEXT NOT NULL UNIQUE,
    prefix        TEXT NOT NULL,
    name          TEXT NOT NULL DEFAULT '',
    created_at    TIMESTAMPTZ NOT NULL,
    revoked_at    TIMESTAMPTZ,
    last_used_at  TIMESTAMPTZ
);
CREATE INDEX api_keys_workspace_idx ON api_keys (workspace_id, created_at);

CREATE TABLE environments (
    id               TEXT PRIMARY KEY,
    workspace_id     TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    slug             TEXT NOT NULL,
    name             TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('collecting', 'building', 'ready', 'failed')),
    framework        TEXT NOT NULL DEFAULT '',
    language         TEXT NOT NULL DEFAULT '',
    n_traces         BIGINT NOT NULL DEFAULT 0,
    n_tools          BIGINT NOT NULL DEFAULT 0,
    schema_source    TEXT NOT NULL DEFAULT 'traces',
    covered_pct      DOUBLE PRECISION NOT NULL DEFAULT 0,
    simulated_pct    DOUBLE PRECISION NOT NULL DEFAULT 0,
    has_agent        BOOLEAN NOT NULL DEFAULT FALSE,
    headline         TEXT NOT NULL DEFAULT '',
    active_build_id  TEXT,
    collected_bytes  BIGINT NOT NULL DEFAULT 0,
    twin_state       TEXT NOT NULL DEFAULT 'stopped' CHECK (twin_state IN ('stopped', 'booting', 'ready')),
    twin_endpoint    TEXT NOT NULL DEFAULT '',
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    UNIQUE (workspace_id, slug)
);
CREATE INDEX environments_workspace_created_idx ON environments (workspace_id, created_at);

CREATE TABLE builds (
    id            TEXT PRIMARY KEY,
    env_id        TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    status        TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    progress      DOUBLE PRECISION NOT NULL DEFAULT 0,
    stage         TEXT NOT NULL DEFAULT '',
    bundle_key    TEXT NOT NULL DEFAULT '',
    bundle_hash   TEXT NOT NULL DEFAULT '',
    report        JSONB,
    report_key    TEXT NOT NULL DEFAULT '',
    error         TEXT NOT NULL DEFAULT '',
    workflow_id   TEXT NOT NULL DEFAULT '',
    created_at    TIMESTAMPTZ NOT NULL,
    started_at    TIMESTAMPTZ,
    finished_at   TIMESTAMPTZ,
    updated_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX builds_env_created_idx ON builds (env_id, created_at);

CREATE TABLE trace_batches (
    id            TEXT PRIMARY KEY,
    env_id        TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    blob_key      TEXT NOT NULL,
    n_traces      BIGINT NOT NULL DEFAULT 0,
    n_duplicates  BIGINT NOT NULL DEFAULT 0,
    bytes         BIGINT NOT NULL DEFAULT 0,
    tools_seen    JSONB,
    created_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX trace_batches_env_created_idx ON trace_batches (env_id, created_at);

CREATE TABLE traces (
    env_id      TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    trace_id    TEXT NOT NULL,
    batch_id    TEXT NOT NULL REFERENCES trace_batches (id) ON DELETE CASCADE,
    idx         BIGINT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (env_id, trace_id)
);
CREATE INDEX traces_batch_idx ON traces (batch_id);

CREATE TABLE sessions (
    id                 TEXT PRIMARY KEY,
    env_id             TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    workspace_id       TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    build_id           TEXT NOT NULL DEFAULT '',
    token_hash         TEXT NOT NULL UNIQUE,
    opened_by_key_id   TEXT NOT NULL DEFAULT '',
    seed               BIGINT NOT NULL DEFAULT 0,
    seed_instructions  TEXT NOT NULL DEFAULT '',
    seeded             BOOLEAN NOT NULL DEFAULT FALSE,
    seed_note          TEXT NOT NULL DEFAULT '',
    scenario           TEXT NOT NULL DEFAULT '',
    clock              TEXT NOT NULL DEFAULT '',
    record_outputs     BOOLEAN NOT NULL DEFAULT FALSE,
    world_hash         TEXT NOT NULL DEFAULT '',
    state_hash         TEXT NOT NULL DEFAULT '',
    receipts           JSONB,
    status             TEXT NOT NULL CHECK (status IN ('open', 'closed', 'expired', 'broken')),
    n_calls            BIGINT NOT NULL DEFAULT 0,
    n_errors           BIGINT NOT NULL DEFAULT 0,
    n_a_executed       BIGINT NOT NULL DEFAULT 0,
    n_b_twin           BIGINT NOT NULL DEFAULT 0,
    n_b_replayed       BIGINT NOT NULL DEFAULT 0,
    n_b_inferred       BIGINT NOT NULL DEFAULT 0,
    n_b_simulated      BIGINT NOT NULL DEFAULT 0,
    n_downgraded       BIGINT NOT NULL DEFAULT 0,
    created_at         TIMESTAMPTZ NOT NULL,
    last_used_at       TIMESTAMPTZ NOT NULL,
    expires_at         TIMESTAMPTZ NOT NULL,
    closed_at          TIMESTAMPTZ
);
CREATE INDEX sessions_env_created_idx ON sessions (env_id, created_at);
CREATE INDEX sessions_status_expires_idx ON sessions (status, expires_at);

CREATE TABLE calls (
    id          TEXT PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    tool        TEXT NOT NULL,
    arguments   JSONB NOT NULL,
    content     TEXT NOT NULL DEFAULT '',
    error       BOOLEAN NOT NULL DEFAULT FALSE,
    fidelity    TEXT NOT NULL,
    rung        TEXT NOT NULL DEFAULT '',
    downgraded  BOOLEAN NOT NULL DEFAULT FALSE,
    ms          BIGINT NOT NULL DEFAULT 0,
    requestor   TEXT NOT NULL DEFAULT '',
    state_hash  TEXT NOT NULL DEFAULT '',
    created_at  TIMESTAMPTZ NOT NULL,
    UNIQUE (session_id, seq)
);

CREATE TABLE usage_meters (
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    period        TEXT NOT NULL,
    meter         TEXT NOT NULL,
    amount        DOUBLE PRECISION NOT NULL DEFAULT 0,
    updated_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (workspace_id, period, meter)
);
