-- OpenTelemetry spans staged until their conversation settles (issue 37; see the PostgreSQL migration).
CREATE TABLE staged_spans (
    env_id          TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    trace_id        TEXT NOT NULL,
    span_id         TEXT NOT NULL,
    parent_id       TEXT NOT NULL DEFAULT '',
    conversation_id TEXT NOT NULL DEFAULT '',
    received_at     TEXT NOT NULL,
    pending         INTEGER NOT NULL,
    bytes           INTEGER NOT NULL,
    span            BLOB NOT NULL,
    PRIMARY KEY (env_id, trace_id, span_id)
) STRICT;
CREATE INDEX staged_spans_pending_idx ON staged_spans (env_id, received_at) WHERE pending;
CREATE INDEX staged_spans_conversation_idx ON staged_spans (env_id, conversation_id) WHERE conversation_id <> '';
