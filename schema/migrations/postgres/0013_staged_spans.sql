-- OpenTelemetry spans staged until their conversation settles (issue 37). A span is staged once: its ids are the
-- key, so an exporter's retry changes nothing. pending marks the spans no version of their conversation's trace
-- was made from yet; the settle activity assembles a conversation once none of its spans arrived for the settle
-- time, and clears pending on the spans it used. A span arriving later makes the conversation pending again, and
-- its next version is made from all its spans. span is the staged span: OTLP protobuf, its attributes cut to the
-- ones assembly reads, S2-compressed (otlp.Staged); bytes is its length.
CREATE TABLE staged_spans (
    env_id          TEXT NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    trace_id        TEXT NOT NULL,
    span_id         TEXT NOT NULL,
    parent_id       TEXT NOT NULL DEFAULT '',
    conversation_id TEXT NOT NULL DEFAULT '',
    received_at     TIMESTAMPTZ NOT NULL,
    pending         BOOLEAN NOT NULL,
    bytes           BIGINT NOT NULL,
    span            BYTEA NOT NULL,
    PRIMARY KEY (env_id, trace_id, span_id)
);
CREATE INDEX staged_spans_pending_idx ON staged_spans (env_id, received_at) WHERE pending;
CREATE INDEX staged_spans_conversation_idx ON staged_spans (env_id, conversation_id) WHERE conversation_id <> '';
-- span is compressed already: TOAST stores it out of line without compressing it again.
ALTER TABLE staged_spans ALTER COLUMN span SET STORAGE EXTERNAL;
