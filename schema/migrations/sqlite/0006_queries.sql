-- One-shot queries (POST /v1/envs/{slug}/query): each runs as a QueryWorkflow (workflow id query/<id>) and its
-- result stays readable afterwards (queries.get). The token counts are the model's usage, for the usage meter.
CREATE TABLE queries (
    id                 TEXT PRIMARY KEY,
    workspace_id       TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    env_id             TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    key_id             TEXT NOT NULL DEFAULT '',
    build_id           TEXT NOT NULL DEFAULT '',
    status             TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
    input              TEXT NOT NULL,
    model              TEXT NOT NULL DEFAULT '',
    seed               INTEGER NOT NULL DEFAULT 0,
    session_id         TEXT NOT NULL DEFAULT '',
    result             TEXT,
    error              TEXT NOT NULL DEFAULT '',
    error_kind         TEXT NOT NULL DEFAULT '',
    model_calls        INTEGER NOT NULL DEFAULT 0,
    prompt_tokens      INTEGER NOT NULL DEFAULT 0,
    completion_tokens  INTEGER NOT NULL DEFAULT 0,
    created_at         TEXT NOT NULL,
    finished_at        TEXT
) STRICT;

CREATE INDEX queries_workspace_idx ON queries (workspace_id, created_at);
