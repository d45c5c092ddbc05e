-- Events, webhooks and uploads (issue 17). An event is recorded in the transaction of the change it reports, with
-- one delivery row per webhook endpoint of its workspace that subscribes to its type (an outbox): delivery runs
-- afterwards, as a Temporal workflow per delivery, and logs every attempt. dedup_key makes an event recorded twice
-- (an activity retried) one event. Uploads are files stored content-addressed in the blob store, named by upl_ ids.
CREATE TABLE events (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    type           TEXT NOT NULL,
    subject        TEXT NOT NULL DEFAULT '',
    data           JSONB NOT NULL,
    dedup_key      TEXT NOT NULL UNIQUE,
    created_at     TIMESTAMPTZ NOT NULL
);
CREATE INDEX events_workspace_idx ON events (workspace_id, created_at, id);
CREATE INDEX events_created_idx ON events (created_at);

CREATE TABLE webhook_endpoints (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    url            TEXT NOT NULL,
    description    TEXT NOT NULL DEFAULT '',
    event_types    TEXT NOT NULL DEFAULT '',
    secret         TEXT NOT NULL,
    disabled       BOOLEAN NOT NULL DEFAULT FALSE,
    created_at     TIMESTAMPTZ NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL
);
CREATE INDEX webhook_endpoints_workspace_idx ON webhook_endpoints (workspace_id);

CREATE TABLE webhook_deliveries (
    id               TEXT PRIMARY KEY,
    workspace_id     TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    endpoint_id      TEXT NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    event_id         TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    status           TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    dispatched       BOOLEAN NOT NULL DEFAULT FALSE,
    last_status_code INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT NOT NULL DEFAULT '',
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    finished_at      TIMESTAMPTZ,
    UNIQUE (endpoint_id, event_id)
);
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id, created_at, id);
CREATE INDEX webhook_deliveries_undispatched_idx ON webhook_deliveries (created_at) WHERE NOT dispatched;

CREATE TABLE webhook_attempts (
    id             TEXT PRIMARY KEY,
    delivery_id    TEXT NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    n              INTEGER NOT NULL,
    reason         TEXT NOT NULL,
    status_code    INTEGER NOT NULL DEFAULT 0,
    latency_ms     INTEGER NOT NULL DEFAULT 0,
    error          TEXT NOT NULL DEFAULT '',
    created_at     TIMESTAMPTZ NOT NULL
);
CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery_id, n);

CREATE TABLE uploads (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    blob_key       TEXT NOT NULL,
    sha256         TEXT NOT NULL,
    filename       TEXT NOT NULL DEFAULT '',
    content_type   TEXT NOT NULL DEFAULT '',
    bytes          BIGINT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL
);
CREATE INDEX uploads_workspace_idx ON uploads (workspace_id, id);
